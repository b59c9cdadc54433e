"""Stage 3's parameter units: what one module owns, gathered just in time and released after use.

ZeRO sec. 5.3: with P_p each rank stores 1/N_d of the parameters; before a module runs forward (and again before
its backward) its parameters are all-gathered from their owners, and they are freed as soon as the module is done.
A *unit* is one module's directly-owned parameters (one bucket per parameter group). Gathering is asynchronous,
so the next unit can be gathered while this one computes: :class:`PrefetchTrace` records the order units are
needed in during the first step and replays it afterwards (ZeRO-Infinity sec. 6.2 prefetches the same way:
the all-gather of operator i+1 and the NVMe read of operator i+2 are issued while operator i runs).

On a GPU the copies from the parameter tier and the all-gathers are issued on a side stream, which first waits
for the compute stream (the step may just have written the shards); the compute stream waits for a unit's event
before using it, and every gathered buffer is marked as used by the compute stream (``record_stream``) so that the
caching allocator does not hand its memory to the side stream again before the computation that reads it is done.
On the CPU there are no streams and the same calls run in order, and a released full buffer is reused by the next
gather of its size (``gather_buffers.py``) instead of being unmapped and faulted in again.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.zero.buckets import Bucket
from repro.zero.gather_buffers import GatherBufferPool
from repro.zero.ledger import TransientTracker, tensor_bytes
from repro.zero.offload.tiers import Tier


def param_key(bucket: Bucket) -> str:
    return f"{bucket.key}.param"


@dataclass(eq=False)
class ParamUnit:
    index: int
    module: nn.Module
    buckets: list[Bucket]
    refcount: int = 0
    gathered: bool = False
    in_backward: bool = False
    reduced: set[int] = field(default_factory=set)  # buckets whose gradients left for their owners this backward
    inflight: list[tuple[Bucket, torch.Tensor, torch.Tensor, Any]] = field(default_factory=list)
    ready: Any = None  # CUDA event recorded on the side stream after the unit's copies were issued

    @property
    def numel(self) -> int:
        return sum(b.layout.numel for b in self.buckets)


def released_placeholder(param: nn.Parameter) -> torch.Tensor:
    return torch.empty(0, dtype=param.dtype, device=param.device)


class UnitGatherer:
    """All-gathers a unit's shards from the parameter tier into full buffers, and frees them again.

    ``max_ahead_numel`` (DeepSpeed's ``stage3_prefetch_bucket_size``, "the size of the fixed buffer for
    prefetching parameters"): at most this many parameter elements are gathered or read from the tier ahead of
    their use; None leaves only the trace's depth as a bound. ``ahead`` holds the units prefetched and not yet
    needed (index -> elements), ``peak_ahead_numel`` the most elements it ever held.
    """

    def __init__(
        self, *, dp_group: CommGroup, param_tier: Tier, dtype: torch.dtype, device: torch.device,
        transient: TransientTracker, max_ahead_numel: int | None = None,
    ) -> None:
        self.dp_group, self.param_tier = dp_group, param_tier
        self.dtype, self.device, self.transient = dtype, torch.device(device), transient
        self.gathers = 0
        self.stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        self.max_ahead_numel = max_ahead_numel
        self.ahead: dict[int, int] = {}
        self.peak_ahead_numel = 0
        # on the CPU released full buffers are reused by the next gather of the same size (gather_buffers.py)
        self.pool = GatherBufferPool(dtype=dtype, device=self.device) if self.device.type == "cpu" else None

    @property
    def ahead_numel(self) -> int:
        return sum(self.ahead.values())

    def need(self, unit: ParamUnit, upcoming: Sequence[ParamUnit] = ()) -> None:
        """Make ``unit`` usable now; while its gather runs, prefetch ``upcoming`` (the units that come next)."""
        self.ahead.pop(unit.index, None)
        self.start(unit)
        self.prefetch(upcoming)
        self.wait(unit)

    def prefetch(self, upcoming: Sequence[ParamUnit]) -> None:
        """Gather the first of ``upcoming`` and read the others ahead from the tier (ZeRO-Infinity sec. 6.2), in
        order, stopping at the first unit that would take the elements held ahead past ``max_ahead_numel``."""
        for position, unit in enumerate(upcoming):
            if unit.index in self.ahead or unit.gathered or unit.inflight:  # already counted, or in use
                if position == 0 and unit.index in self.ahead:
                    self.start(unit)  # read ahead last time: its elements are counted already
                continue
            if self.max_ahead_numel is not None and self.ahead_numel + unit.numel > self.max_ahead_numel:
                break
            if position == 0:
                self.start(unit)
            else:
                self.read_ahead(unit)
            self.ahead[unit.index] = unit.numel
        self.peak_ahead_numel = max(self.peak_ahead_numel, self.ahead_numel)

    def _side_stream(self):
        """The context the unit's copies are issued in: the side stream on a GPU, nothing on the CPU."""
        if self.stream is None:
            return contextlib.nullcontext()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.stream)

    def read_ahead(self, unit: ParamUnit) -> None:
        """Start reading the unit's shards from a slow tier (no communication)."""
        if not unit.gathered and not unit.inflight:
            for bucket in unit.buckets:
                self.param_tier.prefetch(param_key(bucket))

    def start(self, unit: ParamUnit) -> None:
        """Issue the unit's all-gathers (asynchronous)."""
        if unit.gathered or unit.inflight:
            return
        with self._side_stream():
            for bucket in unit.buckets:
                stored = self.param_tier.fetch(param_key(bucket))
                shard = stored.to(self.device, non_blocking=stored.device.type == "cpu" and stored.is_pinned())
                if self.pool is not None:
                    full = self.pool.take(bucket.layout.padded_numel)
                else:
                    full = torch.empty(bucket.layout.padded_numel, dtype=self.dtype, device=self.device)
                self.transient.add("working_params", tensor_bytes(full))
                work = comm.all_gather_into_tensor(full, shard, self.dp_group, async_op=True)
                unit.inflight.append((bucket, full, shard, work))
            if self.stream is not None:
                unit.ready = torch.cuda.Event()
                unit.ready.record(self.stream)
        self.gathers += 1

    def wait(self, unit: ParamUnit) -> None:
        """Make the unit's parameters usable: views of the gathered buffers."""
        if unit.gathered:
            return
        self.start(unit)
        compute = torch.cuda.current_stream(self.device) if self.stream is not None else None
        if compute is not None:
            compute.wait_event(unit.ready)
            unit.ready = None
        for bucket, full, _shard, work in unit.inflight:
            if work is not None:
                work.wait()  # nccl: the compute stream waits for the collective
            if compute is not None:
                full.record_stream(compute)
            self.param_tier.release(param_key(bucket))
            bucket.flat_param = full
            for index, param in enumerate(bucket.params):
                param.data = bucket.param_view(full, index)
        unit.inflight.clear()
        unit.gathered = True

    def release(self, unit: ParamUnit) -> None:
        """Free the full parameters (ZeRO sec. 5.3: "discarded once the forward/backward of the layer is done")."""
        if unit.inflight:
            self.wait(unit)
        self.ahead.pop(unit.index, None)
        for bucket in unit.buckets:
            for param in bucket.params:
                param.data = released_placeholder(param)
            if bucket.flat_param is not None:
                full, bucket.flat_param = bucket.flat_param, None
                self.transient.remove("working_params", tensor_bytes(full))
                if self.pool is not None:
                    self.pool.give(full)  # kept only if no view of it is left
        unit.gathered = False
        unit.refcount = 0
        unit.in_backward = False
        unit.reduced.clear()


class PrefetchTrace:
    """The sequence of unit indices needed during the first step; replayed to say which units come next."""

    def __init__(self, depth: int = 2) -> None:
        self.order: list[int] = []
        self.recording = True
        self.position = 0
        self.depth = depth

    def need(self, index: int) -> list[int]:
        """Record (first step) or follow (later steps) the use of unit ``index``; return the next ``depth`` units."""
        if self.recording:
            self.order.append(index)
            return []
        if self.position < len(self.order) and self.order[self.position] == index:
            self.position += 1
        else:  # the model took another path: resynchronise on the next occurrence, if any
            try:
                self.position = self.order.index(index, self.position) + 1
            except ValueError:
                return []
        return self.order[self.position: self.position + self.depth]

    def end_step(self) -> None:
        if self.order:
            self.recording = False
        self.position = 0
