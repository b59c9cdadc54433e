"""The GPU T3 simulates, and real GPUs beside it, as data (T3 sec. 5; secondary sources in paper_claims.csv).

T3's numbers come from Accel-Sim extended to several GPUs: 80 compute units (CUs) at 1.4 GHz, a 16 MB L2,
1 TB/s of HBM2, and a ring of links of 150 GB/s (bidirectional) with 500 ns latency. Settings the sources do not
give are chosen here once, with the reason, and used for every model and sublayer:

* ``link_bandwidth``: 75 GB/s per direction. "150 GB/s bidirectional" describes a link; a ring collective sends
  one way round the ring (T3's reduce-scatter figures show one ring), so a rank sends at half of it.
* ``gemm_tile``: 128 x 128 output tiles per CU (the usual macro tile of rocBLAS / CUTLASS fp16 kernels).
* ``element_bytes``: 2 (fp16 activations and partial sums).
* ``flops_per_cu_cycle``: **not stated** by the sources; it sets how long a GEMM takes against its collective.
  It is one of the three constants this model fits (``repro.overlap.t3sim.fit``); :data:`T3_GPU` carries a
  placeholder that the fit replaces (:func:`with_gemm_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from repro.perfmodel.hardware import DGX2H, DGX_A100, Cluster

MB = 2**20


@dataclass(frozen=True)
class T3Gpu:
    """One GPU of a tensor-parallel ring: compute units, L2, HBM and its ring links (SI units)."""

    name: str
    num_cus: int
    clock_hz: float
    l2_bytes: float
    hbm_bandwidth: float  # bytes/s
    link_bandwidth: float  # bytes/s a rank sends one way round the ring
    link_latency: float  # s per hop
    flops_per_cu_cycle: float  # dense 16-bit FLOPs one CU retires per cycle in a large GEMM
    gemm_tile: tuple[int, int] = (128, 128)
    element_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("num_cus", "clock_hz", "l2_bytes", "hbm_bandwidth", "link_bandwidth", "flops_per_cu_cycle"):
            if not getattr(self, name) > 0:
                raise ValueError(f"T3Gpu.{name} must be > 0, got {getattr(self, name)!r}")
        if self.link_latency < 0:
            raise ValueError(f"T3Gpu.link_latency must be >= 0 s, got {self.link_latency!r}")

    @property
    def cu_flops(self) -> float:
        """FLOP/s of one CU."""
        return self.flops_per_cu_cycle * self.clock_hz

    @property
    def peak_flops(self) -> float:
        return self.num_cus * self.cu_flops


#: T3's simulated GPU (T3 sec. 5 per T3-SEC1/2): the GEMM rate is a placeholder until fitted (module docstring).
T3_GPU = T3Gpu(name="T3 simulated GPU (Accel-Sim, 80 CUs)", num_cus=80, clock_hz=1.4e9, l2_bytes=16 * MB,
               hbm_bandwidth=1e12, link_bandwidth=75e9, link_latency=500e-9, flops_per_cu_cycle=1024.0)

#: The configuration rows of paper_claims.csv this GPU echoes: claim id -> value in the claim's unit.
CONFIGURATION = {
    "sim_cus": T3_GPU.num_cus, "sim_clock": T3_GPU.clock_hz / 1e9, "sim_l2": T3_GPU.l2_bytes / MB,
    "sim_hbm": T3_GPU.hbm_bandwidth / 1e12, "sim_link_bw": 2 * T3_GPU.link_bandwidth / 1e9,
    "sim_link_lat": T3_GPU.link_latency * 1e9,
}


def with_gemm_rate(gpu: T3Gpu, flops_per_cu_cycle: float) -> T3Gpu:
    return replace(gpu, flops_per_cu_cycle=flops_per_cu_cycle)


def from_cluster(cluster: Cluster, *, l2_bytes: float, clock_hz: float) -> T3Gpu:
    """A real GPU of the performance model's table (``repro.perfmodel.hardware``) in T3's terms: its SMs as CUs,
    its datasheet tensor peak spread over them, its intra-node link per direction."""
    device = cluster.device
    return T3Gpu(name=device.name, num_cus=device.num_sms, clock_hz=clock_hz, l2_bytes=l2_bytes,
                 hbm_bandwidth=device.memory_bandwidth, link_bandwidth=cluster.intra_node.bandwidth,
                 link_latency=cluster.intra_node.latency,
                 flops_per_cu_cycle=device.peak_flops / (device.num_sms * clock_hz),
                 gemm_tile=device.gemm_tile)


#: Real GPUs for comparison (datasheet L2 and boost clocks): V100 in a DGX-2H, A100 in a DGX A100.
REAL_GPUS = {
    "V100 (DGX-2H)": from_cluster(DGX2H, l2_bytes=6 * MB, clock_hz=1.53e9),
    "A100 (DGX A100)": from_cluster(DGX_A100, l2_bytes=40 * MB, clock_hz=1.41e9),
}
