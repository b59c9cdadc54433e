"""The problems the GNA CPU benchmark times (:mod:`repro.gna.benchmark`, the ``gna_speedup`` experiment): token grid,
spec, heads. Data only, without torch, so that the experiment's points are declared (``repro list``, Slurm's planning
step) without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from repro.gna.spec import GNASpec


@dataclass(frozen=True)
class BenchConfig:
    """One problem: token grid, GNA spec, heads and head_dim (128, as in FLUX / HunyuanVideo / Cosmos)."""

    name: str
    grid: tuple[int, ...]
    spec: GNASpec
    heads: int = 2
    head_dim: int = 128
    batch: int = 1


# Shaped like the paper's use cases, scaled to a 2-core CPU (GNA §4: FLUX 2-D, HunyuanVideo / Cosmos 3-D).
PAPER_SHAPED = (
    BenchConfig("2d_64x64_w24x48_s8x16", (64, 64), GNASpec((24, 48), stride=(8, 16))),
    BenchConfig("1d_8192_w512_s256", (8192,), GNASpec(512, stride=256)),
    BenchConfig("3d_8x32x32_w4x16x24_s4x8x8", (8, 32, 32), GNASpec((4, 16, 24), stride=(4, 8, 8))),
    BenchConfig("2d_64x64_w24x48_s1_na", (64, 64), GNASpec((24, 48))),
)
# Small versions for CI.
SMALL = (
    BenchConfig("2d_32x32_w12x16_s4x8", (32, 32), GNASpec((12, 16), stride=(4, 8)), head_dim=64),
    BenchConfig("1d_2048_w256_s128", (2048,), GNASpec(256, stride=128), head_dim=64),
)
