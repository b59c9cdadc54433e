"""A GEMM on T3's GPU: output tiles spread over the CUs in waves, HBM traffic with L2 reuse.

``C[m x n] = A[m x k] @ B[k x n]`` is cut into ``gemm_tile`` output tiles; each CU computes one tile at a time,
so the tiles run in ``ceil(tiles / cus)`` waves and a partial last wave leaves CUs idle (wave quantization). A
tile takes ``2 tile_m tile_n k / cu_flops`` seconds whether or not it is full.

HBM traffic: an operand that fits in half the L2 is read from HBM once (the other half holds the streamed
operand); otherwise every wave reads the row panels of A and column panels of B its tiles touch once, shared
through the L2 by the wave's tiles (tiles are issued in row-major order of the tile grid). C is written once.

Time is the larger of compute and memory (the kernel overlaps its loads with its math):
``max(waves x tile_time, (reads + writes) / hbm_bandwidth)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import T3Gpu


@dataclass(frozen=True)
class GemmCost:
    """Seconds and HBM bytes of one GEMM."""

    compute_s: float
    read_bytes: float
    write_bytes: float
    waves: int
    tiles: int
    hbm_bandwidth: float

    @property
    def memory_s(self) -> float:
        return (self.read_bytes + self.write_bytes) / self.hbm_bandwidth

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def hbm_bytes(self) -> float:
        return self.read_bytes + self.write_bytes


def gemm_cost(gpu: T3Gpu, *, m: int, n: int, k: int, batch: int = 1, cus: int | None = None) -> GemmCost:
    """Cost of ``batch`` GEMMs ``[m x k] @ [k x n]`` on ``cus`` CUs of ``gpu`` (all of them by default)."""
    cus = gpu.num_cus if cus is None else cus
    if min(m, n, k, batch) < 1 or not 1 <= cus <= gpu.num_cus:
        raise ValueError(f"need m, n, k, batch >= 1 and 1 <= cus <= {gpu.num_cus}; got m={m} n={n} k={k} "
                         f"batch={batch} cus={cus}")
    tile_m, tile_n = gpu.gemm_tile
    grid_m, grid_n = math.ceil(m / tile_m), math.ceil(n / tile_n)
    tiles = batch * grid_m * grid_n
    waves = math.ceil(tiles / cus)
    tile_s = 2.0 * tile_m * tile_n * k / gpu.cu_flops
    e = gpu.element_bytes
    a_bytes, b_bytes = m * k * e, k * n * e
    half_l2 = gpu.l2_bytes / 2
    reads = 0.0
    if a_bytes <= half_l2 and b_bytes <= half_l2:
        reads = batch * (a_bytes + b_bytes)
    else:
        for wave in range(waves):  # tiles first..last of the row-major tile grid (batch entries stacked)
            first, last = wave * cus, min(tiles, (wave + 1) * cus) - 1
            rows, cols = last // grid_n - first // grid_n + 1, min(grid_n, last - first + 1)
            reads += 0.0 if a_bytes <= half_l2 else rows * tile_m * k * e
            reads += 0.0 if b_bytes <= half_l2 else cols * tile_n * k * e
        reads += batch * sum(x for x in (a_bytes, b_bytes) if x <= half_l2)
    return GemmCost(compute_s=waves * tile_s, read_bytes=reads, write_bytes=batch * m * n * e, waves=waves,
                    tiles=tiles, hbm_bandwidth=gpu.hbm_bandwidth)
