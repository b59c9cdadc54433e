"""Module-level rank functions for tests that start ranks from a forkserver or spawn (they must be picklable)."""

from __future__ import annotations

import os

import torch


def train_tp2(rank: int, world_size: int, steps: int) -> tuple[list[float], list[str | None]]:
    """Train a tiny GPT at tp=2 for ``steps`` steps; return the losses and the parent's ``REPRO_MARK``."""
    from repro.dist.groups import init_parallel
    from repro.models import GPTConfig
    from repro.training.settings import TrainSettings
    from repro.training.trainer import PipelineTrainer

    groups = init_parallel(tp=2, pp=1, dp=1)
    config = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4,
                       max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
    trainer = PipelineTrainer(config, groups, TrainSettings(steps=steps, micro_batches=1, micro_batch_size=4,
                                                            seq_len=16, lr=3e-3, seed=1))
    batch = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(2))
    return [trainer.step(batch) for _ in range(steps)], [os.environ.get("REPRO_MARK")]


def compiled_tp2_layer(rank: int, world_size: int) -> dict:
    """A tp=2 transformer layer compiled (graph count, breaks) and its forward output and input gradient, eager and
    compiled, from the same weights and input (dropout off: the comparison is of the collectives in the graph)."""
    import torch._dynamo as dynamo

    from repro.dist.groups import init_parallel
    from repro.models import GPTConfig
    from repro.models.transformer import TransformerLayer

    groups = init_parallel(tp=2, pp=1, dp=1)
    config = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4,
                       max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    layer = TransformerLayer(config, group=groups.tp, causal=True)
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))
    explained = dynamo.explain(layer)(x)
    results = []
    for compiled in (False, True):
        dynamo.reset()
        run = torch.compile(layer) if compiled else layer
        inp = x.clone().requires_grad_(True)
        out = run(inp)
        out.square().sum().backward()
        results.append((out.detach(), inp.grad.clone(), layer.attention.qkv.weight.grad.clone()))
        layer.zero_grad(set_to_none=True)
    return {"graphs": explained.graph_count, "breaks": explained.graph_break_count,
            "reasons": [b.reason.splitlines()[0] for b in explained.break_reasons],
            "max_diff": [float((a - b).abs().max()) for a, b in zip(*results)]}
