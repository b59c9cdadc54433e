"""How large a GPT trains: a per-rank memory estimate for a ZeRO configuration, and the search that tries growing
model sizes until one does not fit (ZeRO sec. 10.4 and Table 2's "measured max model size", ZeRO-Offload's
largest model on one GPU, ZeRO-Infinity's largest model on one node per tier).

The estimate is what ``repro.zero`` allocates, term by term, for one rank with ``dp`` ZeRO ranks and ``tp``
tensor-parallel ranks (bytes; ``pb`` = 2 for 16-bit parameters):

=================  ==========================================  ==============================================
term               device                                      host (offload)
=================  ==========================================  ==============================================
parameters         pb psi (stage 3: pb psi/dp, + 3 units       stage 3 with cpu parameters: pb psi/dp
                   gathered: the current one and 2 prefetched)
gradients          stage 0: pb psi; 1: pb psi + pb psi/dp (the
                   shards are allocated together); 2-3:
                   pb psi/dp + 2 buckets in flight
master + Adam      12 psi/dp (stage 0: 12 psi) on the device   12 psi/dp with ``cpu``, plus the staging of two
                                                               buckets (16-bit copy + fp32 gradient)
activations        with one checkpoint per layer: L b s h pb   P_a+cpu: the checkpoint slices, L b s h pb / tp
                   (P_a, ZeRO-R: L b s h pb / tp; P_a+cpu:
                   none but the layer input gathered for its
                   recomputation, b s h pb)
                   + one layer's working set b s h (10 + 24/tp)
                   pb (Korthikanti et al. 2022, attention
                   scores not stored: fused SDPA) + logits
                   b s V/tp x 12 bytes (bf16 logits, fp32
                   softmax and its gradient)
build              stage 3 built partitioned: one block in
                   fp32, 4 x its numel, beside the shards
                   already placed (zero.Init's idea; built
                   whole: the 16-bit model, pb psi); the device
                   peak is the larger of build and training.
                   Stages 0-2 are built in their 16-bit
                   training dtype where they train: pb psi, the
                   parameters term itself
=================  ==========================================  ==============================================

plus a fixed device overhead (CUDA context, cuBLAS workspaces; 0 on a CPU run with a fake cap). How the suite
builds a model is not ZeRO's memory: no term counts an fp32 copy of the whole model (such a term capped the
no-MP search at 7.4B where ZeRO's states allow the paper's 13B), and ``repro.experiments.zero_gpu_search`` builds
every stage's model in its 16-bit dtype so that the code holds no such copy either. A size is tried
only when the estimate fits the device and the host memory available now: a host out-of-memory kills the process
(nothing can be caught), a device one raises ``torch.OutOfMemoryError``, which :func:`search_largest` records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

from repro.models import GPTConfig

T = TypeVar("T")

GIB = 2**30
LOGIT_BYTES = 12  # per logit element: bf16 logits + fp32 softmax intermediate + fp32 gradient
OPTIMIZER_BYTES = 12  # fp32 master + Adam momentum + variance, per owned element (ZeRO's K = 12)


def layer_params_per_rank(config: GPTConfig, tp: int = 1) -> int:
    """Parameters of one transformer layer on one tensor-parallel rank: the split matrices / tp, the replicated
    biases and layer norms in full (Megatron's layout, ``repro.tensor_parallel``)."""
    h, f = config.hidden_size, config.ffn_size
    split = 3 * h * h + 3 * h + h * h + h * f + f + f * h  # qkv (+bias), dense, fc1 (+bias), fc2
    replicated = h + h + 4 * h  # row-parallel biases (dense, fc2), two layer norms
    return split // tp + replicated


def params_per_rank(config: GPTConfig, tp: int = 1) -> int:
    """Parameters one tensor-parallel rank holds: its share of every layer, of the word embedding, and the position
    embeddings and final layer norm in full."""
    h = config.hidden_size
    vocab = config.padded_vocab_size(tp)
    return config.num_layers * layer_params_per_rank(config, tp) + vocab * h // tp \
        + config.max_position_embeddings * h + 2 * h


def largest_unit_numel(config: GPTConfig, tp: int = 1) -> int:
    """Elements of the largest module's own parameters (stage 3 gathers one module at a time): the word
    embedding or the h -> 4h linear layer."""
    h = config.hidden_size
    return max(config.padded_vocab_size(tp) * h // tp, (h * config.ffn_size + config.ffn_size) // tp)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank needs on its device and in host memory, by term."""

    device: dict[str, float]
    host: dict[str, float]

    @property
    def device_bytes(self) -> float:
        return sum(self.device.values())

    @property
    def host_bytes(self) -> float:
        return sum(self.host.values())


def estimate_memory(
    config: GPTConfig, *, stage: int, optimizer_tier: str = "none", param_tier: str = "none", dp: int = 1,
    tp: int = 1, micro_batch: int = 1, seq_len: int | None = None, checkpointing: bool = True,
    bucket_numel: int = 500_000, param_bytes: int = 2, device_overhead_bytes: float = 0.0,
    activation_checkpoints: str = "replicated", partitioned_build: bool = False,
) -> MemoryEstimate:
    """The per-rank estimate of the table above for ``config`` trained with ZeRO ``stage``;
    ``activation_checkpoints`` is ``replicated``, ``partitioned`` (P_a) or ``partitioned_cpu`` (P_a+cpu);
    ``partitioned_build``: a stage-3 model is built partitioned (:mod:`repro.models.partitioned_gpt`), so the build
    peak is one block in fp32, not the model."""
    from repro.tensor_parallel.partitioned_checkpoint import ACTIVATION_CHECKPOINTS

    if activation_checkpoints not in ACTIVATION_CHECKPOINTS:
        raise ValueError(f"activation_checkpoints={activation_checkpoints!r} must be 'replicated', 'partitioned' "
                         "or 'partitioned_cpu'")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r} must be 0, 1, 2 or 3")
    for name, tier in (("optimizer_tier", optimizer_tier), ("param_tier", param_tier)):
        if tier not in ("none", "cpu", "nvme"):
            raise ValueError(f"{name}={tier!r} must be 'none', 'cpu' or 'nvme'")
    if param_tier != "none" and stage != 3:
        raise ValueError(f"param_tier={param_tier!r} needs stage 3, got stage {stage}")
    psi = params_per_rank(config, tp)
    shard = psi / dp
    pb = param_bytes
    unit = largest_unit_numel(config, tp)
    # stage 3 reduces one module at a time; stages 0-2 bucket whole parameters (a larger one is its own bucket)
    bucket = unit if stage == 3 else min(max(bucket_numel, unit), psi)
    device: dict[str, float] = {"overhead": float(device_overhead_bytes)}
    host: dict[str, float] = {}
    if stage < 3:
        device["params"] = pb * psi
    else:
        (device if param_tier == "none" else host)["params"] = pb * shard
        device["working_params"] = 3 * pb * unit
    if stage == 0:
        device["grads"] = pb * psi
    elif stage == 1:
        device["grads"] = pb * psi + pb * shard
    else:
        device["grads"] = pb * shard + 2 * 2 * pb * bucket
    owned = psi if stage == 0 else shard
    optimizer = (OPTIMIZER_BYTES - (4 if pb == 4 else 0)) * owned  # fp32 parameters are their own masters
    if optimizer_tier == "none":
        device["optimizer"] = optimizer
        device["step_buffers"] = 4 * bucket
    else:
        host["optimizer"] = OPTIMIZER_BYTES * owned
        host["step_buffers"] = 2 * (pb + 4) * bucket
        device["step_buffers"] = 4 * bucket
    b, s, h = micro_batch, seq_len or config.max_position_embeddings, config.hidden_size
    working = b * s * h * (10 + 24 / tp) * pb
    logits = b * s * config.padded_vocab_size(tp) / tp * LOGIT_BYTES
    checkpoints = config.num_layers * b * s * h * pb
    if not checkpointing:
        stored = config.num_layers * working
    elif activation_checkpoints == "replicated":
        stored = checkpoints
    elif activation_checkpoints == "partitioned":
        stored = checkpoints / tp
    else:
        stored = b * s * h * pb  # the gathered input of the layer being recomputed
        host["activation_checkpoints"] = checkpoints / tp
    device["activations"] = stored + working + logits
    training = sum(v for k, v in device.items() if k != "overhead")
    if stage == 3 and partitioned_build:  # built block by block, each partitioned at once (zero.Init's idea)
        build = 4.0 * max(unit, layer_params_per_rank(config, tp)) + device.get("params", 0.0)
    else:  # built whole in its 16-bit dtype where it trains (stages 0-2: the parameters term itself)
        build = pb * psi
    if build > training:
        device["build_excess"] = build - training
    return MemoryEstimate(device, host)


# -- the search ---------------------------------------------------------------------------------------------------
@dataclass
class Attempt(Generic[T]):
    """One size of the search: what the estimate said, what was decided and, when tried, what happened."""

    size: T
    params: float
    estimate: MemoryEstimate
    decision: str = "not_reached"  # trained | failed | skip_device | skip_host | skip_time | not_reached
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0


@dataclass
class SearchOutcome(Generic[T]):
    attempts: list[Attempt[T]]
    stopped: str  # "exhausted" (the largest size trained), "failed", "time_cap", "estimate" (the rest skipped)

    @property
    def largest(self) -> Attempt[T] | None:
        trained = [a for a in self.attempts if a.decision == "trained"]
        return max(trained, key=lambda a: a.params) if trained else None

    @property
    def next_larger(self) -> Attempt[T] | None:
        """The smallest size above the largest trained one that did not train (the bracket's upper end)."""
        floor = self.largest.params if self.largest is not None else 0.0
        above = [a for a in self.attempts if a.params > floor and a.decision != "trained"]
        return min(above, key=lambda a: a.params) if above else None


def is_out_of_memory(err: BaseException) -> bool:
    """A device out-of-memory (or a refused page-lock of host memory): the size does not fit."""
    import torch

    from repro.zero.offload.pinned import PinningError

    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    if isinstance(err, (oom, PinningError, MemoryError)):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text.lower() or "ALLOC_FAILED" in text)


