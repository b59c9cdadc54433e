"""ZeRO settings as frozen dataclasses, also read from a DeepSpeed-style ``zero_optimization`` block.

ZeRO sec. 5: stage 1 partitions optimizer states (P_os), stage 2 also gradients (P_os+g), stage 3 also
parameters (P_os+g+p); stage 0 is plain data parallelism. ZeRO-Offload / ZeRO-Infinity place optimizer states
(any stage) and parameters (stage 3 only: a stage that keeps whole parameters on every rank has nothing to page)
on a slower tier: ``cpu`` memory or ``nvme`` (a directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from repro.zero.deepspeed_json import STAGES, check_deepspeed_config, check_numel, check_stage

__all__ = ["STAGES", "OFFLOAD_DEVICES", "DTYPES", "DEFAULT_BUCKET_NUMEL", "check_stage", "check_numel",
           "OffloadConfig", "LossScaleConfig", "ZeroConfig"]

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DTYPES = ("fp32", "bf16", "fp16")
#: Elements per bucket when neither the caller nor a DeepSpeed config gives a size (CPU-test sized; DeepSpeed's
#: own default reduce_bucket_size is 5e8).
DEFAULT_BUCKET_NUMEL = 500_000

#: DeepSpeed ``zero_optimization`` keys we read, and what each does here (DeepSpeed docs, config-json):
#:   stage                        the ZeRO stage, an integer 0-3 (a bool is refused: ``true`` is not a stage)
#:   offload_optimizer / _param   the tier of the optimizer states / of the parameters (stage 3)
#:   reduce_bucket_size           elements reduced at a time: the bucket size (stages 0-2; a cap in stage 3)
#:   sub_group_size               stage 3: elements per optimizer-step sub-group ("parameters are grouped into
#:                                buckets of sub_group_size and each bucket is updated one at a time"). Our
#:                                stage-3 buckets never span modules (a module is gathered as a unit), so this is
#:                                a cap: a module's parameters are cut into buckets of at most this many elements
#:                                (a larger tensor is a bucket of its own). Stage 3 has one bucket size for
#:                                reduction and step, so it is min(reduce_bucket_size, sub_group_size): both
#:                                documented bounds hold. Ignored at stages 0-2, as DeepSpeed ignores it there.
#:   stage3_prefetch_bucket_size  stage 3: at most this many parameter elements are gathered (or read from a slow
#:                                tier) ahead of their use ("the size of the fixed buffer for prefetching").
#:                                Ignored at stages 0-2, as in DeepSpeed.
#:   cpu_offload                  DeepSpeed's deprecated spelling of offload_optimizer: {device: cpu}
#:   load_from_fp32_weights       only true (the default) is possible: resuming always restores fp32 masters
#:   zero_quantized_weights/_gradients  only false: quantized (lossy) communication is not implemented
_DS_ZERO_KEYS = {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size", "sub_group_size",
                 "stage3_prefetch_bucket_size", "cpu_offload", "load_from_fp32_weights", "zero_quantized_weights",
                 "zero_quantized_gradients"}
#: DeepSpeed keys accepted and ignored. Each tunes DeepSpeed's own implementation (memory, overlap, message
#: sizes, logging) and none changes the numbers a run computes: allgather_partitions and reduce_scatter choose
#: collectives (we always reduce-scatter and all-gather), allgather_bucket_size (we all-gather per bucket),
#: overlap_comm / contiguous_gradients / round_robin_gradients / use_multi_rank_bucket_allreduce (always
#: overlapped, always contiguous), stage3_max_live_parameters / stage3_max_reuse_distance (a unit is freed right
#: after use), stage3_param_persistence_threshold / stage3_model_persistence_threshold (every parameter is
#: partitioned), memory_efficient_linear, zero_hpz_partition_size and mics_shard_size (memory and message
#: layouts), stage3_gather_16bit_weights_on_model_save / gather_16bit_weights_on_model_save (use
#: checkpoint.consolidate_checkpoint), elastic_checkpoint (ask for resharding at load time:
#: ``load_checkpoint(..., allow_reshard=True)``), ignore_unused_parameters (unused parameters get zero
#: gradients), log_trace_cache_warnings.
_DS_ZERO_IGNORED = {
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "contiguous_gradients",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_param_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "stage3_model_persistence_threshold", "round_robin_gradients",
    "elastic_checkpoint", "ignore_unused_parameters", "memory_efficient_linear", "use_multi_rank_bucket_allreduce",
    "zero_hpz_partition_size", "mics_shard_size", "log_trace_cache_warnings", "gather_16bit_weights_on_model_save",
}
#: Offload keys read: device, nvme_path, pin_memory. The others tune DeepSpeed's buffer pools and its partial
#: CPU step (ratio) and are ignored: they move no result.
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

    ``bucket_numel``: elements per flat bucket, the unit of gradient reduction and of the optimizer-step loop
    (ZeRO-Infinity's sub-groups). Stages 0-2 cut the parameter list greedily; stage 3 cuts each module's
    parameters, so its buckets never span modules. ``prefetch``: stage 3 gathers the next module's parameters
    while this one computes; ``prefetch_numel`` caps the parameter elements gathered or read ahead of their use
    (None: no cap beyond the trace's depth of two modules).
    """

    stage: int = 1
    dtype: str = "fp32"
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    offload_param: OffloadConfig = field(default_factory=OffloadConfig)
    bucket_numel: int = DEFAULT_BUCKET_NUMEL
    prefetch: bool = True
    prefetch_numel: int | None = None
    max_grad_norm: float | None = None
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)

    def __post_init__(self) -> None:
        check_stage(self.stage)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is unknown; choose one of {DTYPES}")
        if self.offload_param.device != "none" and self.stage != 3:
            raise ValueError(
                f"offload_param device {self.offload_param.device!r} needs stage 3, got stage {self.stage}: only "
                "stage 3 partitions parameters, so only it can page them out"
            )
        check_numel(self.bucket_numel, "bucket_numel")
        if self.prefetch_numel is not None:
            check_numel(self.prefetch_numel, "prefetch_numel")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be > 0 (or None for no clipping)")

    def with_(self, **changes: Any) -> "ZeroConfig":
        return replace(self, **changes)

    @classmethod
    def from_deepspeed(cls, ds_config: Mapping[str, Any]) -> "ZeroConfig":
        """Read a DeepSpeed config dict (its ``zero_optimization``, ``bf16``/``fp16`` and ``gradient_clipping``).

        Every key of the config is known and of its type (:func:`repro.zero.deepspeed_json.check_deepspeed_config`,
        which suggests the closest key for a typo); every key read does what DeepSpeed documents (see
        ``_DS_ZERO_KEYS``) or is refused; a ValueError names the key, the value given and the rule. The batch keys
        are checked here and honoured by the trainer (``repro.zero.deepspeed_json.deepspeed_batch``)."""
        check_deepspeed_config(ds_config)
        zero = dict(ds_config.get("zero_optimization", {}))
        stage = check_stage(zero.get("stage", 0), "zero_optimization.stage")
        _refuse_unsupported(zero)
        sizes = {key: check_numel(zero[key], f"zero_optimization.{key}", integral_floats=True)
                 for key in ("reduce_bucket_size", "sub_group_size", "stage3_prefetch_bucket_size") if key in zero}
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
        # Stage 3 has one bucket for reduction and step: the smaller of the two sizes honours both.
        stage_sizes = ("reduce_bucket_size", "sub_group_size") if stage == 3 else ("reduce_bucket_size",)
        bucket = min((sizes[key] for key in stage_sizes if key in sizes), default=DEFAULT_BUCKET_NUMEL)
        return cls(
            stage=stage,
            dtype=dtype,
            offload_optimizer=_offload_optimizer(zero),
            offload_param=_offload_from_deepspeed(zero.get("offload_param"), "offload_param"),
            bucket_numel=bucket,
            prefetch_numel=sizes.get("stage3_prefetch_bucket_size") if stage == 3 else None,
            max_grad_norm=float(clip) if clip else None,
            loss_scale=loss_scale,
        )


