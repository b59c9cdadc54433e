"""Random GNA configurations shared by the GNA tests (fixed seeds; small grids so the dense reference is cheap)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from repro.gna.spec import GNASpec


@dataclass(frozen=True)
class Case:
    grid: tuple[int, ...]
    spec: GNASpec
    q_tile: tuple[int, ...]
    kv_tile: tuple[int, ...]
    batch: int
    heads: int
    head_dim: int

    def __str__(self) -> str:
        s = self.spec
        return (
            f"grid={self.grid} w={s.window} s={s.stride} d={s.dilation} c={tuple(int(c) for c in s.causal)} "
            f"tq={self.q_tile} tk={self.kv_tile}"
        )


_MAX_EXTENT = {1: 40, 2: 11, 3: 6}


def random_case(rng: random.Random, ndim: int) -> Case:
    """One configuration: odd and even windows, strides, dilation, causal dims, tiles that need not divide the grid."""
    window, stride, dilation, causal, grid, q_tile, kv_tile = [], [], [], [], [], [], []
    for _ in range(ndim):
        d = rng.choice([1, 1, 1, 2, 3]) if ndim < 3 else rng.choice([1, 1, 2])
        w = rng.randint(1, max(1, _MAX_EXTENT[ndim] // d))
        n = rng.randint(w * d, max(w * d, _MAX_EXTENT[ndim]))
        window.append(w)
        dilation.append(d)
        stride.append(rng.randint(1, w))
        causal.append(rng.random() < 0.25)
        grid.append(n)
        q_tile.append(rng.randint(1, min(n, 8)))
        kv_tile.append(rng.randint(1, min(n, 8)))
    spec = GNASpec(tuple(window), tuple(stride), tuple(dilation), tuple(causal))
    return Case(
        tuple(grid), spec, tuple(q_tile), tuple(kv_tile), rng.randint(1, 2), rng.randint(1, 2), rng.choice([4, 8])
    )


def random_cases(count: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    return [random_case(rng, 1 + i % 3) for i in range(count)]


def gna_claims() -> dict[str, str]:
    """claim_id -> value text of the gna_2025 rows of paper_claims.csv."""
    import csv

    from repro.testing import paper_claims_file

    path = paper_claims_file()
    with open(path, newline="") as handle:
        return {row["claim_id"]: row["value"] for row in csv.DictReader(handle) if row["paper"] == "gna_2025"}
