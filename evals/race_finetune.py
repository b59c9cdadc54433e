"""Finetuning a BERT multiple-choice model on RACE and reporting accuracy the way Megatron-LM does.

Megatron reports accuracy separately for RACE-middle and RACE-high and for all questions (paper Table 5). The
optimizer follows Megatron's finetuning defaults (Adam with decoupled weight decay 0.01, linear warm-up then linear
decay, gradient clipping at 1.0); batch size, learning rate and epochs are arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from evals.multiple_choice import MultipleChoiceModel
from evals.race_data import LEVELS, RaceTensors
from repro.cliargs import SEED_LIMIT


@dataclass(frozen=True)
class FinetuneConfig:
    epochs: float = 3.0
    batch_size: int = 16
    lr: float = 1e-5
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    clip_grad: float = 1.0
    seed: int = 1234
    max_steps: int | None = None  # stop early (toy runs)

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"epochs={self.epochs}, batch_size={self.batch_size}, lr={self.lr} must be positive")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed={self.seed} must be an integer in [0, 2**63)")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")


@dataclass(frozen=True)
class FinetuneLog:
    steps: int
    first_loss: float
    last_loss: float  # mean of the last 10% of steps
    seconds: float


def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def finetune(model: MultipleChoiceModel, train: RaceTensors, config: FinetuneConfig, *,
             progress: bool = True, device: str = "cpu") -> FinetuneLog:
    """Train in place. Deterministic for a given seed; every tensor-parallel rank must call it identically."""
    import time

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total = math.ceil(config.epochs * steps_per_epoch)
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    warmup = max(1, int(config.warmup_fraction * total))
    decay = [p for n, p in model.named_parameters() if not (n.endswith(".bias") or "layernorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or "layernorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total, warmup))
    model.train()
    losses: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    bar = tqdm(range(total), desc="race finetune", disable=not progress, unit="step")
    for step in bar:
        position = (step % steps_per_epoch) * config.batch_size
        if position == 0:
            order = torch.randperm(len(train), generator=generator)
        index = order[position: position + config.batch_size]
        batch = train.subset(index)
        scores = model(*(t.to(device) for t in (batch.input_ids, batch.token_type_ids, batch.attention_mask)))
        loss = F.cross_entropy(scores.float(), batch.labels.to(device))  # scores: [b, 4]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return FinetuneLog(steps=total, first_loss=losses[0], last_loss=sum(tail) / len(tail),
                       seconds=time.perf_counter() - start)


@torch.no_grad()
def predict(model: MultipleChoiceModel, data: RaceTensors, *, batch_size: int = 32,
            progress: bool = True, device: str = "cpu") -> torch.Tensor:
    """Predicted option per question [N]."""
    model.eval()
    out = []
    for begin in tqdm(range(0, len(data), batch_size), desc="race eval", disable=not progress, unit="batch"):
        sl = slice(begin, begin + batch_size)
        scores = model(*(t[sl].to(device) for t in (data.input_ids, data.token_type_ids, data.attention_mask)))
        out.append(scores.argmax(dim=-1).cpu())
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long)


def accuracy_by_level(predictions: torch.Tensor, labels: torch.Tensor, levels: tuple[str, ...]) -> dict[str, dict]:
    """{"middle"|"high"|"all": {"correct", "total", "accuracy"}} (levels without questions are left out)."""
    correct = (predictions == labels).tolist()
    out = {}
    for level in (*LEVELS, "all"):
        picked = [c for c, lv in zip(correct, levels) if level in ("all", lv)]
        if picked:
            out[level] = {"correct": sum(picked), "total": len(picked), "accuracy": sum(picked) / len(picked)}
    return out
