"""Hardware described as data: accelerators, links and clusters for the performance model.

Every number here is either a datasheet / paper value (named in the field's docstring) or an explicitly named
fitted constant. Fitted constants never live here: they live in :class:`Efficiency` instances returned by the
calibration functions (``repro.perfmodel.megatron.calibrate_v100``, ``repro.perfmodel.mtnlg.calibrate_a100``,
``repro.perfmodel.cpu.calibrate_cpu``), which say what they were fitted on.

Units are SI: FLOP/s, bytes/s, seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Accelerator:
    """One device.

    ``peak_flops``: dense 16-bit (tensor-core) peak, FLOP/s.
    ``memory_bandwidth``: HBM (or DRAM) bandwidth, bytes/s.
    ``memory_bytes``: device memory capacity.
    ``num_sms`` / ``gemm_tile``: streaming multiprocessors and the (rows, cols) output tile of the GEMM kernel,
    for wave quantization (a GEMM whose tiles do not fill the last wave leaves SMs idle). ``num_sms = 1`` and
    ``gemm_tile = (1, 1)`` switch quantization off (CPUs).
    ``rng_seconds_per_element``: seconds per random number drawn (dropout masks), measured on CPUs.
    ``math_seconds_per_element``: seconds per element of a transcendental element-wise function (GELU's erf,
    softmax's exp), measured on CPUs, where they are compute-bound; ~0 on GPUs (hidden under memory traffic).
    ``measured_gemm_flops``: ``((m, n, k, batch), FLOP/s)`` pairs measured on this device (CPUs: small GEMMs run far
    below peak, and how far depends on the shape); a listed GEMM shape uses its measured rate instead of
    ``peak_flops`` times the efficiency.
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float
    num_sms: int = 1
    gemm_tile: tuple[int, int] = (1, 1)
    rng_seconds_per_element: float = 0.0  # cost of one random number (dropout); GPUs fuse Philox: ~0
    math_seconds_per_element: float = 0.0
    measured_gemm_flops: tuple[tuple[tuple[int, int, int, int], float], ...] = ()

    def gemm_flops(self, shape: tuple[int, int, int, int]) -> float | None:
        """Measured FLOP/s of a GEMM of ``shape`` (m, n, k, batch), or None if it was not measured."""
        return dict(self.measured_gemm_flops).get(tuple(shape))

    def __post_init__(self) -> None:
        for field_name in ("peak_flops", "memory_bandwidth", "memory_bytes"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"Accelerator.{field_name} must be > 0, got {getattr(self, field_name)!r}")


@dataclass(frozen=True)
class Link:
    """A class of links used by collectives, in the alpha-beta model: a message of n bytes over one hop costs
    ``latency + n / bandwidth``. ``bandwidth`` is per device and per direction (bytes/s)."""

    name: str
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if self.bandwidth <= 0:
            raise ValueError(f"Link.bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if self.latency < 0:
            raise ValueError(f"Link.latency must be >= 0 s, got {self.latency!r}")


@dataclass(frozen=True)
class Cluster:
    """Nodes of ``devices_per_node`` accelerators joined by ``intra_node`` links (per device) and ``inter_node``
    links (``inter_node.bandwidth`` is the whole node's injection bandwidth, shared by its devices)."""

    name: str
    device: Accelerator
    devices_per_node: int
    intra_node: Link
    inter_node: Link
    num_nodes: int = 1

    def __post_init__(self) -> None:
        if self.devices_per_node < 1:
            raise ValueError(f"Cluster.devices_per_node must be >= 1, got {self.devices_per_node}")
        if self.num_nodes < 1:
            raise ValueError(f"Cluster.num_nodes must be >= 1, got {self.num_nodes}")

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

    def with_nodes(self, num_nodes: int) -> "Cluster":
        return replace(self, num_nodes=num_nodes)


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the datasheet numbers. Each is either *fitted* (the calibration that produced it says
    on which paper point) or *assumed* (a documented typical value); ``fitted_on`` records which.

    ``gemm``: fraction of ``peak_flops`` a large GEMM reaches.
    ``memory``: fraction of ``memory_bandwidth`` an element-wise kernel reaches.
    ``kernel_overhead``: fixed seconds per kernel launch (latency floor of small ops).
    ``intra_link`` / ``inter_link``: fraction of the link bandwidth a large collective reaches (NCCL "bus
    bandwidth" / link bandwidth).
    ``straggler_sigma``: relative standard deviation of one device's step time. A synchronous step waits for the
    slowest of N devices, ``E[max] ~ mean (1 + sigma sqrt(2 ln N))`` for Gaussian jitter (the straggler effect of
    synchronous SGD, Chen et al. 2016, "Revisiting distributed synchronous SGD").
    """

    gemm: float
    memory: float = 0.8
    kernel_overhead: float = 5e-6
    intra_link: float = 0.8
    inter_link: float = 0.8
    straggler_sigma: float = 0.0
    fitted_on: str = "assumed"

    def __post_init__(self) -> None:
        for field_name in ("gemm", "memory", "intra_link", "inter_link"):
            value = getattr(self, field_name)
            if not 0 < value <= 1:
                raise ValueError(f"Efficiency.{field_name} must be in (0, 1], got {value!r}")
        if self.straggler_sigma < 0:
            raise ValueError(f"Efficiency.straggler_sigma must be >= 0, got {self.straggler_sigma!r}")
        if self.kernel_overhead < 0:
            raise ValueError(f"Efficiency.kernel_overhead must be >= 0 s, got {self.kernel_overhead!r}")


# --- Presets -------------------------------------------------------------------------------------------------

#: NVIDIA V100 SXM3 32GB as in the DGX-2H. Megatron-LM sec 1/5.1: 39 TFLOP/s is 30 % of peak -> 130 TFLOP/s
#: (the 450 W DGX-2H part clocks above the 125 TFLOP/s of the standard V100). HBM2: 900 GB/s, 32 GB, 80 SMs.
#: GEMM tile 256x128: cuBLAS's large fp16 Volta kernels (``volta_h884gemm_256x128_*``).
V100_SXM3_32GB = Accelerator(name="V100-SXM3-32GB", peak_flops=130e12, memory_bandwidth=900 * GB,
                             memory_bytes=32 * GB, num_sms=80, gemm_tile=(256, 128))

#: NVIDIA A100 SXM4 80GB (MT-NLG sec 2.4, DGX A100 in Selene): 312 TFLOP/s bf16/fp16 dense, HBM2e 2039 GB/s,
#: 108 SMs; GEMM tile 256x128 (cuBLAS ``ampere_*_256x128_*``).
A100_SXM4_80GB = Accelerator(name="A100-SXM4-80GB", peak_flops=312e12, memory_bandwidth=2039 * GB,
                             memory_bytes=80 * GB, num_sms=108, gemm_tile=(256, 128))

#: DGX-2H: 16 V100 per node; NVSwitch 300 GB/s per GPU (Megatron sec 5: bidirectional, so 150 GB/s per
#: direction); 8 InfiniBand EDR 100 Gb/s adapters per node = 100 GB/s (Megatron sec 5; 800 Gb/s, ZeRO sec 10.1).
#: Latencies are typical NCCL per-hop values (assumed, ~5 us NVLink, ~10 us InfiniBand).
DGX2H = Cluster(
    name="DGX-2H",
    device=V100_SXM3_32GB,
    devices_per_node=16,
    intra_node=Link(name="NVSwitch (V100)", bandwidth=150 * GB, latency=5e-6),
    inter_node=Link(name="8x IB EDR 100Gb/s", bandwidth=8 * 12.5 * GB, latency=10e-6),
)

#: DGX A100 (MT-NLG sec 2.4): 8 A100 80GB per node, NVLink/NVSwitch 600 GB/s per GPU (300 GB/s per direction),
#: 8 HDR InfiniBand 200 Gb/s HCAs per node for application traffic = 200 GB/s per node.
DGX_A100 = Cluster(
    name="DGX-A100",
    device=A100_SXM4_80GB,
    devices_per_node=8,
    intra_node=Link(name="NVSwitch (A100)", bandwidth=300 * GB, latency=5e-6),
    inter_node=Link(name="8x IB HDR 200Gb/s", bandwidth=8 * 25 * GB, latency=10e-6),
)
