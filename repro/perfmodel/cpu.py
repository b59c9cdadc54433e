"""This machine as a "cluster": measure it (``calibrate_cpu``), then predict GPT step times on it.

``calibrate_cpu`` measures, in a few seconds, the numbers the op-level step-time model needs for a CPU rank, with
``world_size`` ranks running at once (as in the run being predicted: two busy cores share caches and memory
bandwidth, and gloo's threads compete with compute):

* GEMM throughput: fp32 ``torch.matmul`` FLOP/s of every GEMM shape the predicted model runs (``gemm_shapes``;
  small GEMMs run far below a large one's rate), and of one large product used for any other shape;
* dropout cost: seconds per random number of ``torch.bernoulli_`` (CPU RNG is compute-bound, unlike a GPU's);
* math cost: seconds per element of GELU (erf) on CPUs, where transcendental functions are compute-bound;
* memory bandwidth: bytes/s of a large ``torch.add`` (two reads and one write per element);
* per-op overhead: seconds per autograd op on tiny tensors (eager dispatch + autograd bookkeeping);
* gloo all-reduce *as training uses it*: every rank alternates a GEMM and an all-reduce, and the cost of one
  all-reduce is the time this adds over the GEMMs alone (latency, wake-up of the waiting rank, and the compute the
  communication threads take away). Latency ``alpha`` and bandwidth ``beta`` are fitted to a small and a large
  message: ``t = 2 (p-1) alpha + 2 (p-1)/p n / beta``.

``predict_cpu_step_time(model, tp_size=, dp_size=, micro_batch_size=, calibration=)`` runs the same op-level model
(``step_time.iteration_time``) with those numbers, so comparing with a measured run is one line::

    model = gpt_config_from_model(models_gpt_config, seq_length=128, tp_size=2)
    calibration = calibrate_cpu(threads=1, world_size=2,
                                gemm_shapes=model_gemm_shapes(model, tp_size=2, micro_batch_size=4))
    predicted = predict_cpu_step_time(model, tp_size=2, dp_size=1, micro_batch_size=4, calibration=calibration)

Nothing is fitted to the step being predicted: the calibration measures kernels and collectives in isolation, the
model composes them. Assumptions (documented, not fitted): fp32 activations and gradients, SDPA-fused attention,
per-tensor Adam, gradient all-reduce after backward (no overlap).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Iterable

import torch

from .hardware import Accelerator, Cluster, Efficiency, Link
from .ops import FP32_ADAM_BYTES_PER_PARAM, LayerShape, head_iteration_ops, layer_iteration_ops
from .step_time import GPTConfig, Layout, StepTime, iteration_time

GemmShape = tuple[int, int, int, int]  # (m, n, k, batch): batch GEMMs of [m x k] @ [k x n]


@dataclass(frozen=True)
class CPUCalibration:
    """Measured numbers of this machine, per rank, while ``concurrent_ranks`` ranks of ``threads`` threads each
    ran at once."""

    gemm_flops: float
    rng_seconds_per_element: float
    memory_bandwidth: float
    op_overhead_s: float
    allreduce_latency_s: float
    allreduce_bandwidth: float
    threads: int
    math_seconds_per_element: float = 0.0
    measured_gemm_flops: tuple[tuple[GemmShape, float], ...] = ()
    concurrent_ranks: int = 1
    layer_overhead_s: float = 0.0  # fitted by fit_overheads: unexplained seconds per layer per step
    step_overhead_s: float = 0.0  # fitted by fit_overheads: unexplained seconds per step

    def cluster(self, world_size: int) -> Cluster:
        device = Accelerator(name=f"CPU ({self.threads} thread(s))", peak_flops=self.gemm_flops,
                             memory_bandwidth=self.memory_bandwidth, memory_bytes=2**40,
                             rng_seconds_per_element=self.rng_seconds_per_element,
                             math_seconds_per_element=self.math_seconds_per_element,
                             measured_gemm_flops=self.measured_gemm_flops)
        link = Link(name="gloo (loopback)", bandwidth=self.allreduce_bandwidth, latency=self.allreduce_latency_s)
        return Cluster(name="this machine", device=device, devices_per_node=max(1, world_size), intra_node=link,
                       inter_node=link)

    def efficiency(self) -> Efficiency:
        return Efficiency(gemm=1.0, memory=1.0, kernel_overhead=self.op_overhead_s, intra_link=1.0, inter_link=1.0,
                          fitted_on="measured by calibrate_cpu")


def _median_time(fn, repeats: int, *, min_seconds: float = 2e-3) -> float:
    """Median wall time of one call of ``fn`` (the median, not the best: other processes share these cores). Calls
    are batched so that each timing lasts at least ``min_seconds``."""
    fn()  # warm up
    start = time.perf_counter()
    fn()
    calls = max(1, int(min_seconds / max(time.perf_counter() - start, 1e-7)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure_gemm_flops(*, tokens: int = 512, hidden: int = 256, repeats: int = 7) -> float:
    """FLOP/s of ``[tokens x hidden] @ [hidden x 4 hidden]`` and its two backward GEMMs (transposed operands)."""
    x, w, dy = torch.randn(tokens, hidden), torch.randn(hidden, 4 * hidden), torch.randn(tokens, 4 * hidden)

    def three() -> None:
        torch.matmul(x, w)  # forward
        torch.matmul(dy, w.t())  # data gradient
        torch.matmul(x.t(), dy)  # weight gradient

    return 3 * 2.0 * tokens * hidden * 4 * hidden / _median_time(three, repeats)


def measure_gemm_shape_flops(shape: GemmShape, *, repeats: int = 5) -> float:
    """FLOP/s of ``batch`` GEMMs ``[m x k] @ [k x n]`` (one ``bmm`` when batched, as attention runs them)."""
    m, n, k, batch = shape
    if batch == 1:
        a, b = torch.randn(m, k), torch.randn(k, n)
    else:
        a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    return 2.0 * batch * m * n * k / _median_time(lambda: torch.matmul(a, b), repeats)


def measure_rng_seconds_per_element(*, elements: int = 1 << 20, repeats: int = 5) -> float:
    mask = torch.empty(elements)
    return _median_time(lambda: mask.bernoulli_(0.9), repeats) / elements


def measure_math_seconds_per_element(*, elements: int = 1 << 20, repeats: int = 5) -> float:
    """Seconds per element of exact (erf) GELU, minus the memory traffic of a copy of the same size."""
    x, out = torch.randn(elements), torch.empty(elements)
    gelu = _median_time(lambda: torch.nn.functional.gelu(x), repeats)
    copy = _median_time(lambda: out.copy_(x), repeats)
    return max(0.0, gelu - copy) / elements


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


@dataclass(frozen=True)
class _Kernels:
    gemm_flops: float
    rng: float
    math: float
    memory: float
    overhead: float
    shapes: tuple[tuple[GemmShape, float], ...]


def _measure_kernels(gemm_shapes: tuple[GemmShape, ...]) -> _Kernels:
    return _Kernels(gemm_flops=measure_gemm_flops(), rng=measure_rng_seconds_per_element(),
                    math=measure_math_seconds_per_element(), memory=measure_memory_bandwidth(),
                    overhead=measure_op_overhead(),
                    shapes=tuple((shape, measure_gemm_shape_flops(shape)) for shape in gemm_shapes))


_CPU = torch.device("cpu")  # this module measures CPU ranks; their collectives run over gloo (checked where used)

#: the compute between two all-reduces in the calibration pattern: one [512 x 128] @ [128 x 512] GEMM (~1 ms)
_PATTERN_GEMM = (512, 512, 128)
_PATTERN_CALLS, _PATTERN_REPEATS = 16, 5


def _pattern_seconds(buffer: torch.Tensor | None) -> float:
    """Seconds of ``_PATTERN_CALLS`` x (GEMM, all-reduce of ``buffer``); GEMMs only when ``buffer`` is None."""
    import torch.distributed as dist

    m, n, k = _PATTERN_GEMM
    a, b = torch.randn(m, k, device=_CPU), torch.randn(k, n, device=_CPU)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(_PATTERN_CALLS):
        torch.matmul(a, b)
        if buffer is not None:
            dist.all_reduce(buffer)
    elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=_CPU)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the pattern lasts as long as its slowest rank
    return float(elapsed)


def _pattern_allreduce_costs(message_bytes: Iterable[int]) -> list[float]:
    """Seconds one all-reduce of each size adds to the GEMM / all-reduce pattern (all ranks must call it)."""
    costs = []
    for n in message_bytes:
        buffer = torch.ones(max(1, n // 4), device=_CPU)
        with_comm, without = [], []
        for _ in range(_PATTERN_REPEATS):  # interleaved, so that a drifting load hits both alike
            with_comm.append(_pattern_seconds(buffer))
            without.append(_pattern_seconds(None))
        costs.append(max(0.0, statistics.median(with_comm) - statistics.median(without)) / _PATTERN_CALLS)
    return costs


def _alpha_beta(cost_small: float, cost_large: float, small_bytes: int, large_bytes: int,
                world_size: int) -> tuple[float, float]:
    """Solve ``t = 2 (p-1) alpha + 2 (p-1)/p n / beta`` for two message sizes (beta = inf when size does not
    matter)."""
    steps, volume = 2 * (world_size - 1), 2.0 * (world_size - 1) / world_size
    slope = (cost_large - cost_small) / (large_bytes - small_bytes)
    beta = volume / slope if slope > 0 else float("inf")
    alpha = max(0.0, (cost_small - volume * small_bytes / beta) / steps)
    return alpha, beta


def _check_calibration_args(threads: int, small_bytes: int, large_bytes: int) -> None:
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if not 0 < small_bytes < large_bytes:
        raise ValueError(f"need 0 < small_bytes < large_bytes, got {small_bytes} and {large_bytes}")


def _calibrate_rank(rank: int, world_size: int, gemm_shapes: tuple[GemmShape, ...], threads: int, small_bytes: int,
                    large_bytes: int) -> CPUCalibration:
    return calibrate_these_ranks(gemm_shapes=gemm_shapes, threads=threads, small_bytes=small_bytes,
                                 large_bytes=large_bytes)


def calibrate_cpu(*, threads: int = 1, world_size: int = 2, gemm_shapes: Iterable[GemmShape] = (),
                  small_bytes: int = 4096, large_bytes: int = 1 << 20) -> CPUCalibration:
    """Measure this machine with ``world_size`` ranks of ``threads`` threads running at once (a few seconds), from
    a process that is not itself a rank: :func:`calibrate_these_ranks` in ``world_size`` local processes.

    ``world_size = 1`` measures the kernels alone (no collectives: the all-reduce costs nothing). Otherwise the
    kernels are measured in ``world_size`` concurrent processes (the slowest rank's numbers are kept) and the
    all-reduce in the GEMM / all-reduce pattern of the module docstring."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    # checked here too, so that bad input is a ValueError rather than a failed rank
    _check_calibration_args(threads, small_bytes, large_bytes)
    args = (tuple(gemm_shapes), threads, small_bytes, large_bytes)
    if world_size == 1:
        return _calibrate_rank(0, 1, *args)
    from repro.dist.spawn import spawn

    return spawn(_calibrate_rank, world_size, *args, backend="gloo", timeout_s=300)[0]


def calibrate_these_ranks(*, gemm_shapes: Iterable[GemmShape] = (), threads: int = 1, small_bytes: int = 4096,
                          large_bytes: int = 1 << 20) -> CPUCalibration:
    """:func:`calibrate_cpu` from inside a running job: call it on every rank (torch.distributed may be
    uninitialised for one rank). The kernels are measured on all ranks at once and the slowest rank's numbers
    kept; with more than one rank, the all-reduce is measured in the GEMM / all-reduce pattern."""
    import torch.distributed as dist

    _check_calibration_args(threads, small_bytes, large_bytes)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if world_size > 1 and dist.get_backend() != "gloo":
        raise ValueError(f"calibrate_these_ranks measures CPU ranks and their all-reduce over gloo; this job's "
                         f"default process group uses {dist.get_backend()!r}")
    shapes = tuple(dict.fromkeys(tuple(int(x) for x in shape) for shape in gemm_shapes))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        k = _measure_kernels(shapes)
        alpha, beta = 0.0, float("inf")
        if world_size > 1:
            costs = _pattern_allreduce_costs((small_bytes, large_bytes))
            alpha, beta = _alpha_beta(*costs, small_bytes, large_bytes, world_size)
    finally:
        torch.set_num_threads(previous)
    # slowest rank: rates take the minimum, costs the maximum (one MAX all-reduce of costs and inverse rates)
    costs = torch.tensor([1 / k.gemm_flops, k.rng, k.math, 1 / k.memory, k.overhead, alpha, 1 / beta,
                          *(1 / f for _, f in k.shapes)], dtype=torch.float64, device=_CPU)
    if world_size > 1:
        dist.all_reduce(costs, op=dist.ReduceOp.MAX)
    c = costs.tolist()
    return CPUCalibration(gemm_flops=1 / c[0], rng_seconds_per_element=c[1], math_seconds_per_element=c[2],
                          memory_bandwidth=1 / c[3], op_overhead_s=c[4], allreduce_latency_s=c[5],
                          allreduce_bandwidth=1 / c[6] if c[6] > 0 else float("inf"), threads=threads,
                          measured_gemm_flops=tuple((shape, 1 / x) for shape, x in zip(shapes, c[7:])),
                          concurrent_ranks=world_size)


def fit_overheads(calibration: CPUCalibration, runs: Iterable[tuple[GPTConfig, float]], *, tp_size: int,
                  micro_batch_size: int) -> CPUCalibration:
    """Fit the time the kernel model does not see, per layer and per step, to measured steps of small models.

    Each run is ``(model, measured seconds per step)`` at ``tp_size``, the runs differing in depth. On a CPU the
    unexplained time is framework work (eager dispatch and autograd bookkeeping of hundreds of small ATen calls
    per layer, per-tensor optimizer loops) and, with ``tp_size > 1``, what an all-reduce costs beyond the
    calibrated pattern (waking the waiting rank, cache pollution by gloo's copies). Both grow with the layers, so
    ``measured - predicted = step_overhead + layers * layer_overhead`` is fitted by least squares."""
    runs = list(runs)
    if len({m.num_layers for m, _ in runs}) < 2:
        raise ValueError(f"need runs of at least two depths to fit per-layer and per-step overheads, got layers "
                         f"{[m.num_layers for m, _ in runs]}")
    base = CPUCalibration(**{**calibration.__dict__, "layer_overhead_s": 0.0, "step_overhead_s": 0.0})
    rows, rhs = [], []
    for run_model, measured in runs:
        predicted = predict_cpu_step_time(run_model, tp_size=tp_size, dp_size=1, micro_batch_size=micro_batch_size,
                                          calibration=base)
        rows.append([1.0, float(run_model.num_layers)])
        rhs.append(measured - predicted)
    step, layer = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64),
                                     torch.tensor(rhs, dtype=torch.float64)[:, None]).solution.flatten().tolist()
    return CPUCalibration(**{**base.__dict__, "layer_overhead_s": layer, "step_overhead_s": step})


def model_gemm_shapes(model: GPTConfig, *, tp_size: int, micro_batch_size: int,
                      activation_recompute: bool = False) -> tuple[GemmShape, ...]:
    """Every GEMM shape one training step of ``model`` runs on one tensor-parallel rank (for ``gemm_shapes``)."""
    shape = LayerShape(micro_batch_size, model.seq_length, model.hidden_size, model.num_heads, tp_size, 4, True)
    ops = layer_iteration_ops(shape, activation_recompute=activation_recompute) + head_iteration_ops(
        micro_batch_size=micro_batch_size, seq_length=model.seq_length, hidden_size=model.hidden_size,
        vocab_size=model.vocab_size, tp_size=tp_size, dtype_bytes=4)
    return tuple(dict.fromkeys(op.gemm_shape for op in ops if op.gemm_shape is not None))


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
    step = iteration_time(model, layout, calibration.cluster(layout.world_size), calibration.efficiency())
    overhead = calibration.step_overhead_s + model.num_layers * calibration.layer_overhead_s
    return replace(step, total=step.total + overhead, overhead=overhead)


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
