"""Communication groups as values, and the collectives the layers call through them.

A :class:`CommGroup` bundles a torch ProcessGroup with its name, its members and the ledger that counts what is
sent through it. Every layer, optimizer and schedule receives the CommGroup it communicates over as an argument;
there is no module-level state (DESIGN.md: "process groups are values").
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

from repro.dist.ledger import CollectiveLedger
from repro.environment import gloo_chunk_bytes

# torch 2.13 renamed the tensor-in/tensor-out collectives (*_single); older releases (>= 2.4) have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class CommGroup:
    """A named process group. ``process_group`` is None for a group of one (nothing is ever sent)."""

    name: str
    ranks: tuple[int, ...]
    rank: int  # this process's index inside the group
    process_group: dist.ProcessGroup | None = field(default=None, compare=False)
    ledger: CollectiveLedger = field(default_factory=CollectiveLedger, compare=False, repr=False)
    #: how long a collective or receive over this group waits for the other ranks before it raises (seconds);
    #: None: torch's default (a group of one outside a job)
    timeout_s: float | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @classmethod
    def single(cls, name: str = "single", ledger: CollectiveLedger | None = None) -> "CommGroup":
        """A group holding only this process (tp=1 and friends)."""
        return cls(name=name, ranks=(0,), rank=0, process_group=None, ledger=ledger or CollectiveLedger())

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]


def group_device(group: CommGroup) -> torch.device:
    """The device a tensor handed to a collective over ``group`` must be on: the rank's current GPU when the
    group's backend is nccl, the CPU under gloo or outside a distributed job. For control tensors (flags, timings,
    agreements) made where no compute device is at hand; nccl rejects CPU tensors."""
    if not dist.is_initialized():
        return torch.device("cpu")
    from repro.dist.launch import device_for

    return device_for(dist.get_backend(group.process_group))


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _record(group: CommGroup, kind: str, nbytes: int) -> None:
    if torch.compiler.is_compiling():  # a compiled region: dynamo traces it once, so per-call counts are not kept
        return
    group.ledger.record(kind, group.name, group.size, nbytes)


def all_reduce(tensor: torch.Tensor, group: CommGroup, *, op=dist.ReduceOp.SUM, async_op: bool = False):
    """In-place all-reduce over ``group``; a no-op on a group of one."""
    if group.size == 1:
        return None
    _record(group, "all_reduce", _nbytes(tensor))
    return dist.all_reduce(tensor, op=op, group=group.process_group, async_op=async_op)


#: gloo's TCP transport moves a large collective about twice as fast in pieces of a few MiB as in one call (this
#: machine, 2 ranks, one thread each: an all-gather of 256 MiB ran at 0.8 GB/s whole and 1.5-1.6 GB/s as pieces of
#: 4-8 MiB per rank; a reduce-scatter at 0.6 whole and 0.8-0.9 in pieces). So over gloo, a collective whose
#: per-rank piece exceeds this many bytes is issued as consecutive pieces, where the result is the same: always
#: for an all-gather (a copy); for a reduce-scatter only over two ranks (a + b in any order), as gloo picks its
#: summation order by message size and more ranks' sums would change in the last bits (measured with 4).
#: NCCL pipelines internally: nothing changes there.
#: ``REPRO_GLOO_CHUNK_BYTES=0`` turns it off (to compare); a value that breaks its rule (:mod:`repro.environment`)
#: gives the default here and is refused by the entry points before any work.
GLOO_CHUNK_BYTES = gloo_chunk_bytes(strict=False)


class _Pieces:
    """The handles of a collective issued in pieces: ``wait()`` waits for every piece."""

    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        return True


def _piece_bounds(group: CommGroup, shard: torch.Tensor) -> list[tuple[int, int]] | None:
    """Element ranges of the per-rank piece to issue one at a time, or None for one call (not gloo, small, or
    not contiguous)."""
    if GLOO_CHUNK_BYTES <= 0 or _nbytes(shard) <= GLOO_CHUNK_BYTES or not shard.is_contiguous():
        return None
    if dist.get_backend(group.process_group) != "gloo":
        return None
    step = max(1, GLOO_CHUNK_BYTES // shard.element_size())
    return [(lo, min(lo + step, shard.numel())) for lo in range(0, shard.numel(), step)]


def all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor, group: CommGroup, *, async_op: bool = False):
    """Gather equal shards along dim 0 into ``output`` (size = group.size x shard)."""
    if group.size == 1:
        output.copy_(tensor)
        return None
    _record(group, "all_gather", _nbytes(output))
    bounds = _piece_bounds(group, tensor) if output.is_contiguous() else None
    if bounds is None:
        return _all_gather_single(output, tensor, group=group.process_group, async_op=async_op)
    shard, full, n = tensor.reshape(-1), output.reshape(-1), tensor.numel()
    works = [dist.all_gather([full[r * n + lo: r * n + hi] for r in range(group.size)], shard[lo:hi],
                             group=group.process_group, async_op=async_op) for lo, hi in bounds]
    return _Pieces(works) if async_op else None


def reduce_scatter_tensor(
    output: torch.Tensor, tensor: torch.Tensor, group: CommGroup, *, op=dist.ReduceOp.SUM, async_op: bool = False
):
    """Sum ``tensor`` across the group and keep this rank's dim-0 shard in ``output``."""
    if group.size == 1:
        output.copy_(tensor)
        return None
    _record(group, "reduce_scatter", _nbytes(tensor))
    bounds = _piece_bounds(group, output) if tensor.is_contiguous() and group.size == 2 else None
    if bounds is None:
        return _reduce_scatter_single(output, tensor, op=op, group=group.process_group, async_op=async_op)
    shard, full, n = output.reshape(-1), tensor.reshape(-1), output.numel()
    works = [_reduce_scatter_piece(shard[lo:hi], [full[r * n + lo: r * n + hi] for r in range(group.size)], op,
                                   group, async_op) for lo, hi in bounds]
    return _Pieces(works) if async_op else None


