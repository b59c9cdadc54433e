"""The 3-D rank grid (tensor x data x pipeline) and the process groups cut from it.

MT-NLG sec. 2.4 / Megatron place tensor parallelism innermost, so that a tensor-parallel group is made of
consecutive ranks (the GPUs of one node, joined by NVLink), then data parallelism, then pipeline stages:

    rank = pp_rank * (tp * dp) + dp_rank * tp + tp_rank

:func:`rank_grid` is the pure arithmetic (tested without processes); :func:`init_parallel` turns it into
:class:`ParallelGroups`, a frozen value handed to every layer that communicates. There are no module globals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from repro.dist.comm import CommGroup, new_comm_group
from repro.dist.ledger import CollectiveLedger


@dataclass(frozen=True)
class GridCoord:
    tp_rank: int
    dp_rank: int
    pp_rank: int


@dataclass(frozen=True)
class RankGrid:
    """Pure description of how ``world_size = tp * dp * pp`` ranks are laid out."""

    tp: int
    dp: int
    pp: int

    def __post_init__(self) -> None:
        for name, value in (("tp", self.tp), ("dp", self.dp), ("pp", self.pp)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    def rank(self, coord: GridCoord) -> int:
        return coord.pp_rank * self.tp * self.dp + coord.dp_rank * self.tp + coord.tp_rank

    def coord(self, rank: int) -> GridCoord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")
        return GridCoord(rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp))

    def tp_groups(self) -> list[list[int]]:
        """Consecutive ranks: same (dp, pp), tp varying."""
        return [[self.rank(GridCoord(t, d, p)) for t in range(self.tp)] for p in range(self.pp) for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [[self.rank(GridCoord(t, d, p)) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)]

    def pp_groups(self) -> list[list[int]]:
        return [[self.rank(GridCoord(t, d, p)) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def embedding_groups(self) -> list[list[int]]:
        """First and last stage of each pipeline: they hold the tied input/output embedding (Megatron).
        Middle stages hold no embedding; each is a group of one, so every rank has an embedding group."""
        ends = [sorted({g[0], g[-1]}) for g in self.pp_groups()]
        middles = [[rank] for g in self.pp_groups() for rank in g[1:-1]]
        return ends + middles


def resolve_grid(world_size: int, *, tp: int = 1, pp: int = 1, dp: int | None = None) -> RankGrid:
    """Check ``world_size == tp * pp * dp`` (dp inferred when None) and return the grid."""
    for name, value in (("tp", tp), ("pp", pp)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if dp is None:
        if world_size % (tp * pp) != 0:
            raise ValueError(
                f"world size {world_size} is not divisible by tp * pp = {tp} * {pp} = {tp * pp}; "
                "the world must be tp x pp x dp ranks"
            )
        dp = world_size // (tp * pp)
    if tp * pp * dp != world_size:
        raise ValueError(
            f"world size {world_size} != tp * pp * dp = {tp} * {pp} * {dp} = {tp * pp * dp}; "
            "launch exactly tp x pp x dp ranks"
        )
    return RankGrid(tp=tp, dp=dp, pp=pp)


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's place in the grid and the groups it communicates over."""

    grid: RankGrid
    rank: int
    tp: CommGroup
    dp: CommGroup
    pp: CommGroup
    embedding: CommGroup
    world: CommGroup
    ledger: CollectiveLedger

    @property
    def world_size(self) -> int:
        return self.grid.world_size

    tp_size = property(lambda self: self.grid.tp)
    dp_size = property(lambda self: self.grid.dp)
    pp_size = property(lambda self: self.grid.pp)
    tp_rank = property(lambda self: self.tp.rank)
    dp_rank = property(lambda self: self.dp.rank)
    pp_rank = property(lambda self: self.pp.rank)


def _mine(name: str, all_ranks: list[list[int]], ledger: CollectiveLedger, timeout_s: float | None) -> CommGroup:
    """Create every group of a family (collective call on all ranks) and keep the one holding this rank."""
    mine = None
    for ranks in all_ranks:
        group = new_comm_group(name, ranks, ledger, timeout_s=timeout_s)
        if group.rank >= 0:
            mine = group
    if mine is None:  # pragma: no cover - a grid always covers every rank
        raise RuntimeError(f"rank {dist.get_rank()} is in no {name} group")
    return mine


def init_parallel(
    *, tp: int = 1, pp: int = 1, dp: int | None = None, ledger: CollectiveLedger | None = None,
    timeout_s: float | None = None,
) -> ParallelGroups:
    """Build the tensor/data/pipeline groups of the running job (torch.distributed must be initialised, or the
    job is a single process and every group is a group of one).

    ``timeout_s`` bounds every collective and receive over each group (default: the default group's timeout, as
    ``init_distributed(timeout_s=)`` set it), so a stuck peer fails the job instead of hanging it."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    grid = resolve_grid(world_size, tp=tp, pp=pp, dp=dp)
    ledger = ledger or CollectiveLedger()
    return ParallelGroups(
        grid=grid,
        rank=rank,
        tp=_mine("tp", grid.tp_groups(), ledger, timeout_s),
        dp=_mine("dp", grid.dp_groups(), ledger, timeout_s),
        pp=_mine("pp", grid.pp_groups(), ledger, timeout_s),
        embedding=_mine("embedding", grid.embedding_groups(), ledger, timeout_s),
        world=_mine("world", [list(range(world_size))], ledger, timeout_s),
        ledger=ledger,
    )
