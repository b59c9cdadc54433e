"""Shared pieces of the distributed ZeRO tests: a tiny GPT, deterministic learnable batches, the single-process
AdamW reference, and a runner that trains one configuration on the calling rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from repro.dist.groups import ParallelGroups
from repro.models import GPTConfig, GPTModel
from repro.zero import OffloadConfig, ZeroConfig, build_zero_optimizer

TINY = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                 hidden_dropout=0.0, attention_dropout=0.0)
BATCH, SEQ, STEPS, LR, WEIGHT_DECAY, MAX_NORM = 8, 16, 30, 1e-2, 0.1, 1.0


def batch(step: int, config: GPTConfig = TINY, batch_size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Arithmetic sequences with a random start and stride: learnable, so the loss falls."""
    gen = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, config.vocab_size, (batch_size, 1), generator=gen)
    ids = (start + torch.arange(SEQ + 1) * (1 + start % 3)) % config.vocab_size
    return ids[:, :-1], ids[:, 1:]


def reference_losses(steps: int = STEPS, device: str = "cpu") -> list[float]:
    """Plain single-process torch.optim.AdamW (fused on a GPU) with torch's clip_grad_norm_ on the whole batch."""
    torch.manual_seed(0)
    model = GPTModel(TINY).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                                  fused=True if device == "cuda" else None)
    losses = []
    for step in range(steps):
        ids, labels = (t.to(device) for t in batch(step))
        loss = model.loss(ids, labels).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def local_batch(step: int, groups: ParallelGroups) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = batch(step)
    per_rank = BATCH // groups.dp_size
    rows = slice(groups.dp_rank * per_rank, (groups.dp_rank + 1) * per_rank)
    return ids[rows], labels[rows]


def mean_over_world(loss: torch.Tensor, groups: ParallelGroups) -> float:
    """The global-batch loss (test bookkeeping only, outside the ledger); one rank needs no collective."""
    if groups.world_size == 1:
        return loss.item()
    value = loss.detach().clone()
    dist.all_reduce(value)
    return value.item() / groups.world_size


def train_steps(model: GPTModel, optimizer, groups: ParallelGroups, steps: range) -> list[float]:
    """Train ``steps`` (global step numbers, for the batches) on this rank's share of each batch; the global-batch
    loss of each step."""
    losses = []
    for step in steps:
        ids, labels = local_batch(step, groups)
        loss = model.loss(ids, labels).mean()
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(mean_over_world(loss, groups))
    return losses


def zero_losses(groups: ParallelGroups, config: ZeroConfig, steps: int = STEPS) -> list[float]:
    torch.manual_seed(0)
    model = GPTModel(TINY, tp_group=groups.tp)
    optimizer = build_zero_optimizer(model, config, dp_group=groups.dp, tp_group=groups.tp, lr=LR,
                                     weight_decay=WEIGHT_DECAY)
    losses = train_steps(model, optimizer, groups, range(steps))
    optimizer.tier.close()
    if config.stage == 3:
        optimizer.close()
    return losses


def ddp_losses(groups: ParallelGroups, steps: int = STEPS) -> list[float]:
    """torch's DistributedDataParallel with AdamW and clip_grad_norm_ (tp = 1)."""
    torch.manual_seed(0)
    model = GPTModel(TINY)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=groups.dp.process_group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(steps):
        ids, labels = local_batch(step, groups)
        logits = ddp(ids)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(mean_over_world(loss, groups))
    return losses


def configurations(nvme_path: str, stages=(0, 1, 2, 3), tiers=("none", "cpu", "nvme")) -> list[tuple[str, ZeroConfig]]:
    """Every stage with every offload tier (stage 0, the plain-DP baseline, without offload)."""
    out = []
    for stage in stages:
        for tier in tiers if stage else ("none",):
            offload = OffloadConfig(tier, nvme_path=nvme_path if tier == "nvme" else None)
            out.append((f"stage{stage}-{tier}", ZeroConfig(
                stage=stage, offload_optimizer=offload, offload_param=offload if stage == 3 else OffloadConfig(),
                max_grad_norm=MAX_NORM, bucket_numel=20_000,
            )))
    return out


def max_rel_diff(actual: list[float], expected: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(actual, expected, strict=True))
