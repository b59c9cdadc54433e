"""Every key of a DeepSpeed JSON config, checked: known, of the right type, and either honoured or refused.

DeepSpeed's config-json documentation lists the keys. Here each one is in exactly one of three sets:

* **read**: the suite does what DeepSpeed documents (``zero_optimization``, ``fp16``/``bf16``, ``gradient_clipping``,
  and the batch keys, which ``repro train`` honours through :func:`deepspeed_batch`);
* **ignored**: it tunes DeepSpeed's own logging, profiling or buffers and moves no number a run computes;
* **refused**: honouring it would change the results and the suite does not implement it (an ``optimizer`` block
  would silently train with another optimizer than the one written), so its presence is an error naming a way out.

An unknown key is an error with a "did you mean" suggestion (``zero_optimisation`` -> ``zero_optimization``), never
a silent default. Every error is one line: the dotted key, the value given and the rule.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

STAGES = (0, 1, 2, 3)


def check_stage(value: Any, key: str = "stage") -> int:
    """``value`` if it is a ZeRO stage: an int (not a bool, not a float) in 0-3; else a one-line ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in STAGES:
        raise ValueError(f"{key}={value!r} is not a ZeRO stage: must be an integer in {STAGES}")
    return value


def check_numel(value: Any, key: str, *, integral_floats: bool = False, what: str = "a number of elements") -> int:
    """``value`` as a positive element count; else a one-line ValueError naming ``key`` and ``value``.

    Bools, strings (DeepSpeed's ``"auto"`` is filled in by the Hugging Face integration, not here), zero and
    negatives are refused. ``integral_floats``: accept 5e8 (how DeepSpeed JSON configs write sizes; JSON reads it
    as a float) but not a fraction such as 1.5.
    """
    number = int(value) if integral_floats and isinstance(value, float) and value.is_integer() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"{key}={value!r} is not allowed: it must be a positive integer ({what})")
    return number


# ---- value kinds: each checks one value and raises a one-line ValueError naming the dotted key -----------------

def _bool(value: Any, key: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} must be true or false")


def _count(value: Any, key: str) -> None:
    check_numel(value, key, integral_floats=True)


def _how_many(what: str) -> Callable[[Any, str], None]:
    """A kind for a positive count of ``what`` (5e8 written as a float is accepted, 1.5 is not)."""

    def check(value: Any, key: str) -> None:
        check_numel(value, key, integral_floats=True, what=what)

    return check


def _batch(what: str) -> Callable[[Any, str], None]:
    """A kind for a positive batch count: an integer, as ``stage`` is (8.0 is refused like 2.0 is for a stage; sizes
    in elements, written 5e8, are :func:`_how_many`)."""

    def check(value: Any, key: str) -> None:
        check_numel(value, key, what=what)

    return check


def _int(value: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r} must be an integer")


def _number(value: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{key}={value!r} must be a finite number >= 0")


def _fraction(value: Any, key: str) -> None:
    _number(value, key)
    if value > 1:
        raise ValueError(f"{key}={value!r} must be a number in [0, 1]")


def _text(value: Any, key: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{key}={value!r} must be a string")


def _object(value: Any, key: str) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}={value!r} must be a JSON object {{...}}")


def _offload(value: Any, key: str) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f'{key}={value!r} must be a JSON object such as {{"device": "cpu"}}')
    _check_block(value or {}, key, OFFLOAD_KEYS)


def _block(schema: Mapping[str, Callable[[Any, str], None]]) -> Callable[[Any, str], None]:
    """A kind for a nested object whose keys are checked against ``schema``."""

    def check(value: Any, key: str) -> None:
        _object(value, key)
        _check_block(value, key, schema)

    return check


Kind = Callable[[Any, str], None]

#: offload_optimizer / offload_param. Read: device, nvme_path, pin_memory; the others tune DeepSpeed's buffer
#: pools and its partial CPU step (ratio) and are ignored: they move no result.
OFFLOAD_KEYS: dict[str, Kind] = {
    "device": _text, "nvme_path": _text, "pin_memory": _bool, "buffer_count": _how_many("a number of buffers"),
    "buffer_size": _count, "max_in_cpu": _count, "ratio": _fraction, "fast_init": _bool, "pipeline_read": _bool,
    "pipeline_write": _bool,
}

