"""This machine as a "cluster": measure it (``calibrate_cpu``), then predict GPT step times on it.

``calibrate_cpu`` measures, in a few seconds, the four numbers the step-time model needs for a CPU rank:

* GEMM throughput: fp32 ``torch.matmul`` FLOP/s at ``threads`` threads on a small-GPT-sized product in the three
  orientations training uses (forward, data-gradient, weight-gradient), used as the device's peak (efficiency 1);
* dropout cost: seconds per random number of ``torch.bernoulli_`` (CPU RNG is compute-bound, unlike a GPU's);
* memory bandwidth: bytes/s of a large ``torch.add`` (two reads and one write per element);
* per-op overhead: seconds per autograd op on tiny tensors (eager dispatch + autograd bookkeeping);
* gloo all-reduce: latency ``alpha`` and bandwidth ``beta`` fitted to a small and a large all-reduce between
  ``world_size`` local processes (``t = 2 (p-1) alpha + 2 (p-1)/p n / beta``).

``predict_cpu_step_time(model, tp_size=, dp_size=, micro_batch_size=, calibration=)`` runs the same op-level model
(``step_time.iteration_time``) with those numbers, so comparing with a measured run is one line::

    model = gpt_config_from_model(models_gpt_config, seq_length=128, tp_size=2)
    predicted = predict_cpu_step_time(model, tp_size=2, dp_size=1, micro_batch_size=4,
                                      calibration=calibrate_cpu(threads=1, world_size=2))

Assumptions (documented, not fitted): fp32 activations and gradients, SDPA-fused attention, per-tensor Adam,
gradient all-reduce after backward (no overlap), each rank on ``threads`` threads with the others idle during
calibration (concurrent ranks share memory bandwidth, so the model is optimistic when ranks contend).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .hardware import Accelerator, Cluster, Efficiency, Link
from .ops import FP32_ADAM_BYTES_PER_PARAM
from .step_time import GPTConfig, Layout, StepTime, iteration_time


@dataclass(frozen=True)
class CPUCalibration:
    """Measured numbers of this machine (per rank when ``threads`` threads serve one rank)."""

    gemm_flops: float
    rng_seconds_per_element: float
    memory_bandwidth: float
    op_overhead_s: float
    allreduce_latency_s: float
    allreduce_bandwidth: float
    threads: int

    def cluster(self, world_size: int) -> Cluster:
        device = Accelerator(name=f"CPU ({self.threads} thread(s))", peak_flops=self.gemm_flops,
                             memory_bandwidth=self.memory_bandwidth, memory_bytes=2**40,
                             rng_seconds_per_element=self.rng_seconds_per_element)
        link = Link(name="gloo (loopback)", bandwidth=self.allreduce_bandwidth, latency=self.allreduce_latency_s)
        return Cluster(name="this machine", device=device, devices_per_node=max(1, world_size), intra_node=link,
                       inter_node=link)

    def efficiency(self) -> Efficiency:
        return Efficiency(gemm=1.0, memory=1.0, kernel_overhead=self.op_overhead_s, intra_link=1.0, inter_link=1.0,
                          fitted_on="measured by calibrate_cpu")


def _median_time(fn, repeats: int) -> float:
    """Median wall time of ``fn`` (the median, not the best: other processes share these cores)."""
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_gemm_flops(*, tokens: int = 512, hidden: int = 256, repeats: int = 7) -> float:
    """FLOP/s of ``[tokens x hidden] @ [hidden x 4 hidden]`` and its two backward GEMMs (transposed operands)."""
    x, w, dy = torch.randn(tokens, hidden), torch.randn(hidden, 4 * hidden), torch.randn(tokens, 4 * hidden)

    def three() -> None:
        torch.matmul(x, w)  # forward
        torch.matmul(dy, w.t())  # data gradient
        torch.matmul(x.t(), dy)  # weight gradient

    return 3 * 2.0 * tokens * hidden * 4 * hidden / _median_time(three, repeats)


def measure_rng_seconds_per_element(*, elements: int = 1 << 20, repeats: int = 5) -> float:
    mask = torch.empty(elements)
    return _median_time(lambda: mask.bernoulli_(0.9), repeats) / elements


def measure_memory_bandwidth(*, elements: int = 1 << 23, repeats: int = 5) -> float:
    a, b, out = torch.randn(elements), torch.randn(elements), torch.empty(elements)
    return 3.0 * 4 * elements / _median_time(lambda: torch.add(a, b, out=out), repeats)


def measure_op_overhead(*, ops: int = 200, repeats: int = 5) -> float:
    """Seconds per op of a forward + backward chain of tiny element-wise ops (forward op + its backward op)."""
    x = torch.randn(8, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(ops):
            y = y * 1.0001
        y.sum().backward()

    return _median_time(chain, repeats) / (2 * ops)


def _allreduce_worker(rank: int, world_size: int, sizes: list[int], repeats: int) -> list[float]:
    import torch.distributed as dist

    times = []
    for size in sizes:
        buffer = torch.ones(size // 4)
        dist.all_reduce(buffer)
        best = float("inf")
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            best = min(best, time.perf_counter() - start)
        times.append(best)
    return times


def measure_allreduce(*, world_size: int = 2, small_bytes: int = 4096, large_bytes: int = 8 << 20,
                      repeats: int = 5) -> tuple[float, float]:
    """(latency alpha in s, bandwidth beta in bytes/s) of gloo all-reduce between local processes."""
    from repro.dist.spawn import spawn

    if world_size < 2:
        raise ValueError(f"an all-reduce needs world_size >= 2, got {world_size}")
    times = spawn(_allreduce_worker, world_size, [small_bytes, large_bytes], repeats, backend="gloo", timeout_s=120)
    t_small, t_large = max(t[0] for t in times), max(t[1] for t in times)
    steps = 2 * (world_size - 1)
    volume = 2.0 * (world_size - 1) / world_size
    # two equations t = steps alpha + volume n / beta, solved for alpha and beta
    beta = volume * (large_bytes - small_bytes) / max(t_large - t_small, 1e-9)
    alpha = max(0.0, (t_small - volume * small_bytes / beta) / steps)
    return alpha, beta


def calibrate_cpu(*, threads: int = 1, world_size: int = 2) -> CPUCalibration:
    """Measure this machine (a few seconds). ``threads`` is the torch thread count of one rank."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gemm = measure_gemm_flops()
        rng = measure_rng_seconds_per_element()
        memory = measure_memory_bandwidth()
        overhead = measure_op_overhead()
    finally:
        torch.set_num_threads(previous)
    alpha, beta = measure_allreduce(world_size=world_size)
    return CPUCalibration(gemm_flops=gemm, rng_seconds_per_element=rng, memory_bandwidth=memory, op_overhead_s=overhead,
                          allreduce_latency_s=alpha, allreduce_bandwidth=beta, threads=threads)


