"""What predicts the 1-GPU step's speed, proved on the CPU: host syncs, aten operations, recomputed GEMMs, saved bytes.

On one H200 the trainer's 1.2B step took 0.2496 s against 0.1940 s for a plain GPT compiled whole (2026-11-27), and
0.1877 s against 0.1849 s in one run once these held (2026-11-28); the plain GPT was then a model of its own, it is
now the trainer's GPT with no parallel step applied (:func:`repro.training.parallelize.build_plain_gpt`). The mechanisms behind the gap are all visible on a CPU (:mod:`repro.training.census`):

* host syncs: one per step (reading the loss), none when the loss is left on the device (``step_lazy``); the
  gradient norm and clipping stay on the device;
* operations: the trainer's step (bf16 autocast as the GPU baseline runs, and fp32 less the flat gradient buffer's
  accumulations) issues at most 1.15x the aten operations of the plain GPT's step, both eager, with AdamW counted as
  the one fused kernel it is on a GPU (the optimizer's own operations: ``test_flat_optimizer.py``);
* recomputation: the compiled, checkpointed layer's backward graph recomputes the forward's GEMMs except the second
  FC's (its output is never read by backward), where replaying a compiled layer reran all of them;
* the cross-entropy keeps the bf16 logits for backward, no fp32 tensor of the logits' size;
* and the numbers stay: the cross-entropy's loss and gradient equal the saved-softmax formulation bit for bit, the
  device-side norm and clipped gradients equal the fp64 loop's within 1e-6 (:mod:`repro.training.reference_steps`).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch._dynamo as dynamo

from repro.dist.comm import CommGroup
from repro.dist.groups import init_parallel
from repro.models import GPTConfig
from repro.models.transformer import TransformerLayer
from repro.tensor_parallel import RNGTracker, vocab_parallel_cross_entropy
from repro.tensor_parallel.random import OPS_IN_GRAPH
from repro.training.census import Census, compiled_graphs
from repro.training.grads import clip_grad_norm_
from repro.training.parallelize import build_plain_gpt
from repro.training.reference_steps import clip_grad_norm_loop, saved_softmax_cross_entropy
from repro.training.settings import TrainSettings
from repro.training.trainer import PipelineTrainer

#: in the group of the files that compile the smoke point's toy GPT (tests/gpu_path/test_gpu_path_experiment.py):
#: about half of this file's C++ kernels are theirs, built once in one worker instead of twice at the same time
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")

VOCAB, SEQ, BATCH = 128, 8, 2  # a vocabulary that tp pads to itself, as GPT-2's 51200 of the 1.2B model
CONFIG = GPTConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=SEQ,
                   hidden_dropout=0.1, attention_dropout=0.1)
FUSED_ON_A_GPU = ((torch.optim.AdamW, "step"),)  # fused=True there: one kernel per step, as for the plain GPT


def _batch(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def _trainer(precision: str, **overrides) -> PipelineTrainer:
    settings = dict(steps=3, micro_batches=1, micro_batch_size=BATCH, seq_len=SEQ, seed=3, clip_grad=1.0,
                    activation_checkpointing=True, precision=precision)
    return PipelineTrainer(CONFIG, init_parallel(tp=1, pp=1, dp=1), TrainSettings(**{**settings, **overrides}))


def _census_of(trainer: PipelineTrainer, lazy: bool) -> Census:
    """One step's census, the host batch's preparation (cutting, checking the ids, moving) left out."""
    batch = _batch()
    trainer.step(batch)  # warm: first-step allocations and lazy initialisation
    prepare = trainer._micro_batches
    with Census(as_one=FUSED_ON_A_GPU) as census:
        def host_side(batch):
            with census.paused():
                return prepare(batch)

        trainer._micro_batches = host_side
        try:
            (trainer.step_lazy if lazy else trainer.step)(batch)
        finally:
            del trainer._micro_batches
    return census


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_syncs_once_to_read_its_loss_and_a_lazy_step_never(precision):
    trainer = _trainer(precision)
    read = _census_of(trainer, lazy=False)
    assert read.syncs == 1 and read.sync_sites == Counter({"aten._local_scalar_dense": 1}), read.sync_sites
    lazy = _census_of(trainer, lazy=True)
    assert lazy.syncs == 0, lazy.sync_sites
    assert isinstance(trainer.grad_norm_lazy, torch.Tensor)  # read only when logged
    assert trainer.grad_norm == pytest.approx(float(trainer.grad_norm_lazy))


def _plain_census(precision: str) -> Census:
    torch.manual_seed(0)
    model = build_plain_gpt(CONFIG, activation_checkpointing=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = _batch()
    dtype = {"bf16": torch.bfloat16}.get(precision)

    def step() -> float:  # repro.experiments.megatron_weak_scaling_gpu's plain step, clipped with foreach kernels
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = model.loss(batch[:, :-1], batch[:, 1:]).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        return float(loss.detach())

    model.train()
    step()
    with Census(as_one=FUSED_ON_A_GPU) as census:
        step()
    return census


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_issues_at_most_1_15x_the_operations_of_a_plain_gpt_step(precision):
    """The plain GPT is the trainer's GPT with no parallel step applied (the same layers, the same vocab-parallel
    cross-entropy at tp 1), so what remains is the parallel machinery's: the RNG tracker's swaps and state copies,
    the pipeline schedule's bookkeeping, and the flat gradient buffer's price: one in-place accumulation per parameter
    whose gradient autograd delivers (every one in fp32; under bf16 the casts made before the checkpoint write the
    matmul weights' gradients themselves, in place of the fp32 copy autocast's cast made). Under bf16, the GPU's
    precision, the whole step stays within 1.15x (torch 2.13: 343 against 328 operations, 1.046x; fp32 278 against
    239, 1.046x without its 28 accumulations)."""
    trainer = _trainer(precision)
    ours, plain = _census_of(trainer, lazy=False), _plain_census(precision)
    cast = sum(len(layer.casts.params) for layer in trainer.stage.layers if getattr(layer, "casts", None))
    accumulated = len(trainer.optimizer.params) - cast  # each is one add_ into its slice of the flat gradient
    assert ours.by_op["aten.add_"] >= accumulated
    ratio = (ours.ops - accumulated) / plain.ops
    extra = {op: n - plain.by_op[op] for op, n in ours.by_op.items() if n > plain.by_op[op]}
    assert ratio <= 1.15, f"{ours.ops} operations against the plain GPT's {plain.ops} ({ratio:.3f}x without " \
                          f"{accumulated} accumulations); extra: {extra}"
    if precision == "bf16":
        assert cast > 0 and ours.ops / plain.ops <= 1.15, (ours.ops, plain.ops)
    assert ours.syncs == plain.syncs == 1


@pytest.mark.skipif(not OPS_IN_GRAPH, reason="compiled transformer layers need torch >= 2.5")
def test_the_compiled_checkpointed_layer_recomputes_every_gemm_but_the_second_fc():
    """The GEMMs of the backward graph inductor compiles for ``CompiledCheckpointed``: the backward's own (as without
    checkpointing) plus the forward's, less one of the second FC's shape ([b*s, ffn] x [ffn, h]). The layer is the
    one the step's anatomy times in its ``recompute`` section (bf16 autocast, at its rehearsal's toy size), so the
    kernels are the rehearsal's too (tests/gpu_path/test_gpu_session.py), built once in this group."""
    from repro.training.recompute import CompiledCheckpointed
    from repro.training.step_perf import TOY

    config = GPTConfig(vocab_size=TOY["vocab"], hidden_size=TOY["hidden"], num_layers=1,
                       num_attention_heads=TOY["heads"], max_position_embeddings=TOY["seq"])
    x = torch.randn(TOY["batch"], TOY["seq"], config.hidden_size, requires_grad=True)
    graphs = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        tracker = RNGTracker(seed=7, tp_rank=0)
        layer = TransformerLayer(config, group=CommGroup.single("tp"), causal=True, pre_norm=True,
                                 rng_tracker=tracker)
        module = CompiledCheckpointed(layer) if checkpointed else layer
        module.compile()
        dynamo.reset()
        with compiled_graphs() as seen, torch.autocast("cpu", dtype=torch.bfloat16):
            module(x).float().square().mean().backward()
        forward = [g for g in seen if not g["backward"]]
        backward = [g for g in seen if g["backward"]]
        assert len(forward) == len(backward) == 1, seen  # one graph each way: no break
        graphs[checkpointed] = (Counter(forward[0]["gemms"]), Counter(backward[0]["gemms"]))
    (forward, plain_backward), (_, backward) = graphs[False], graphs[True]
    tokens = TOY["batch"] * TOY["seq"]
    fc2 = ((tokens, config.ffn_size), (config.ffn_size, config.hidden_size))
    assert forward[fc2] == 1
    recomputed = backward - plain_backward
    assert recomputed == forward - Counter([fc2]), f"recomputed {dict(recomputed)}; forward {dict(forward)}"


