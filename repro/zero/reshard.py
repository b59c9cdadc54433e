"""Re-shard a ZeRO optimizer's state for another data-parallel degree: pure functions on ``state_dict()``s.

ZeRO sec. 5: every bucket is a flat buffer padded to a multiple of N_d and cut into N_d equal shards; rank r holds
shard r of the fp32 master weights and of each optimizer state (Adam's exp_avg, exp_avg_sq). The buckets' extent
does not depend on N_d (stages 0-2 cut the parameter list greedily, stage 3 per module), so moving to N_d' only
re-cuts each bucket:

    old shards (N_d = 2)   | rank 0      | rank 1  pad |
    consolidated           | p0 p1 p2 ...             |        concatenate in dp order, drop the old padding
    new shards (N_d' = 3)  | rank 0  | rank 1  | r2 pad|       re-pad with zeros for N_d' (partition.py), slice

The padding is zero in a saved state (a padded element has a zero gradient, so Adam keeps it at zero), which
makes 2 -> 3 -> 2 reproduce the original shards exactly. Scalar states (Adam's step) are the same on every rank.
Stage 0 does not shard: its layout has one shard holding everything (``layout_world`` 1).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from repro.zero.partition import flat_layout


def _by_dp_rank(states: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    if not states:
        raise ValueError("reshard_states needs the state_dict() of every dp rank of the saved layout; got none")
    by_rank = {state["dp_rank"]: state for state in states}
    dp_size = states[0]["dp_size"]
    if len(by_rank) != len(states) or sorted(by_rank) != list(range(dp_size)) or any(
            state["dp_size"] != dp_size for state in states):
        raise ValueError(f"reshard_states needs one state per dp rank 0..{dp_size - 1} of one layout; got dp ranks "
                         f"{sorted(s['dp_rank'] for s in states)} of sizes {sorted({s['dp_size'] for s in states})}")
    counts = {len(state["buckets"]) for state in states}
    if len(counts) != 1:
        raise ValueError(f"the dp ranks' states have different bucket counts {sorted(counts)}")
    return by_rank


def _consolidate(pieces: list[torch.Tensor], numel: int) -> torch.Tensor:
    """The bucket's flat tensor without padding, from its shards in dp order (one piece: unsharded)."""
    flat = pieces[0].reshape(-1) if len(pieces) == 1 else torch.cat([p.reshape(-1) for p in pieces])
    if flat.numel() < numel:
        raise ValueError(f"the shards hold {flat.numel()} elements, fewer than the bucket's {numel}")
    return flat[:numel]


def _cut(full: torch.Tensor, numels: Sequence[int], world_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``full`` in a ``world_size`` layout (zero padding, as the optimizer creates it)."""
    layout = flat_layout(numels, world_size)
    padded = torch.zeros(layout.padded_numel, dtype=full.dtype)
    padded[:full.numel()] = full
    lo, hi = layout.shard_range(rank)
    return padded[lo:hi].clone()


def reshard_bucket(saved: Sequence[dict[str, Any]], *, new_world: int, new_rank: int) -> dict[str, Any]:
    """One bucket (``saved``: that bucket's entry of every old dp rank, in dp order) re-cut for ``new_world``."""
    first = saved[0]
    numels = list(first["numels"])
    old_world = first["layout_world"]
    for entry in saved:
        if list(entry["numels"]) != numels or entry["layout_world"] != old_world:
            raise ValueError(f"bucket {first['key']}: the dp ranks disagree on its layout")
    sources = saved[:old_world]  # unsharded (stage 0): every rank holds all of it; take the first
    numel = sum(numels)
    state = first["state"]

    def recut(get) -> torch.Tensor:
        return _cut(_consolidate([get(entry["state"]) for entry in sources], numel), numels, new_world, new_rank)

    new_state = {
        "master": recut(lambda s: s["master"]),
        "tensors": {name: recut(lambda s, name=name: s["tensors"][name]) for name in state["tensors"]},
        "scalars": {name: value.clone() if isinstance(value, torch.Tensor) else value
                    for name, value in state["scalars"].items()},
    }
    return {**{k: v for k, v in first.items() if k != "state"}, "layout_world": new_world, "layout_rank": new_rank,
            "state": new_state}


def reshard_states(
    states: Sequence[dict[str, Any]], *, new_dp_size: int, new_dp_rank: int, stage: int
) -> dict[str, Any]:
    """The ``state_dict()`` rank ``new_dp_rank`` of a ``new_dp_size`` data-parallel group at ``stage`` expects,
    from the ``state_dict()``s of every dp rank of the saved layout (any order; one model-parallel rank).

    ``stage`` is the loading optimizer's: stage 0 keeps whole buckets (one shard), stages 1-3 cut them into
    ``new_dp_size`` shards. Stages 0-2 share one bucket layout, so a state may move between them; stage 3 cuts
    buckets per module and loads only stage-3 states (the optimizer checks the bucket sizes when it loads).
    """
    if not isinstance(new_dp_size, int) or new_dp_size < 1:
        raise ValueError(f"new_dp_size={new_dp_size!r} must be a positive integer")
    if not isinstance(new_dp_rank, int) or not 0 <= new_dp_rank < new_dp_size:
        raise ValueError(f"new_dp_rank={new_dp_rank!r} must be in [0, new_dp_size={new_dp_size})")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r} must be one of 0, 1, 2, 3")
    by_rank = _by_dp_rank(states)
    ordered = [by_rank[rank] for rank in range(len(by_rank))]
    first = ordered[0]
    if (first["stage"] == 3) != (stage == 3):
        raise ValueError(f"a stage-{first['stage']} state cannot be loaded at stage {stage}: stage 3 cuts its "
                         "buckets per module, stages 0-2 across modules")
    new_world, new_rank = (1, 0) if stage == 0 else (new_dp_size, new_dp_rank)
    buckets = [reshard_bucket([state["buckets"][index] for state in ordered], new_world=new_world,
                              new_rank=new_rank)
               for index in range(len(first["buckets"]))]
    return {**{k: v for k, v in first.items() if k != "buckets"}, "stage": stage, "dp_rank": new_dp_rank,
            "dp_size": new_dp_size, "buckets": buckets}
