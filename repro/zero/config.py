"""ZeRO settings as frozen dataclasses, also read from a DeepSpeed-style ``zero_optimization`` block.

ZeRO sec. 5: stage 1 partitions optimizer states (P_os), stage 2 also gradients (P_os+g), stage 3 also
parameters (P_os+g+p); stage 0 is plain data parallelism. ZeRO-Offload / ZeRO-Infinity place optimizer states
(any stage) and parameters (stage 3 only: a stage that keeps whole parameters on every rank has nothing to page)
on a slower tier: ``cpu`` memory or ``nvme`` (a directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DTYPES = ("fp32", "bf16", "fp16")

#: DeepSpeed ``zero_optimization`` keys we read.
_DS_ZERO_KEYS = {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size", "sub_group_size",
                 "stage3_prefetch_bucket_size"}
#: DeepSpeed keys accepted and ignored: they tune DeepSpeed's own implementation and have no meaning here.
_DS_ZERO_IGNORED = {
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "contiguous_gradients",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_param_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "stage3_model_persistence_threshold", "round_robin_gradients",
    "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters", "cpu_offload",
    "memory_efficient_linear", "use_multi_rank_bucket_allreduce", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_gradients", "mics_shard_size", "log_trace_cache_warnings", "gather_16bit_weights_on_model_save",
}
_DS_OFFLOAD_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "ratio",
                    "fast_init", "pipeline_read", "pipeline_write"}


@dataclass(frozen=True)
class OffloadConfig:
    """Where a kind of model state lives: ``none`` (the compute device), ``cpu`` or ``nvme`` (under ``nvme_path``).

    ``io_threads`` and ``io_block_bytes`` tune the NVMe tier's thread pool (ZeRO-Infinity sec. 6.3: many
    parallel requests are needed to reach the drive's bandwidth)."""

    device: str = "none"
    nvme_path: str | None = None
    pin_memory: bool = True
    io_threads: int = 4
    io_block_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.device not in OFFLOAD_DEVICES:
            raise ValueError(f"offload device {self.device!r} is unknown; choose one of {OFFLOAD_DEVICES}")
        if self.device == "nvme" and not self.nvme_path:
            raise ValueError("offload device 'nvme' needs nvme_path (a directory on the NVMe drive)")
        if self.io_threads < 1:
            raise ValueError(f"io_threads={self.io_threads} must be >= 1")
        if self.io_block_bytes < 4096 or self.io_block_bytes % 4096:
            raise ValueError(f"io_block_bytes={self.io_block_bytes} must be a positive multiple of 4096")


@dataclass(frozen=True)
class LossScaleConfig:
    """Dynamic loss scaling for fp16 (Micikevicius et al. 2018): start at 2**initial_scale_power, halve on
    overflow (after ``hysteresis`` consecutive overflows) and skip the step, double after ``growth_interval``
    clean steps. ``static_scale`` > 0 fixes the scale instead."""

    initial_scale_power: int = 16
    growth_interval: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0
    static_scale: float = 0.0


@dataclass(frozen=True)
class ZeroConfig:
    """Everything that selects and tunes a ZeRO optimizer.

    ``bucket_numel``: elements per flat bucket (stages 0-2: the unit of gradient reduction and of the optimizer
    loop). ``prefetch``: stage 3 gathers the next module's parameters while this one computes.
    """

    stage: int = 1
    dtype: str = "fp32"
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    offload_param: OffloadConfig = field(default_factory=OffloadConfig)
    bucket_numel: int = 500_000
    prefetch: bool = True
    max_grad_norm: float | None = None
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"ZeRO stage {self.stage!r} is unknown; stages are {STAGES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is unknown; choose one of {DTYPES}")
        if self.offload_param.device != "none" and self.stage != 3:
            raise ValueError(
                f"offload_param device {self.offload_param.device!r} needs stage 3, got stage {self.stage}: only "
                "stage 3 partitions parameters, so only it can page them out"
            )
        if self.bucket_numel < 1:
            raise ValueError(f"bucket_numel={self.bucket_numel} must be >= 1")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be > 0 (or None for no clipping)")

    def with_(self, **changes: Any) -> "ZeroConfig":
        return replace(self, **changes)

    @classmethod
    def from_deepspeed(cls, ds_config: Mapping[str, Any]) -> "ZeroConfig":
        """Read a DeepSpeed config dict (its ``zero_optimization``, ``bf16``/``fp16`` and ``gradient_clipping``)."""
        zero = dict(ds_config.get("zero_optimization", {}))
        unknown = set(zero) - _DS_ZERO_KEYS - _DS_ZERO_IGNORED
        if unknown:
            raise ValueError(f"unknown zero_optimization keys {sorted(unknown)}; known: {sorted(_DS_ZERO_KEYS)}")
        stage = zero.get("stage", 0)
        if not isinstance(stage, int):
            raise ValueError(f"zero_optimization.stage={stage!r} must be an integer in {STAGES}")
        fp16 = dict(ds_config.get("fp16", {}))
        bf16 = dict(ds_config.get("bf16", ds_config.get("bfloat16", {})))
        if fp16.get("enabled") and bf16.get("enabled"):
            raise ValueError("fp16 and bf16 are both enabled; enable at most one")
        dtype = "fp16" if fp16.get("enabled") else "bf16" if bf16.get("enabled") else "fp32"
        loss_scale = LossScaleConfig(
            initial_scale_power=int(fp16.get("initial_scale_power", 16)),
            growth_interval=int(fp16.get("loss_scale_window", 1000)),
            hysteresis=int(fp16.get("hysteresis", 2)),
            min_scale=float(fp16.get("min_loss_scale", 1.0)),
            static_scale=float(fp16.get("loss_scale", 0.0)),
        )
        clip = ds_config.get("gradient_clipping", 0.0)
        bucket = zero.get("sub_group_size") if stage == 3 else zero.get("reduce_bucket_size")
        return cls(
            stage=stage,
            dtype=dtype,
            offload_optimizer=_offload_from_deepspeed(zero.get("offload_optimizer"), "offload_optimizer"),
            offload_param=_offload_from_deepspeed(zero.get("offload_param"), "offload_param"),
            bucket_numel=int(bucket) if bucket else 500_000,
            max_grad_norm=float(clip) if clip else None,
            loss_scale=loss_scale,
        )


def _offload_from_deepspeed(block: Mapping[str, Any] | None, what: str) -> OffloadConfig:
    if not block:
        return OffloadConfig()
    unknown = set(block) - _DS_OFFLOAD_KEYS
    if unknown:
        raise ValueError(f"unknown {what} keys {sorted(unknown)}; known: {sorted(_DS_OFFLOAD_KEYS)}")
    return OffloadConfig(
        device=str(block.get("device", "none")),
        nvme_path=block.get("nvme_path"),
        pin_memory=bool(block.get("pin_memory", True)),
    )