#: zero_optimization: what each read key does is documented at ``repro.zero.config``; the stage and bucket sizes are
#: checked there too (their own messages). Ignored keys are listed in ``repro.zero.config._DS_ZERO_IGNORED``.
ZERO_KEYS: dict[str, Kind] = {
    "stage": lambda value, key: check_stage(value, key), "offload_optimizer": _offload, "offload_param": _offload,
    "reduce_bucket_size": _count, "sub_group_size": _count, "stage3_prefetch_bucket_size": _count,
    "cpu_offload": _bool, "load_from_fp32_weights": _bool, "zero_quantized_weights": _bool,
    "zero_quantized_gradients": _bool,
    # ignored (tuning of DeepSpeed's own implementation; see repro.zero.config)
    "allgather_partitions": _bool, "allgather_bucket_size": _count, "overlap_comm": _bool, "reduce_scatter": _bool,
    "contiguous_gradients": _bool, "stage3_max_live_parameters": _count, "stage3_max_reuse_distance": _count,
    "stage3_param_persistence_threshold": _count, "stage3_gather_16bit_weights_on_model_save": _bool,
    "stage3_model_persistence_threshold": _count, "round_robin_gradients": _bool, "elastic_checkpoint": _bool,
    "ignore_unused_parameters": _bool, "memory_efficient_linear": _bool, "use_multi_rank_bucket_allreduce": _bool,
    "zero_hpz_partition_size": _how_many("ranks"), "mics_shard_size": _int, "log_trace_cache_warnings": _bool,
    "gather_16bit_weights_on_model_save": _bool,
}

def _text_or_null(value: Any, key: str) -> None:
    if value is not None:
        _text(value, key)


def _texts(value: Any, key: str) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{key}={value!r} must be a list of strings")


def _depth(value: Any, key: str) -> None:
    _int(value, key)
    if value < -1:
        raise ValueError(f"{key}={value!r} must be -1 (every level) or an integer >= 0")


#: the blocks of DeepSpeed's own tools that move no number a run computes: ignored, but each key checked (garbage
#: in them is a typo the user means to take effect: it is refused, not passed over)
AIO_KEYS: dict[str, Kind] = {
    "block_size": _how_many("bytes"), "queue_depth": _how_many("requests"), "thread_count": _how_many("threads"),
    "intra_op_parallelism": _how_many("threads"), "single_submit": _bool, "overlap_events": _bool, "use_gds": _bool,
}
FLOPS_PROFILER_KEYS: dict[str, Kind] = {
    "enabled": _bool, "recompute_fwd_factor": _number, "profile_step": _how_many("steps"), "module_depth": _depth,
    "top_modules": _how_many("modules"), "detailed": _bool, "output_file": _text_or_null,
}
COMMS_LOGGER_KEYS: dict[str, Kind] = {
    "enabled": _bool, "verbose": _bool, "prof_all": _bool, "debug": _bool, "prof_ops": _texts,
}
COMET_KEYS: dict[str, Kind] = {
    "enabled": _bool, "samples_log_interval": _how_many("samples"), "project": _text_or_null,
    "workspace": _text_or_null, "api_key": _text_or_null, "experiment_name": _text_or_null,
    "experiment_key": _text_or_null, "mode": _text_or_null, "online": _bool,
}

#: fp16 (dynamic loss scaling, read into repro.zero.config.LossScaleConfig) and bf16 (only ``enabled`` is read)
FP16_KEYS: dict[str, Kind] = {
    "enabled": _bool, "auto_cast": _bool, "loss_scale": _number, "initial_scale_power": _int,
    "loss_scale_window": _how_many("steps"), "hysteresis": _how_many("overflows"), "consecutive_hysteresis": _bool,
    "min_loss_scale": _number,
    "fp16_master_weights_and_grads": _bool,
}
BF16_KEYS: dict[str, Kind] = {"enabled": _bool, "immediate_grad_update": _bool}

