"""Compiled transformer layers are whole graphs, and draw the same dropout masks as eager ones (issue 25).

The RNG tracker's swap (Megatron sec. 3: attention dropout from a per-tp-rank generator) is a pair of custom ops,
so dynamo keeps a compiled layer in one graph. With inductor's ``fallback_random`` (random ops drawn as eager
draws them) a compiled layer, and a trainer with compiled layers under activation checkpointing, must match eager:
that is what shows the swap stays ordered around attention inside the graph.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo

from repro.dist.groups import init_parallel
from repro.models import GPTConfig
from repro.models.transformer import TransformerLayer
from repro.tensor_parallel import RNGTracker
from repro.tensor_parallel.random import OPS_IN_GRAPH

#: in the group of the files that compile the smoke point's toy GPT (tests/gpu_path/test_gpu_path_experiment.py):
#: most of this file's C++ kernels are theirs or tests/training/test_step_proxies.py's, built once in one worker
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")

def _check_breaks(breaks: int, graphs: int, reasons: list[str]) -> None:
    """One graph where the RNG swap ops trace (torch >= 2.5); elsewhere the only breaks are the swap's."""
    if OPS_IN_GRAPH or breaks == 0:
        assert breaks == 0 and graphs == 1, reasons
    else:
        assert all("_rng_" in reason for reason in reasons), reasons

HIDDEN, HEADS, SEQ = 32, 4, 8


def _config(attention_dropout: float = 0.3) -> GPTConfig:
    return GPTConfig(vocab_size=96, hidden_size=HIDDEN, num_layers=2, num_attention_heads=HEADS,
                     max_position_embeddings=SEQ, hidden_dropout=0.1, attention_dropout=attention_dropout)


def _layer(*, causal: bool = True, pre_norm: bool = True, seed: int = 0) -> tuple[TransformerLayer, RNGTracker]:
    groups = init_parallel(tp=1, pp=1, dp=1)
    tracker = RNGTracker(seed=7, tp_rank=0)
    torch.manual_seed(seed)
    layer = TransformerLayer(_config(), group=groups.tp, causal=causal, pre_norm=pre_norm, rng_tracker=tracker)
    return layer, tracker


@pytest.mark.parametrize("causal,pre_norm,masked", [(True, True, False), (False, False, True)],
                         ids=["gpt", "bert"])
def test_compiled_layer_has_no_graph_break(causal, pre_norm, masked):
    layer, _ = _layer(causal=causal, pre_norm=pre_norm)
    layer.train()
    x = torch.randn(2, SEQ, HIDDEN)
    mask = torch.ones(2, SEQ, dtype=torch.long) if masked else None
    dynamo.reset()
    explained = dynamo.explain(layer)(x, mask)
    reasons = [b.reason.splitlines()[0] for b in explained.break_reasons]
    _check_breaks(explained.graph_break_count, explained.graph_count, reasons)


def test_tracker_swap_ops_match_the_python_fork():
    """``enter``/``leave`` around a draw leave both generators exactly where ``fork()`` leaves them."""
    states = []
    for use_ops in (False, True):
        torch.manual_seed(3)
        tracker = RNGTracker(seed=11, tp_rank=1)
        anchor = torch.zeros(4)
        if use_ops:
            anchor = tracker.enter(anchor)
            drawn = torch.rand(5) + anchor.sum()
            tracker.leave(drawn)
        else:
            with tracker.fork():
                drawn = torch.rand(5)
        states.append((drawn, tracker._state.clone(), torch.get_rng_state(), torch.rand(3)))
    for eager, ops in zip(*states):
        assert torch.equal(eager, ops)


def test_compiled_layer_draws_eager_masks():
    """Forward output, input gradient and both generators' states after a step equal eager's (1e-6)."""
    x = torch.randn(2, SEQ, HIDDEN, requires_grad=True)
    results = []
    for compiled in (False, True):
        layer, tracker = _layer()
        layer.train()
        if compiled:
            dynamo.reset()
            layer.compile()
        torch.manual_seed(5)
        with torch._inductor.config.patch(fallback_random=True):
            out = layer(x)
            out.square().sum().backward()
        results.append((out.detach(), x.grad.clone(), tracker._state.clone(), torch.get_rng_state()))
        x.grad = None
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled.float(), eager.float(), rtol=1e-6, atol=1e-6)


def test_trainer_with_compiled_layers_trains_like_eager():
    """Two steps of the trainer (dropout on, activation checkpointing on, the tracker replayed in recomputation):
    compiled layers give eager's losses."""
    from repro.training.settings import TrainSettings
    from repro.training.trainer import PipelineTrainer
    from torch._dynamo.utils import counters

    config = GPTConfig(vocab_size=96, hidden_size=HIDDEN, num_layers=2, num_attention_heads=HEADS,
                       max_position_embeddings=SEQ, hidden_dropout=0.1, attention_dropout=0.2)
    groups = init_parallel(tp=1, pp=1, dp=1)
    batch = torch.randint(0, 96, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))
    if not OPS_IN_GRAPH:  # torch 2.4: the trainer says in one line that compiled layers need torch >= 2.5
        from repro.optional import MissingPackage

        settings = TrainSettings(steps=2, micro_batches=1, micro_batch_size=2, seq_len=SEQ, compile_layers=True)
        with pytest.raises(MissingPackage, match=r"compiled transformer layers .* needs torch >= 2\.5"):
            PipelineTrainer(config, groups, settings)
        return
    losses = []
    for compiled in (False, True):
        settings = TrainSettings(steps=2, micro_batches=1, micro_batch_size=2, seq_len=SEQ, seed=3,
                                 activation_checkpointing=True, compile_layers=compiled)
        dynamo.reset()
        counters.clear()
        with torch._inductor.config.patch(fallback_random=True):
            trainer = PipelineTrainer(config, groups, settings)
            losses.append([trainer.step(batch) for _ in range(2)])
        assert (counters["stats"]["unique_graphs"] > 0) == compiled  # the layers did run compiled
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert losses[0][0] != losses[0][1]


def test_compiled_tensor_parallel_layer_is_one_graph_and_matches_eager():
    """At tp=2 (gloo ranks) the layer's f/g all-reduces trace into the graph too: one graph, and the compiled
    forward output, input gradient and weight gradient equal eager's (1e-5)."""
    from repro.dist import spawn
    from tests.foundation.spawn_targets import compiled_tp2_layer

    for rank in spawn(compiled_tp2_layer, 2, timeout_s=600):
        _check_breaks(rank["breaks"], rank["graphs"], rank["reasons"])
        assert max(rank["max_diff"]) <= 1e-5, rank["max_diff"]
