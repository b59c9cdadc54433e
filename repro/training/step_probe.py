"""The 1-GPU step's open questions, measured: optimizer variants, the steady-state step's profile, trainer variants.

Three sections of the GPU probe (:mod:`repro.gpu_probe`), each handing its results to ``emit(variant, values,
fields)`` as they come:

* :func:`optimizer_variants`: the optimizer phase of a trainer's step (its gradients in place) as the per-parameter
  optimizer ran it (foreach norm and clipping, fused AdamW over every tensor), on the flat buffers with the clipping
  as a multiplication, and on the flat buffers with the clipping as the fused kernel's ``grad_scale``: the host's
  time to issue it and the GPU's time to run it, apart (the GPU is held by a sleep kernel while the host issues, so
  its events time the kernels alone), against the HBM floor of what AdamW must move (28 bytes per fp32 parameter,
  plus 4 for the norm), at a bandwidth measured here by a device copy;
* :func:`profile_phases`: two steady-state steps under ``torch.profiler`` with each phase (forward, loss, backward,
  optimizer) marked: per phase its span on the device, the time kernels ran, the idle rest and the kernel count;
* :func:`trainer_variants`: trainers that differ from a baseline by one setting, each built, then timed in turn
  with the baseline (A B A B A B, :func:`repro.training.throughput.alternate`), one pair at a time so that two 1.2B
  models at most share the device.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import torch

from repro.training.phases import PHASES, PhaseMarks

Emit = Callable[[str, dict, dict], None]


def measured_bandwidth(device: torch.device, *, gib: float = 2.0) -> float | None:
    """Bytes per second a device-to-device copy of ``gib`` GiB moves (read + write), best of 5; None off a GPU."""
    if device.type != "cuda":
        return None
    from repro.timing import time_iterations

    source = torch.empty(int(gib * 2**30) // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    seconds = time_iterations(lambda: target.copy_(source), device=device, warmup=2, iters=5).min_s
    moved = 2 * source.numel() * 4
    del source, target
    return moved / seconds


def host_and_device_ms(fn: Callable[[], object], device: torch.device, *, repeats: int = 3) -> tuple[float, float]:
    """(host ms to issue ``fn``, device ms to run it), medians of ``repeats``. On a GPU a sleep kernel holds the
    device while the host issues, so the events around ``fn`` time its kernels back to back; on a CPU both are the
    wall time."""
    import statistics

    hosts, devices = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(2e8))  # ~0.1 s of a spinning kernel: longer than any host issue
            start.record()
            began = time.perf_counter()
            fn()
            hosts.append(1e3 * (time.perf_counter() - began))
            end.record()
            torch.cuda.synchronize(device)
            devices.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            hosts.append(1e3 * (time.perf_counter() - began))
            devices.append(hosts[-1])
    return statistics.median(hosts), statistics.median(devices)


def optimizer_variants(trainer, emit: Emit, *, device: torch.device, repeats: int = 3) -> None:
    """The trainer's optimizer step three ways on its own parameters and gradients (module docstring)."""
    from repro.training.optim import DataParallelOptimizer
    from repro.training.reference_steps import PerParameterOptimizer

    flat = trainer.optimizer
    if not isinstance(flat, DataParallelOptimizer) or flat.clip_grad is None:
        raise ValueError("the optimizer probe needs the trainer's flat-buffer optimizer with clipping")
    params = sum(p.numel() for p in flat.params)
    bandwidth = measured_bandwidth(device)
    floor_ms = None if bandwidth is None else 1e3 * 32 * params / bandwidth
    per_parameter = PerParameterOptimizer(trainer.stage, trainer.settings, trainer.groups)
    fields = dict(parameters=params, tensors=len(flat.params), bandwidth_gb_s=bandwidth and bandwidth / 1e9)
    variants: dict[str, Callable[[], object]] = {"per_parameter_foreach": per_parameter.step}
    folded = flat.clip_in_step

    def multiply_then_step() -> None:
        flat.clip_in_step = False
        try:
            flat.step()
        finally:
            flat.clip_in_step = folded

    variants["flat_multiply_then_step"] = multiply_then_step
    if folded:  # the fused kernel (CUDA): the factor as its grad_scale
        variants["flat_grad_scale_in_step"] = flat.step
    saved = [p.grad.detach().clone() for p in flat.params]  # each variant starts from the same gradients
    for name, step in variants.items():
        for p, grad in zip(flat.params, saved):
            if p.grad is None or p.grad.data_ptr() != flat.flat.grad_view(p).data_ptr():
                p.grad = flat.flat.grad_view(p)
            p.grad.copy_(grad)
        step()  # the first: states exist, nothing is created inside the timing
        host_ms, device_ms = host_and_device_ms(step, device, repeats=repeats)
        values = {"host_ms": host_ms, "device_ms": device_ms}
        if floor_ms is not None:
            values.update(hbm_floor_ms=floor_ms, device_over_floor=device_ms / floor_ms)
        emit(name, values, fields)
    del per_parameter, saved