#: Whether gloo has the list form of reduce_scatter (torch < 2.8's does not; learnt at the first piece).
_LIST_REDUCE_SCATTER = [True]


def _reduce_scatter_piece(out: torch.Tensor, parts: list[torch.Tensor], op, group: CommGroup, async_op: bool):
    """One piece: each rank's slice of this piece reduced into ``out``. The list form reads the slices in place;
    where gloo lacks it, the slices are copied into one tensor for the tensor form (same sums, one copy more)."""
    if _LIST_REDUCE_SCATTER[0]:
        try:
            return dist.reduce_scatter(out, parts, op=op, group=group.process_group, async_op=async_op)
        except RuntimeError as err:
            if "does not support" not in str(err) and "not supported" not in str(err):
                raise
            _LIST_REDUCE_SCATTER[0] = False
    return _reduce_scatter_single(out, torch.cat(parts), op=op, group=group.process_group, async_op=async_op)


def broadcast(tensor: torch.Tensor, group: CommGroup, *, src_group_rank: int = 0, async_op: bool = False):
    if group.size == 1:
        return None
    _record(group, "broadcast", _nbytes(tensor))
    return dist.broadcast(tensor, src=group.global_rank(src_group_rank), group=group.process_group, async_op=async_op)


def all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, group: CommGroup, *, async_op: bool = False):
    if group.size == 1:
        output.copy_(tensor)
        return None
    _record(group, "all_to_all", _nbytes(tensor))
    return dist.all_to_all_single(output, tensor, group=group.process_group, async_op=async_op)


def send(tensor: torch.Tensor, group: CommGroup, dst_group_rank: int) -> None:
    _record(group, "send", _nbytes(tensor))
    dist.send(tensor, dst=group.global_rank(dst_group_rank), group=group.process_group)


def recv(tensor: torch.Tensor, group: CommGroup, src_group_rank: int) -> None:
    _record(group, "recv", _nbytes(tensor))
    dist.recv(tensor, src=group.global_rank(src_group_rank), group=group.process_group)


def isend(tensor: torch.Tensor, group: CommGroup, dst_group_rank: int):
    _record(group, "send", _nbytes(tensor))
    return dist.isend(tensor, dst=group.global_rank(dst_group_rank), group=group.process_group)


def irecv(tensor: torch.Tensor, group: CommGroup, src_group_rank: int):
    _record(group, "recv", _nbytes(tensor))
    return dist.irecv(tensor, src=group.global_rank(src_group_rank), group=group.process_group)


def barrier(group: CommGroup) -> None:
    if group.size > 1:
        dist.barrier(group=group.process_group)


def default_timeout_s() -> float | None:
    """The default process group's timeout in seconds (``init_distributed(timeout_s=)``), or None outside a job or
    where torch does not expose it (read from the group's backend options: torch 2.4 to 2.13 at least)."""
    if not dist.is_initialized():
        return None
    device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
    try:
        timeout = dist.distributed_c10d._get_default_group()._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        return None
    return timeout.total_seconds() if isinstance(timeout, _dt.timedelta) else None


def new_comm_group(
    name: str, ranks: Sequence[int], ledger: CollectiveLedger, *, timeout_s: float | None = None
) -> CommGroup:
    """Create a CommGroup on every process (torch requires all ranks to call new_group for every group).

    ``timeout_s`` bounds every collective and receive over the group; None takes the default group's timeout
    (torch's ``new_group`` would otherwise wait its own default, 30 minutes under gloo, whatever
    ``init_distributed`` was given). Returns a group whose ``rank`` is -1 when this process is not a member;
    callers keep only their own groups.
    """
    ranks = tuple(int(r) for r in ranks)
    my_rank = dist.get_rank() if dist.is_initialized() else 0
    timeout_s = timeout_s if timeout_s is not None else default_timeout_s()
    if len(ranks) == 1:
        return CommGroup(name, ranks, 0 if my_rank == ranks[0] else -1, None, ledger, timeout_s)
    timeout = None if timeout_s is None else _dt.timedelta(seconds=timeout_s)
    process_group = dist.new_group(list(ranks), timeout=timeout)
    index = ranks.index(my_rank) if my_rank in ranks else -1
    return CommGroup(name, ranks, index, process_group, ledger, timeout_s)
