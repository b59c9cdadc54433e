"""The denominator of GNA's speedups: dense attention with the fastest SDPA backend this device offers for the shape.

GNA §4 states its speedups over dense self attention. A speedup over a slower dense kernel than the device's best
is inflated (on an H100, cuDNN attention usually beats FlashAttention-2), so the baseline is chosen per problem, per
dtype and per direction (forward, forward + backward: the fastest can differ), as a ladder:

1. every SDPA backend this torch names (:class:`torch.nn.attention.SDPBackend`: cuDNN, flash, memory-efficient,
   math; members missing from an older torch are left out) is run once on the shape; one that raises (no kernel
   for this device, dtype or shape; out of memory) is skipped and its one-line reason kept. On CPU that leaves the
   flash CPU kernel and math. Math on a GPU is skipped up front when its [B, H, N, N] scores cannot fit;
2. each backend that ran is probed: warm-up and a few iterations (``probe_iters``) with the same timing helper as
   every contender (:func:`repro.gna.time_cap.time_capped`), all under one time cap; a backend the cap leaves no
   time for is noted, not probed;
3. the fastest probe (median) wins; the caller times the winner fully, like the GNA kernel, and reports the ladder.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Mapping, Sequence

import torch
import torch.nn.functional as F

from repro.gna.time_cap import time_capped
from repro.timing import Timing, synchronize

#: (name in the rows, SDPBackend member) in the order probed: the usually fastest first, so that a probe cut short
#: by its time cap has timed the likely winners.
_MEMBERS = (("sdpa_cudnn", "CUDNN_ATTENTION"), ("sdpa_flash", "FLASH_ATTENTION"),
            ("sdpa_efficient", "EFFICIENT_ATTENTION"), ("sdpa_math", "MATH"))

#: make_fn(backend) -> a call of dense attention (forward, or forward + backward) under that backend.
MakeFn = Callable[["SdpaBackend"], Callable[[], object]]
#: time_capped's signature: the timer the probe uses (tests pass a fake one).
Timer = Callable[..., dict[str, Timing]]


@dataclass(frozen=True)
class SdpaBackend:
    """One SDPA backend: ``member`` of SDPBackend, or None for SDPA's own choice (a torch without sdpa_kernel)."""

    name: str
    member: object | None = None

    def context(self) -> ContextManager:
        if self.member is None:
            return nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.member)


def sdpa_backends() -> tuple[SdpaBackend, ...]:
    """The SDPA backends this torch names, in probing order; SDPA's own choice alone where it names none."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401 - sdpa_kernel: the API the ladder needs
    except ImportError:
        return (SdpaBackend("sdpa_default"),)
    found = tuple(SdpaBackend(name, getattr(SDPBackend, member)) for name, member in _MEMBERS
                  if getattr(SDPBackend, member, None) is not None)
    return found or (SdpaBackend("sdpa_default"),)


def dense_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """SDPA over all tokens: [B, *grid, H, D] -> [B, H, N, D] (views in [B, H, N, D] order, last stride 1)."""
    batch, heads = query.shape[0], query.shape[-2]

    def heads_first(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch, -1, heads, x.shape[-1]).transpose(1, 2)

    return F.scaled_dot_product_attention(heads_first(query), heads_first(key), heads_first(value))


def math_skip_reason(batch: int, heads: int, tokens: int, *, backward: bool, device: torch.device) -> str:
    """Why the math backend cannot run this shape on ``device`` ('' when it may): it materialises the [B, H, N, N]
    scores and probabilities (and their gradients with backward), counted at 4 bytes, against the free GPU memory.
    The CPU is not checked (its points are toy-sized)."""
    if device.type != "cuda":
        return ""
    need = batch * heads * tokens**2 * 4 * (4 if backward else 2)
    free, _ = torch.cuda.mem_get_info(device)
    if need <= 0.9 * free:
        return ""
    return f"not run: its [B, H, N, N] scores need ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"


@dataclass(frozen=True)
class Rung:
    """One backend on the ladder: its probe timing, or why it has none."""

    backend: SdpaBackend
    probe: Timing | None = None
    note: str = ""


@dataclass(frozen=True)
class DenseLadder:
    """Every backend tried, in order; ``fastest`` is the one whose probe median is smallest."""

    rungs: tuple[Rung, ...]

    @property
    def timed(self) -> tuple[Rung, ...]:
        return tuple(rung for rung in self.rungs if rung.probe is not None)

    @property
    def fastest(self) -> SdpaBackend:
        return min(self.timed, key=lambda rung: rung.probe.median_s).backend

    def probe_s(self) -> dict[str, float]:
        """Backend name -> probe median seconds, for the backends probed."""
        return {rung.backend.name: rung.probe.median_s for rung in self.timed}

    def probe_iters(self) -> dict[str, int]:
        return {rung.backend.name: len(rung.probe.times_s) for rung in self.timed}

    def notes(self) -> str:
        """One line: each backend not probed and why ('' when all were)."""
        return "; ".join(f"{rung.backend.name}: {rung.note}" for rung in self.rungs if rung.probe is None)


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_call(fn: Callable[[], object], device: torch.device) -> str:
    """Run ``fn`` once (the first warm-up call): '' if it ran, else the one-line reason it cannot (SDPA's error and
    the warnings in which it says why a kernel was not used)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            synchronize(device)
            return ""
        except (RuntimeError, NotImplementedError, ValueError) as err:  # no kernel, unsupported shape, out of memory
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            why = [str(w.message) for w in caught]  # on CUDA: "<kernel> not used because: ..."
    if device.type == "cuda":
        torch.cuda.empty_cache()  # a failed try may have left a large block cached
    return _one_line(reason + (f" ({'; '.join(why)})" if why else ""))


def probe_dense(make_fn: MakeFn, *, device: torch.device | str, deadline: float,
                backends: Sequence[SdpaBackend] | None = None, skip: Mapping[str, str] | None = None,
                warmup: int = 3, probe_iters: int = 3, timer: Timer = time_capped) -> DenseLadder:
    """Try and probe each backend (see the module docstring) until ``deadline`` (``time.perf_counter()`` seconds);
    ``skip`` maps backend names to reasons not to try them. The first call counts as one of the ``warmup`` calls.
    Raises when no backend ran the shape, naming each one's reason."""
    if probe_iters < 1:
        raise ValueError(f"probe_iters={probe_iters} must be >= 1")
    device = torch.device(device)
    backends = sdpa_backends() if backends is None else tuple(backends)
    skip = dict(skip or {})
    rungs: list[Rung] = []
    for position, backend in enumerate(backends):
        if backend.name in skip:
            rungs.append(Rung(backend, note=skip[backend.name]))
            continue
        left = deadline - time.perf_counter()
        if left <= 0 and any(rung.probe is not None for rung in rungs):
            rungs.append(Rung(backend, note="not probed: the probe's time cap was reached"))
            continue
        fn = make_fn(backend)
        reason = _first_call(fn, device)
        if reason:
            rungs.append(Rung(backend, note=reason))
            continue
        # This backend's share of the time left; the timer lowers iterations to fit it, never below 1.
        until = time.perf_counter() + max(left, 0.0) / (len(backends) - position)
        timing = timer({backend.name: fn}, device=device, warmup=max(warmup - 1, 1), iters=probe_iters,
                       deadline=until, min_iters=1)[backend.name]
        rungs.append(Rung(backend, probe=timing))
    ladder = DenseLadder(tuple(rungs))
    if not ladder.timed:
        raise RuntimeError(f"no SDPA backend ran this dense attention: {ladder.notes()}")
    return ladder
