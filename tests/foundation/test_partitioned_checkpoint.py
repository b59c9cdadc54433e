"""ZeRO-R's partitioned activation checkpoints (P_a, P_a+cpu) against Megatron's replicated checkpoint and against no
checkpoint at all: the same loss and every gradient at tp 1, 2 and 4 (real gloo ranks, dropout on, so the
recomputation must replay both generators); each rank keeps 1/tp of the layer input; backward adds exactly one
all-gather of b s h per layer."""

from __future__ import annotations

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig, GPTModel
from repro.tensor_parallel import seed_everything
from repro.tensor_parallel.partitioned_checkpoint import gather_slices, slice_of
from repro.training.recompute import checkpoint_layers

CONFIG = GPTConfig(vocab_size=64, hidden_size=32, num_layers=3, num_attention_heads=4, max_position_embeddings=8,
                   hidden_dropout=0.2, attention_dropout=0.2)
B, S = 3, 7  # b s h = 672: not a multiple of 4, so the last slice is padded at tp 4


def _loss_and_grads(mode: str | None, tp: int):
    groups = init_parallel(tp=tp)
    tracker = seed_everything(11, tp_rank=groups.tp_rank)
    model = GPTModel(CONFIG, tp_group=groups.tp, rng_tracker=tracker)
    if mode is not None:
        checkpoint_layers(model.layers, mode, groups.tp, rng_tracker=tracker)
    tokens = torch.randint(0, CONFIG.vocab_size, (B, S + 1), generator=torch.Generator().manual_seed(3))
    seed_everything(5, tp_rank=groups.tp_rank)
    tracker.reset()
    groups.ledger.reset()
    loss = model.loss(tokens[:, :-1], tokens[:, 1:]).mean()
    forward_gathers = groups.ledger.calls("all_gather", "tp")
    loss.backward()
    after = torch.rand(1).item()  # the default generator after the step: a replay must leave it where it was
    saved = [(getattr(layer, "saved_elements", None), getattr(layer, "saved_device", None)) for layer in model.layers]
    grads = {name.replace(".layer.", "."): p.grad.clone() for name, p in model.named_parameters()}
    return dict(loss=loss.item(), grads=grads, after=after, saved=saved, forward_gathers=forward_gathers,
                gathers=groups.ledger.calls("all_gather", "tp") - forward_gathers,
                gather_bytes=groups.ledger.bytes("all_gather", "tp"))


def _compare(rank, world_size):
    results = {mode: _loss_and_grads(mode, world_size) for mode in (None, "replicated", "partitioned",
                                                                      "partitioned_cpu")}
    return {mode: dict(r, grads={k: v.tolist() for k, v in r["grads"].items()}) for mode, r in results.items()}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_partitioned_checkpoints_equal_replicated_and_no_checkpoint(tp):
    out = spawn(_compare, tp)
    for rank, results in enumerate(out):
        base = results[None]
        for mode in ("replicated", "partitioned", "partitioned_cpu"):
            got = results[mode]
            assert got["loss"] == pytest.approx(base["loss"], rel=1e-6), (rank, mode)
            assert got["after"] == base["after"], f"{mode}: the recomputation moved the default generator"
            for name, grad in base["grads"].items():
                torch.testing.assert_close(torch.tensor(got["grads"][name]), torch.tensor(grad), rtol=1e-5,
                                           atol=1e-6, msg=f"rank {rank} {mode} {name}")
        chunk = -(-B * S * CONFIG.hidden_size // tp)
        for mode, device in (("partitioned", "cpu"), ("partitioned_cpu", "cpu")):
            assert results[mode]["saved"] == [(chunk, device)] * CONFIG.num_layers
            # P_a's one all-gather per layer, in backward only (the model's own gathers are unchanged)
            assert results[mode]["forward_gathers"] == results["replicated"]["forward_gathers"]
            extra = results[mode]["gathers"] - results["replicated"]["gathers"]
            assert extra == (CONFIG.num_layers if tp > 1 else 0)
            extra_bytes = results[mode]["gather_bytes"] - results["replicated"]["gather_bytes"]
            assert extra_bytes == (CONFIG.num_layers * chunk * tp * 4 if tp > 1 else 0)


def _roundtrip(rank, world_size):
    groups = init_parallel(tp=world_size)
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    piece = slice_of(x, groups.tp)
    return piece.numel(), bool(torch.equal(gather_slices(piece, x.shape, groups.tp), x))


@pytest.mark.parametrize("tp", [1, 4])
def test_slices_gather_back_to_the_whole_input(tp):
    assert spawn(_roundtrip, tp) == [(-(-30 // tp), True)] * tp


def test_a_frozen_embedding_still_gives_the_layers_gradients():
    torch.manual_seed(0)
    model = GPTModel(CONFIG)
    model.embedding.requires_grad_(False)
    checkpoint_layers(model.layers, "partitioned", model.tp_group)
    tokens = torch.randint(0, CONFIG.vocab_size, (B, S + 1))
    model.loss(tokens[:, :-1], tokens[:, 1:]).mean().backward()
    assert all(p.grad is not None for p in model.layers.parameters())


def test_unknown_checkpoint_kind_names_the_choices():
    with pytest.raises(ValueError, match="'sparse' must be one of replicated, partitioned, partitioned_cpu"):
        checkpoint_layers(GPTModel(CONFIG).layers, "sparse", init_parallel().tp)
