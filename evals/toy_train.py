"""A small GPT trained for a few CPU minutes: the model the toy end-to-end run evaluates.

Not a reproduction of the paper's training (that is 300k iterations of 8.3B parameters on 512 GPUs); it exists
so every harness runs on a real, trained repro model end to end. Training samples random windows of
``seq_len + 1`` tokens from one token stream (the detokenized ``wiki.valid.tokens``), AdamW with linear warm-up
and cosine decay, Megatron's per-token cross-entropy (``GPTModel.loss``, vocabulary-parallel at tp > 1).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from repro.dist.comm import CommGroup
from repro.models import GPTConfig, GPTModel


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 50
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    max_steps: int = 1000
    max_seconds: float | None = None  # stop at whichever of max_steps / max_seconds comes first
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.batch_size < 1 or self.max_steps < 1:
            raise ValueError(f"seq_len={self.seq_len}, batch_size={self.batch_size}, max_steps={self.max_steps} "
                             "must be >= 2, >= 1, >= 1")


@dataclass(frozen=True)
class TrainLog:
    steps: int
    tokens: int
    seconds: float
    first_loss: float
    final_loss: float  # mean of the last 10% of steps


def lr_at(step: int, config: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to ``min_lr`` over the run: over ``max_steps``, or over ``max_seconds``
    of wall time when that is set (whichever is further along), so a time-boxed run still ends at ``min_lr``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    if config.max_seconds:
        progress = max(progress, elapsed_s / config.max_seconds)
    progress = min(1.0, progress)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * progress))


def train_gpt(model_config: GPTConfig, tokens: torch.Tensor, config: TrainConfig, *,
              tp_group: CommGroup | None = None, progress: bool = True) -> tuple[GPTModel, TrainLog]:
    """Train a fresh GPT on the 1-D token stream ``tokens``. Every tp rank runs it with the same seed."""
    if tokens.dim() != 1 or tokens.numel() <= config.seq_len + 1:
        raise ValueError(f"need a 1-D token stream longer than seq_len+1={config.seq_len + 1}, "
                         f"got shape {tuple(tokens.shape)}")
    if config.seq_len > model_config.max_position_embeddings:
        raise ValueError(f"seq_len={config.seq_len} exceeds max_position_embeddings="
                         f"{model_config.max_position_embeddings}")
    torch.manual_seed(config.seed)
    model = GPTModel(model_config, tp_group=tp_group)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(config.seed)
    offsets = torch.arange(config.seq_len + 1)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    bar = tqdm(range(config.max_steps), desc="train toy gpt", disable=not progress, unit="step")
    for step in bar:
        elapsed = time.perf_counter() - start
        if config.max_seconds is not None and elapsed > config.max_seconds:
            break
        starts = torch.randint(0, tokens.numel() - config.seq_len - 1, (config.batch_size,), generator=generator)
        window = tokens[starts[:, None] + offsets]  # [b, s+1]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config, elapsed)
        loss = model.loss(window[:, :-1], window[:, 1:]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    log = TrainLog(steps=len(losses), tokens=len(losses) * config.batch_size * config.seq_len,
                   seconds=time.perf_counter() - start, first_loss=losses[0], final_loss=sum(tail) / len(tail))
    return model, log