def cpu_layout(*, tp_size: int, dp_size: int, micro_batch_size: int, activation_recompute: bool = False,
               dropout: bool = True) -> Layout:
    """fp32 training with fused (SDPA) attention, per-tensor Adam, gradient all-reduce after backward."""
    return Layout(tp_size=tp_size, pp_size=1, dp_size=dp_size, micro_batch_size=micro_batch_size,
                  global_batch_size=micro_batch_size * dp_size, activation_recompute=activation_recompute,
                  grad_bytes=4, activation_bytes=4, fused_attention=True,
                  optimizer_bytes_per_param=FP32_ADAM_BYTES_PER_PARAM, dp_overlap=0.0, dropout=dropout)


def predict_cpu_step(model: GPTConfig, *, tp_size: int, dp_size: int, micro_batch_size: int,
                     calibration: CPUCalibration, activation_recompute: bool = False,
                     dropout: bool = True) -> StepTime:
    """Predicted breakdown of one training step of ``model`` on ``tp_size x dp_size`` local CPU ranks."""
    layout = cpu_layout(tp_size=tp_size, dp_size=dp_size, micro_batch_size=micro_batch_size,
                        activation_recompute=activation_recompute, dropout=dropout)
    layout = Layout(**{**layout.__dict__, "optimizer_launches": 7 * (4 * model.num_layers + 4)})
    return iteration_time(model, layout, calibration.cluster(layout.world_size), calibration.efficiency())


def predict_cpu_step_time(model: GPTConfig, *, tp_size: int, dp_size: int, micro_batch_size: int,
                          calibration: CPUCalibration, activation_recompute: bool = False,
                          dropout: bool = True) -> float:
    """Predicted seconds per training step (see :func:`predict_cpu_step`)."""
    return predict_cpu_step(model, tp_size=tp_size, dp_size=dp_size, micro_batch_size=micro_batch_size,
                            calibration=calibration, activation_recompute=activation_recompute,
                            dropout=dropout).total


def gpt_config_from_model(config, *, seq_length: int, tp_size: int = 1) -> GPTConfig:
    """The step-time model's view of a ``repro.models.GPTConfig`` (duck-typed: hidden_size, num_layers,
    num_attention_heads, padded_vocab_size(tp)) trained at ``seq_length``."""
    return GPTConfig(num_layers=config.num_layers, hidden_size=config.hidden_size,
                     num_heads=config.num_attention_heads, vocab_size=config.padded_vocab_size(tp_size),
                     seq_length=seq_length)