def test_cross_entropy_saves_the_logits_in_their_dtype_and_no_fp32_copy():
    logits = torch.randn(BATCH, SEQ, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, VOCAB, (BATCH, SEQ))
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = vocab_parallel_cross_entropy(logits, target)
    big = [(t.dtype, tuple(t.shape)) for t in saved if t.numel() >= logits.numel()]
    assert big == [(torch.bfloat16, tuple(logits.shape))], big
    loss.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_equals_the_saved_softmax_formulation_bit_for_bit(dtype):
    torch.manual_seed(0)
    logits = (4 * torch.randn(BATCH, SEQ, VOCAB)).to(dtype).requires_grad_()
    target = torch.randint(0, VOCAB, (BATCH, SEQ))
    reference = logits.detach().clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(logits, target)
    expected = saved_softmax_cross_entropy(reference, target)
    assert torch.equal(loss, expected)
    grad_loss = torch.randn_like(loss)
    loss.backward(grad_loss)
    expected.backward(grad_loss)
    assert torch.equal(logits.grad, reference.grad)


def test_the_norm_and_clipping_stay_on_the_device_and_equal_an_fp64_loop():
    torch.manual_seed(0)
    model = build_plain_gpt(CONFIG)
    model.loss(_batch()[:, :-1], _batch()[:, 1:]).mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    single = CommGroup.single("tp")
    with Census() as census:
        norm = clip_grad_norm_(model, 1e-3, tp_group=single, pp_group=single)
    assert census.syncs == 0, census.sync_sites
    assert isinstance(norm, torch.Tensor) and norm.dtype == torch.float64
    clipped = [p.grad.clone() for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    expected = clip_grad_norm_loop(model, 1e-3, tp_group=single, pp_group=single)  # fp64 sum, host factor
    assert float(norm) == pytest.approx(expected, rel=1e-6)
    for p, ours in zip(model.parameters(), clipped):
        torch.testing.assert_close(ours, p.grad, rtol=1e-6, atol=0)
    before = [p.grad.clone() for p in model.parameters()]  # a norm below max_norm: a factor of exactly 1
    clip_grad_norm_(model, 1e9, tp_group=single, pp_group=single)
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))