def search_largest(
    sizes: Sequence[T], *, params_of: Callable[[T], float], estimate: Callable[[T], MemoryEstimate],
    device_cap_bytes: float, host_available_bytes: Callable[[], float], try_size: Callable[[T], dict[str, Any]],
    time_cap_s: float, agree: Callable[[bool], bool] = lambda ok: ok, clock: Callable[[], float] = time.perf_counter,
    host_headroom: float = 0.9, on_attempt: Callable[[Attempt[T]], None] | None = None,
) -> SearchOutcome[T]:
    """Try ``sizes`` in increasing order of parameters; return every attempt.

    A size is tried when its estimate fits ``device_cap_bytes`` and ``host_headroom`` of the host memory available
    right now, and when the time left allows it (the last try's duration scaled by the parameter ratio). After the
    first failure (out of memory, a non-finite loss, any error) larger sizes are not tried. ``agree`` makes every
    rank of a multi-GPU search take the same decisions (logical AND over the ranks); it is called the same number
    of times on each rank. ``try_size`` returns the measurements of a successful try (with ``loss``) or raises.
    """
    import torch

    ordered = sorted(sizes, key=params_of)
    attempts = [Attempt(size, float(params_of(size)), estimate(size)) for size in ordered]
    start = clock()
    last = None  # (params, seconds) of the previous successful try
    for attempt in attempts:
        reason = ""
        if attempt.estimate.device_bytes > device_cap_bytes:
            reason = "skip_device"
        elif attempt.estimate.host_bytes > host_headroom * host_available_bytes():
            reason = "skip_host"
        elif clock() - start + (last[1] * attempt.params / last[0] if last else 0.0) > time_cap_s:
            reason = "skip_time"
        if not agree(not reason):  # every rank tries, or none does
            attempt.decision = reason or "skip_other_rank"
            if on_attempt is not None:
                on_attempt(attempt)
            continue
        t0 = clock()
        try:
            attempt.result = dict(try_size(attempt.size))
            loss = attempt.result.get("loss")
            ok = loss is not None and bool(torch.isfinite(torch.tensor(float(loss))))
            if not ok:
                attempt.error = f"non-finite loss {loss!r}"
        except Exception as err:  # noqa: BLE001 - a size that does not train is a result, not a crash
            ok = False
            kind = "out of memory" if is_out_of_memory(err) else "error"
            first_line = str(err).splitlines()[0][:300] if str(err) else ""
            attempt.error = f"{kind}: {type(err).__name__}: {first_line}"
        attempt.seconds = clock() - t0
        ok = agree(ok)
        attempt.decision = "trained" if ok else "failed"
        if on_attempt is not None:
            on_attempt(attempt)
        if not ok:
            break  # larger sizes would not fit either
        last = (attempt.params, max(attempt.seconds, 1e-9))
    return SearchOutcome(attempts, _stop_reason(attempts))


def _stop_reason(attempts: Sequence[Attempt]) -> str:
    decisions = [a.decision for a in attempts]
    if "failed" in decisions:
        return "failed"
    if "skip_time" in decisions:
        return "time_cap"
    if decisions and decisions[-1] == "trained":
        return "exhausted"
    return "estimate"