#: top-level keys the suite reads (the batch keys through :func:`deepspeed_batch`)
READ: dict[str, Kind] = {
    "zero_optimization": _block(ZERO_KEYS), "fp16": _block(FP16_KEYS), "bf16": _block(BF16_KEYS),
    "bfloat16": _block(BF16_KEYS), "gradient_clipping": _number, "train_batch_size": _batch("sequences per step"),
    "train_micro_batch_size_per_gpu": _batch("sequences per micro-batch"),
    "gradient_accumulation_steps": _batch("micro-batches per step"),
}
#: top-level keys accepted and not read here: profiling and DeepSpeed's own I/O library settings, ignored; the
#: monitor blocks (tensorboard, wandb, csv_monitor, comet) and steps_per_print, read by :func:`deepspeed_logging`
IGNORED: dict[str, Kind] = {
    "steps_per_print": _how_many("steps"), "wall_clock_breakdown": _bool, "dump_state": _bool,
    "memory_breakdown": _bool,
    "flops_profiler": _block(FLOPS_PROFILER_KEYS), "tensorboard": _object, "wandb": _object, "csv_monitor": _object,
    "comet": _block(COMET_KEYS), "comms_logger": _block(COMMS_LOGGER_KEYS), "zero_allow_untested_optimizer": _bool,
    "zero_force_ds_cpu_optimizer": _bool, "aio": _block(AIO_KEYS),
}
#: top-level keys that would change the results and are not implemented: refused, each with the way out
REFUSED: dict[str, str] = {
    "optimizer": "the trainer's optimizer is AdamW, set with --lr, --min-lr and --weight-decay; drop the block",
    "scheduler": "the schedule is set with --lr-warmup-iters, --lr-decay-iters and --lr-decay-style; drop the block",
    "amp": "apex AMP is not supported; use --precision bf16 or fp16",
    "communication_data_type": "gradients are reduced in fp32; drop the key",
    "seq_parallel_communication_data_type": "sequence-parallel communication is not implemented; drop the key",
    "prescale_gradients": "gradients are averaged after the reduction; drop the key",
    "gradient_predivide_factor": "gradients are averaged after the reduction; drop the key",
    "sparse_gradients": "sparse gradients are not implemented; drop the key",
    "activation_checkpointing": "use --activation-checkpointing (each layer is recomputed in backward)",
    "sparse_attention": "sparse attention is not implemented; drop the block",
    "pipeline": "use --pp for pipeline stages",
    "data_efficiency": "data sampling and routing are not implemented; drop the block",
    "curriculum_learning": "curriculum learning is not implemented; drop the block",
    "compression_training": "compression is not implemented; drop the block",
    "elasticity": "elastic batch sizes are not implemented; drop the block",
    "autotuning": "autotuning is not implemented; drop the block",
    "checkpoint": "checkpoints are set with --save, --save-interval and --load; drop the block",
    "data_types": "gradient accumulation runs in fp32; drop the block",
}


def did_you_mean(keys: list[str], known: Any) -> str:
    """``" (did you mean 'stage'?)"`` naming the closest known key of each unknown one (difflib), or ``""``."""
    pairs = [(key, difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)) for key in keys]
    hints = [repr(close[0]) + ("" if len(keys) == 1 else f" for {key!r}") for key, close in pairs if close]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def _check_block(block: Mapping[str, Any], where: str, schema: Mapping[str, Kind]) -> None:
    unknown = sorted(set(block) - set(schema))
    if unknown:
        raise ValueError(f"unknown {where} keys {unknown}{did_you_mean(unknown, schema)}; known: {sorted(schema)}")
    for key, value in block.items():
        schema[key](value, f"{where}.{key}")


def check_deepspeed_config(config: Any) -> None:
    """Raise a one-line ValueError for the first key of ``config`` that is unknown, mistyped or refused."""
    _object(config, "the DeepSpeed config")
    unknown = sorted(set(config) - set(READ) - set(IGNORED) - set(REFUSED))
    if unknown:
        raise ValueError(f"unknown keys {unknown}{did_you_mean(unknown, [*READ, *IGNORED, *REFUSED])}; the keys "
                         f"read are {sorted(READ)}")
    for key, value in config.items():
        if key in REFUSED:
            raise ValueError(f"{key} is not supported: {REFUSED[key]}")
        (READ.get(key) or IGNORED[key])(value, key)
    _check_combinations(config)


def _check_combinations(config: Mapping[str, Any]) -> None:
    """Keys that are each well formed but cannot go together (one of them would be ignored without a word)."""
    if "bf16" in config and "bfloat16" in config:
        raise ValueError("bf16 and bfloat16 are both given: they are two spellings of one block (bfloat16 the older "
                         "one); keep one of them")
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    offload = (zero.get("offload_optimizer") or {}).get("device", "none")
    if stage == 0 and (offload != "none" or zero.get("cpu_offload")):
        what = f"offload_optimizer.device={offload!r}" if offload != "none" else "cpu_offload=true"
        raise ValueError(f"zero_optimization.{what} needs zero_optimization.stage >= 1 (DeepSpeed offloads ZeRO's "
                         f"partitioned optimizer states), got stage 0")