def _refuse_unsupported(zero: Mapping[str, Any]) -> None:
    """Keys whose non-default values would change the results: refused rather than ignored."""
    for key, possible, why in (
        ("load_from_fp32_weights", True, "resuming always restores the fp32 master weights"),
        ("zero_quantized_weights", False, "quantized (lossy) communication is not implemented"),
        ("zero_quantized_gradients", False, "quantized (lossy) communication is not implemented"),
    ):
        if key in zero and zero[key] is not possible:
            raise ValueError(f"zero_optimization.{key}={zero[key]!r} is not supported: it must be {possible} ({why})")


def _offload_optimizer(zero: Mapping[str, Any]) -> OffloadConfig:
    """``offload_optimizer``, or ``cpu_offload: true`` (DeepSpeed's deprecated spelling of device cpu)."""
    offload = _offload_from_deepspeed(zero.get("offload_optimizer"), "offload_optimizer")
    if zero.get("cpu_offload"):
        if offload.device not in ("none", "cpu"):
            raise ValueError(f"zero_optimization.cpu_offload=True contradicts offload_optimizer.device="
                             f"{offload.device!r}: give one of them")
        return replace(offload, device="cpu")
    return offload


def _offload_from_deepspeed(block: Mapping[str, Any] | None, what: str) -> OffloadConfig:
    """An offload block (keys and types already checked) as an :class:`OffloadConfig`."""
    if not block:
        return OffloadConfig()
    device = block.get("device", "none")
    if device not in OFFLOAD_DEVICES:
        raise ValueError(f"zero_optimization.{what}.device={device!r} is unknown; choose one of {OFFLOAD_DEVICES}")
    return OffloadConfig(
        device=device,
        nvme_path=block.get("nvme_path"),
        pin_memory=bool(block.get("pin_memory", True)),
    )
