"""The dense baseline's backend ladder (repro.gna.dense_baseline) on CPU: it names the backends this torch has, skips
one that cannot run the shape with its reason, picks the fastest of those it timed (a fake timer makes that
deterministic), honours its time cap, and measure() divides by the winner and says which one it was."""

from __future__ import annotations

import functools
import types
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from repro.gna import GNASpec
from repro.gna import gpu_benchmark
from repro.gna.dense_baseline import SdpaBackend, dense_attention, math_skip_reason, probe_dense, sdpa_backends
from repro.gna.gpu_config import GpuConfig
from repro.timing import Timing

CPU = torch.device("cpu")
FAR = 1e12  # a deadline (time.perf_counter() seconds) never reached


def fake_timer(seconds: dict[str, float], calls: list | None = None):
    """time_capped's signature; each function 'takes' its seconds from ``seconds`` (and is called once)."""

    def timer(fns, *, device, warmup, iters, deadline, min_iters):
        if calls is not None:
            calls.append(dict(names=list(fns), warmup=warmup, iters=iters, min_iters=min_iters))
        for fn in fns.values():
            fn()
        return {name: Timing((seconds[name],) * iters) for name in fns}

    return timer


def fake_backends(*names: str) -> tuple[SdpaBackend, ...]:
    return tuple(SdpaBackend(name) for name in names)


def no_kernel():
    warnings.warn("Flash attention kernel not used because: head_dim 96 is not supported")
    raise RuntimeError("No available kernel. Aborting execution.\nmore lines")


def test_backends_follow_the_enum_and_tolerate_missing_members(monkeypatch):
    names = [backend.name for backend in sdpa_backends()]
    assert names == ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math"]  # torch 2.13 has all four
    assert sdpa_backends()[1].member is SDPBackend.FLASH_ATTENTION
    older = types.SimpleNamespace(FLASH_ATTENTION=SDPBackend.FLASH_ATTENTION, MATH=SDPBackend.MATH)
    monkeypatch.setattr(torch.nn.attention, "SDPBackend", older)  # a torch without cuDNN / efficient members
    assert [backend.name for backend in sdpa_backends()] == ["sdpa_flash", "sdpa_math"]
    monkeypatch.setattr(torch.nn.attention, "SDPBackend", types.SimpleNamespace())
    assert [backend.name for backend in sdpa_backends()] == ["sdpa_default"]  # SDPA's own choice


def test_the_fastest_timed_backend_wins_and_a_failing_one_is_skipped_with_its_reason():
    calls: list = []
    ladder = probe_dense(lambda backend: no_kernel if backend.name == "b" else (lambda: None), device=CPU,
                         deadline=FAR, backends=fake_backends("a", "b", "c", "d"), warmup=3, probe_iters=4,
                         timer=fake_timer({"a": 3e-3, "c": 1e-3, "d": 2e-3}, calls))
    assert ladder.fastest.name == "c"
    assert ladder.probe_s() == {"a": 3e-3, "c": 1e-3, "d": 2e-3}
    assert ladder.probe_iters() == {"a": 4, "c": 4, "d": 4}
    assert ladder.notes() == ("b: No available kernel. Aborting execution. (Flash attention kernel not used "
                              "because: head_dim 96 is not supported)")
    # each probed with the timer, one backend at a time; the first call counted as one of the warm-up calls
    assert [c["names"] for c in calls] == [["a"], ["c"], ["d"]]
    assert all(c["warmup"] == 2 and c["iters"] == 4 and c["min_iters"] == 1 for c in calls)


def test_skip_is_honoured_and_no_backend_at_all_raises():
    tried = []

    def make(backend):
        tried.append(backend.name)
        return lambda: None

    ladder = probe_dense(make, device=CPU, deadline=FAR, backends=fake_backends("a", "math"),
                         skip={"math": "not run: too big"}, timer=fake_timer({"a": 1.0}))
    assert tried == ["a"] and ladder.fastest.name == "a" and ladder.notes() == "math: not run: too big"
    with pytest.raises(RuntimeError, match="no SDPA backend ran this dense attention: a: No available kernel"):
        probe_dense(lambda backend: no_kernel, device=CPU, deadline=FAR, backends=fake_backends("a"),
                    timer=fake_timer({}))
    with pytest.raises(ValueError, match="probe_iters=0 must be >= 1"):
        probe_dense(make, device=CPU, deadline=FAR, probe_iters=0)


def test_time_cap_stops_the_ladder_after_the_first_backend_that_ran():
    ladder = probe_dense(lambda backend: (lambda: None), device=CPU, deadline=0.0,  # already past
                         backends=fake_backends("a", "b"), timer=fake_timer({"a": 1.0, "b": 0.5}))
    assert ladder.fastest.name == "a" and list(ladder.probe_s()) == ["a"]
    assert ladder.notes() == "b: not probed: the probe's time cap was reached"


def test_real_sdpa_on_cpu_probes_flash_and_math_and_skips_the_gpu_kernels():
    q = torch.randn(1, 4, 8, 2, 16)
    ladder = probe_dense(lambda backend: functools.partial(_under, backend, q), device=CPU, deadline=FAR,
                         warmup=1, probe_iters=2)
    assert set(ladder.probe_s()) == {"sdpa_flash", "sdpa_math"}
    assert ladder.fastest.name == min(ladder.probe_s(), key=ladder.probe_s().get)
    assert "sdpa_cudnn: " in ladder.notes() and "sdpa_efficient: " in ladder.notes()
    assert math_skip_reason(1, 24, 65536, backward=True, device=CPU) == ""  # only a GPU's memory is checked


def _under(backend: SdpaBackend, q: torch.Tensor) -> torch.Tensor:
    with backend.context():
        return dense_attention(q, q, q)


TOY = GpuConfig("toy", "toy", (4, 8), GNASpec((2, 4)), (2, 4), (2, 4), heads=2, head_dim=16)


def test_measure_divides_by_the_winner_and_names_it(monkeypatch):
    seen = []  # math enabled, flash enabled at each dense call

    def spy(query, key, value):
        seen.append((torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()))
        return dense_attention(query, key, value)

    timer = fake_timer({"sdpa_flash": 2e-3, "sdpa_math": 1e-3})
    monkeypatch.setattr(gpu_benchmark, "dense_attention", spy)
    monkeypatch.setattr(gpu_benchmark, "probe_dense", functools.partial(probe_dense, timer=timer))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Flex warns that it runs eagerly on CPU
        result = gpu_benchmark.measure(TOY, backward=False, device="cpu", dtype=torch.float32, warmup=1, iters=2,
                                       time_cap_s=10, check_queries=10**6)
    assert result["dense_backend"] == "sdpa_math"
    assert result["dense_probe_s"] == {"sdpa_flash": 2e-3, "sdpa_math": 1e-3}
    assert "sdpa_cudnn: " in result["dense_probe_notes"]
    assert seen[-1] == (True, False)  # the full timing of dense ran under math only
    assert result["speedup"] == pytest.approx(result["dense_s"] / result["gna_s"])