class _ProfiledPhases(PhaseMarks):
    """:class:`~repro.training.phases.PhaseMarks` whose marks are also profiler ranges named after the phase."""

    def __init__(self, device: torch.device, trainer: Any) -> None:
        super().__init__(device, trainer)
        self._open: dict[str, list] = {}

    def _mark(self, phase: str, start: bool) -> None:
        super()._mark(phase, start)
        if start:
            scope = torch.autograd.profiler.record_function(f"phase:{phase}")
            scope.__enter__()
            self._open.setdefault(phase, []).append(scope)
        elif self._open.get(phase):
            self._open[phase].pop().__exit__(None, None, None)


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total / 1e3


def phase_profile(events, device: torch.device) -> dict[str, dict[str, float]]:
    """Per phase: ``span_ms`` (its marked ranges), ``busy_ms`` (kernels running inside them), ``idle_ms``, and
    ``kernels``, from profiler events: on a GPU the device-side ranges and kernels, on a CPU the host's ranges and
    the aten operations that start directly inside them."""
    from torch.autograd import DeviceType

    on_device = device.type == "cuda"
    kind = DeviceType.CUDA if on_device else DeviceType.CPU
    ranges: dict[str, list[tuple[float, float]]] = {}
    work: list[tuple[float, float]] = []
    for event in events:
        if event.device_type != kind:
            continue
        span = (event.time_range.start, event.time_range.end)
        if event.name.startswith("phase:"):
            ranges.setdefault(event.name.removeprefix("phase:"), []).append(span)
        elif on_device or (event.name.startswith("aten::") and getattr(event, "cpu_parent", None) is not None
                           and event.cpu_parent.name.startswith("phase:")):
            work.append(span)
    out = {}
    for phase, spans in ranges.items():
        inside = [(max(lo, a), min(hi, b)) for lo, hi in work for a, b in spans if min(hi, b) > max(lo, a)]
        span_ms = _union_ms(spans)
        busy_ms = _union_ms(inside)
        out[phase] = {"span_ms": span_ms, "busy_ms": busy_ms, "idle_ms": max(span_ms - busy_ms, 0.0),
                      "kernels": float(sum(any(a <= lo < b for a, b in spans) for lo, _ in work))}
    return out


def profile_phases(trainer, batch: torch.Tensor, emit: Emit, *, device: torch.device, steps: int = 2) -> None:
    """The steady-state step under the profiler (module docstring); one row per phase."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trainer.step_lazy(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof, _ProfiledPhases(device, trainer) as marks:
        for _ in range(steps):
            trainer.step_lazy(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    phases = phase_profile(prof.events(), device)
    marked = marks.milliseconds()
    for phase, _ in PHASES:
        if phase in phases:
            emit(phase, {k: v / steps for k, v in phases[phase].items()},
                 dict(steps=steps, marked_ms=marked.get(phase, 0.0) / steps))
        elif marked.get(phase):  # no device-side range in this profile: the marks' time alone, said so
            emit(phase, {"span_ms": marked[phase] / steps}, dict(steps=steps, note="the profile had no range for "
                                                                 "this phase; span from the step's own marks"))


def trainer_variants(config, baseline: Mapping[str, Any], variants: Mapping[str, Mapping[str, Any]], emit: Emit, *,
                     groups, device: torch.device, warmup: int, iters: int, repetitions: int,
                     deadline: float, need_s: float, base=None) -> None:
    """Each variant (a few settings changed from ``baseline``, the keyword arguments of ``TrainSettings``) timed in
    turn with the baseline (``base``: already prepared, else built here); a variant that would not finish before
    ``deadline`` (needing ``need_s``) is reported as not run."""
    from repro.training.settings import TrainSettings
    from repro.training.throughput import alternate, prepare_trainer, release

    if base is None:
        base = prepare_trainer(config, groups, TrainSettings(**baseline), device=device)
    for name, changes in variants.items():
        if deadline - time.perf_counter() < need_s:
            emit(name, {"iteration_s": None}, dict(changes=dict(changes), note="not run: the probe's deadline"))
            continue
        try:
            other = prepare_trainer(config, groups, TrainSettings(**{**baseline, **changes}), device=device)
        except (RuntimeError, ValueError) as err:  # out of memory, a setting this torch cannot run
            emit(name, {"iteration_s": None}, dict(changes=dict(changes), note=" ".join(str(err).split())[:300]))
            release(device)
            continue
        measured = alternate({"baseline": base, name: other}, device=device, warmup=warmup, iters=iters,
                             repetitions=repetitions)
        mine, ref = measured[name], measured["baseline"]
        pairs = [r / m for m, r in zip(mine.repetition_s, ref.repetition_s)]
        emit(name, {"iteration_s": mine.iteration_s.median, "baseline_iteration_s": ref.iteration_s.median,
                    "speed_vs_baseline": ref.iteration_s.median / mine.iteration_s.median,
                    "peak_memory_gib": mine.peak_memory_gib, "baseline_peak_memory_gib": ref.peak_memory_gib},
             dict(changes=dict(changes), repetitions=repetitions, speed_min=min(pairs), speed_max=max(pairs),
                  iteration_s_min=mine.iteration_s.min, iteration_s_max=mine.iteration_s.max))
        del other
        release(device)
    del base
