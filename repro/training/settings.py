"""How to train: :class:`TrainSettings`, the frozen description every part of the trainer reads.

Global batch = ``micro_batch_size x micro_batches x dp`` sequences of ``seq_len`` tokens (Megatron / MT-NLG sec. 2.4).
Adam's betas default to MT-NLG's (0.9, 0.95); the learning rate follows :class:`~repro.training.schedule.LRSchedule`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.training.rules import check_fp16_zero, check_zero_matches
from repro.training.schedule import LRSchedule
from repro.zero.config import ZeroConfig, check_stage

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
WEIGHT_CASTS = ("auto", "autocast", "saved")


@dataclass(frozen=True)
class TrainSettings:
    """How to train. Global batch = ``micro_batch_size x micro_batches x dp``. Adam betas are MT-NLG's."""

    steps: int
    micro_batches: int
    micro_batch_size: int = 2
    seq_len: int = 16
    lr: float = 1e-3
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad: float | None = None
    zero_stage: int = 0
    seed: int = 0
    device: str = "cpu"
    precision: str = "fp32"
    activation_checkpointing: bool = False
    compile_layers: bool = False
    min_lr: float = 0.0
    lr_warmup: int = 0
    lr_decay_iters: int | None = None
    lr_decay_style: str = "constant"
    zero: ZeroConfig | None = None  # a DeepSpeed config's ZeRO settings (buckets, offload); its stage = zero_stage
    #: zero_stage 0: parameters, gradients and optimizer states in flat buffers (repro.training.flat_buffers), or
    #: the per-parameter optimizer they replaced (a reference for measurements)
    flat_buffers: bool = True
    #: 16-bit weights under activation checkpointing: cast by autocast in the forward and again in the recomputation
    #: ("autocast"), or cast once before each layer's checkpoint and kept for the recomputation ("saved",
    #: repro.training.weight_casts; with flat buffers the casts' backward writes the gradients into them); "auto":
    #: "saved" where it applies (bf16 or fp16 with activation checkpointing, not ZeRO-3; the same arithmetic), else
    #: "autocast"
    weight_casts: str = "auto"
    #: with compile_layers: the final layer norm runs in the compiled loss region (with the output layer and the
    #: cross-entropy) rather than eagerly between two compiled regions
    final_norm_in_loss: bool = True

    @property
    def casts(self) -> str:
        """The weight casts this run makes: ``weight_casts`` with "auto" resolved."""
        if self.weight_casts != "auto":
            return self.weight_casts
        saves = self.precision != "fp32" and self.activation_checkpointing and self.zero_stage != 3
        return "saved" if saves else "autocast"

    def schedule(self) -> LRSchedule:
        """The learning rate of each iteration (raises on a bad combination)."""
        return LRSchedule(max_lr=self.lr, min_lr=self.min_lr, warmup=self.lr_warmup,
                          decay_iters=self.lr_decay_iters, decay_style=self.lr_decay_style)

    def __post_init__(self) -> None:
        for name in ("steps", "micro_batches", "micro_batch_size", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be positive")
        if self.clip_grad is not None and not self.clip_grad > 0:
            raise ValueError(f"clip_grad={self.clip_grad} must be positive (or None for no clipping)")
        check_stage(self.zero_stage, "zero_stage")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0")
        self.schedule()
        check_zero_matches(self.zero_stage, self.zero)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} must be one of {', '.join(PRECISIONS)}")
        if self.weight_casts not in WEIGHT_CASTS:
            raise ValueError(f"weight_casts={self.weight_casts!r} must be one of {', '.join(WEIGHT_CASTS)}")
        if self.weight_casts == "saved" and (self.precision == "fp32" or not self.activation_checkpointing):
            raise ValueError(f"weight_casts='saved' keeps a layer's 16-bit weight casts for its recomputation: it "
                             f"needs precision bf16 or fp16 (got {self.precision}) and activation_checkpointing "
                             f"(got {self.activation_checkpointing})")
        if self.weight_casts == "saved" and self.zero_stage == 3:
            raise ValueError("weight_casts='saved' casts a layer's weights before its forward starts; zero_stage=3 "
                             "gathers them only then: use weight_casts 'autocast' (or 'auto') with ZeRO-3")
        check_fp16_zero(self.precision, self.zero_stage)
        try:
            kind = torch.device(self.device).type
        except (RuntimeError, TypeError) as err:  # torch rejects unknown device strings with a RuntimeError
            raise ValueError(f"device={self.device!r} must be a CPU or CUDA device ({err})") from err
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} must be a CPU or CUDA device")