@dataclass(frozen=True)
class DeepSpeedBatch:
    """The batch keys of a DeepSpeed config (None: not given). DeepSpeed's rule, which ``repro train`` enforces:
    train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size."""

    train_batch_size: int | None = None
    micro_batch_size: int | None = None
    micro_batches: int | None = None

    def resolve(self, *, micro_batch_size: int, micro_batches: int, dp: int) -> tuple[int, int]:
        """(micro-batch size, micro-batches per step) honouring the config, with the command line's values
        where the config leaves them open; a ValueError names the numbers when they cannot satisfy the rule.

        As in DeepSpeed, a given ``train_batch_size`` with one of the other two derives the third; with neither,
        the micro-batch size comes from the command line and the micro-batches are derived."""
        size = self.micro_batch_size if self.micro_batch_size is not None else micro_batch_size
        steps = self.micro_batches if self.micro_batches is not None else micro_batches
        total = self.train_batch_size
        if total is not None and self.micro_batches is None:
            steps, rest = divmod(total, size * dp)
            if rest or steps < 1:
                raise ValueError(f"train_batch_size={total} is not a multiple of micro-batch size x data-parallel "
                                 f"size = {size} x {dp}: it must equal micro-batch size x "
                                 "gradient_accumulation_steps x dp")
        elif total is not None and self.micro_batch_size is None:
            size, rest = divmod(total, steps * dp)
            if rest or size < 1:
                raise ValueError(f"train_batch_size={total} is not a multiple of gradient_accumulation_steps x "
                                 f"data-parallel size = {steps} x {dp}: it must equal micro-batch size x "
                                 "gradient_accumulation_steps x dp")
        if total is not None and total != size * steps * dp:
            raise ValueError(f"train_batch_size={total} != micro-batch size x gradient_accumulation_steps x "
                             f"data-parallel size = {size} x {steps} x {dp} = {size * steps * dp}")
        return size, steps


def deepspeed_batch(config: Mapping[str, Any]) -> DeepSpeedBatch:
    """The batch keys of a config that passed :func:`check_deepspeed_config` (so each is a whole number)."""

    def count(key: str) -> int | None:
        return int(config[key]) if key in config else None

    return DeepSpeedBatch(count("train_batch_size"), count("train_micro_batch_size_per_gpu"),
                          count("gradient_accumulation_steps"))


@dataclass(frozen=True)
class DeepSpeedLogging:
    """What a DeepSpeed config's monitor blocks ask of the trainer's log (None: not asked). DeepSpeed writes
    TensorBoard events to ``output_path/job_name`` and W&B runs to ``project`` (``group``, ``team``); its
    ``steps_per_print`` is how often it prints, the trainer's ``--log-interval``."""

    tensorboard_dir: str | None = None
    wandb_project: str | None = None
    wandb_group: str | None = None
    wandb_entity: str | None = None
    log_interval: int | None = None


#: monitor blocks: their keys and the kind of each value
_MONITOR_KEYS = {"tensorboard": ("enabled", "output_path", "job_name"),
                 "wandb": ("enabled", "project", "group", "team"), "csv_monitor": ("enabled", "output_path", "job_name")}


def deepspeed_logging(config: Mapping[str, Any]) -> DeepSpeedLogging:
    """The monitor blocks of a config that passed :func:`check_deepspeed_config`: TensorBoard and W&B are honoured
    (the trainer writes them), an enabled ``csv_monitor`` or ``comet`` is refused (the trainer writes neither;
    ``--log-jsonl`` is its per-iteration record), never ignored. ValueError names the key and the rule."""
    blocks = {}
    for name, keys in _MONITOR_KEYS.items():
        block = config.get(name, {})
        _check_block(block, name, {key: (_bool if key == "enabled" else _text) for key in keys})
        blocks[name] = block if block.get("enabled", False) else {}
    for name in ("csv_monitor", "comet"):
        if config.get(name, {}).get("enabled", False):
            raise ValueError(f"{name}.enabled=true is not supported: the trainer writes every iteration as JSON "
                             "lines (--log-jsonl), TensorBoard and W&B; drop the block or disable it")
    board = blocks["tensorboard"]
    if board and not board.get("output_path"):
        raise ValueError("tensorboard.enabled=true needs tensorboard.output_path (where the events go, under "
                         "job_name)")
    tensorboard_dir = str(Path(board["output_path"]) / board.get("job_name", "DeepSpeedJobName")) if board else None
    wandb = blocks["wandb"]
    if wandb and not wandb.get("project"):
        raise ValueError("wandb.enabled=true needs wandb.project (the W&B project to log to)")
    steps = config.get("steps_per_print")
    return DeepSpeedLogging(tensorboard_dir=tensorboard_dir, wandb_project=wandb.get("project"),
                            wandb_group=wandb.get("group"), wandb_entity=wandb.get("team"),
                            log_interval=int(steps) if steps is not None else None)
