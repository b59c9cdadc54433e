"""Time of one kernel on one accelerator: the roofline model plus a launch-overhead floor.

``time = max(flops / (gemm_eff * wave_eff * peak), bytes / (memory_eff * bandwidth)) + launches * overhead``

plus, on CPUs, the measured cost of random numbers (dropout) and transcendental functions (GELU, exp), which are
compute-bound there; a GEMM whose shape was measured on the device (``Accelerator.measured_gemm_flops``) takes its
measured rate instead of the roofline.

(Williams, Waterman & Patterson 2009). A GEMM with low arithmetic intensity (small ``k`` or ``n`` per
tensor-parallel rank) becomes memory-bound; a GEMM whose output tiles do not fill the last wave of SMs loses
``wave_eff`` (NVIDIA's "Matrix Multiplication Background" guide: tile and wave quantization).
"""

from __future__ import annotations

import math
from typing import Iterable

from .hardware import Accelerator, Efficiency
from .ops import Op


def wave_efficiency(op: Op, device: Accelerator) -> float:
    """Useful fraction of the SM-tile slots a GEMM occupies: output ``batch x m x n`` cut into
    ``gemm_tile`` tiles, run in ``ceil(tiles / num_sms)`` waves. 1.0 for non-GEMMs and unquantized devices."""
    if op.gemm_shape is None:
        return 1.0
    m, n, _, batch = op.gemm_shape
    tile_m, tile_n = device.gemm_tile
    tiles = batch * math.ceil(m / tile_m) * math.ceil(n / tile_n)
    waves = math.ceil(tiles / device.num_sms)
    return (batch * m * n) / (waves * device.num_sms * tile_m * tile_n)


def op_time(op: Op, device: Accelerator, efficiency: Efficiency) -> float:
    """Seconds one kernel takes on ``device`` at the achieved fractions in ``efficiency``."""
    measured = device.gemm_flops(op.gemm_shape) if op.gemm_shape is not None else None
    if measured is not None:  # a measured kernel (CPUs): its rate already includes its memory traffic
        return op.flops / measured + op.launches * efficiency.kernel_overhead
    compute = op.flops / (efficiency.gemm * wave_efficiency(op, device) * device.peak_flops)
    memory = op.bytes / (efficiency.memory * device.memory_bandwidth)
    special = op.random_elements * device.rng_seconds_per_element + op.math_elements * device.math_seconds_per_element
    return max(compute, memory) + special + op.launches * efficiency.kernel_overhead


def ops_time(ops: Iterable[Op], device: Accelerator, efficiency: Efficiency) -> float:
    """Sum of :func:`op_time` over kernels that run one after another."""
    return sum(op_time(op, device, efficiency) for op in ops)