@pytest.mark.skipif(not OPS_IN_GRAPH, reason="compiled transformer layers need torch >= 2.5")
def test_with_compiled_layers_the_glue_is_compiled_too_and_the_loss_saves_bf16_logits():
    """Three graphs (a layer with the casts of its weights as inputs, the embedding, the final layer norm with the
    output layer and the cross-entropy), no break; the loss graph keeps the bf16 logits for backward and no fp32 tensor
    of their size."""
    from torch._dynamo.utils import counters

    from repro.training.step_perf import TOY

    # the rehearsal's toy GPT (step_perf's and megatron_weak_scaling_gpu's smoke size, dropout 0.1 as there): the
    # kernels inductor builds for it are the ones those compile, so its on-disk kernel cache serves whichever runs
    # second (the graph caches are off here, the kernels' cache is not); its vocabulary (512) is not the layers' ffn
    # size (256), so that a [tokens, vocab] tensor is the logits
    vocab, batch, seq, hidden = TOY["vocab"], TOY["batch"], TOY["seq"], TOY["hidden"]
    config = GPTConfig(vocab_size=vocab, hidden_size=hidden, num_layers=TOY["layers"], num_attention_heads=TOY["heads"],
                       max_position_embeddings=seq, hidden_dropout=0.1, attention_dropout=0.1)
    assert vocab not in (config.ffn_size, hidden)
    settings = TrainSettings(steps=1, micro_batches=1, micro_batch_size=batch, seq_len=seq, seed=3,
                             activation_checkpointing=True, precision="bf16", compile_layers=True)
    dynamo.reset()
    counters.clear()
    with compiled_graphs() as graphs:
        PipelineTrainer(config, init_parallel(tp=1, pp=1, dp=1), settings).step(
            torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1)))
    assert counters["stats"]["unique_graphs"] == 3 and not counters["graph_break"], dict(counters["graph_break"])
    saved = [(dtype, shape) for g in graphs if not g["backward"] for dtype, shape in g["outputs"]
             if vocab in shape and torch.Size(shape).numel() >= batch * seq * vocab]
    assert saved and all(dtype == torch.bfloat16 for dtype, _ in saved), saved
    # the final layer norm is in the loss's graph (with the output GEMM), not eager between two regions
    logits_gemm = ((batch * seq, hidden), (hidden, vocab))
    loss_graph = next(g for g in graphs if not g["backward"] and logits_gemm in g["gemms"])
    norms = loss_graph["ops"]["aten.var_mean"] + loss_graph["ops"]["aten.native_layer_norm"]
    assert norms == 1, dict(loss_graph["ops"])
