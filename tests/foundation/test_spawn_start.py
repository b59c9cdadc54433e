"""Ranks start correctly where CUDA could be in play (issue 25): never forked from a parent that touched CUDA or ran
a backward on a GPU build of torch; every spawn target is picklable so that forkserver and spawn can start it."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from repro.dist.spawn import choose_start_method

spawn_module = sys.modules["repro.dist.spawn"]  # the package's ``spawn`` attribute is the function

REPO = Path(__file__).resolve().parents[2]


def test_fork_only_without_a_gpu_runtime(monkeypatch):
    monkeypatch.delenv("REPRO_START_METHOD", raising=False)
    monkeypatch.setattr(spawn_module, "accelerator_built", lambda: False)
    assert choose_start_method() == "fork"
    monkeypatch.setattr(spawn_module, "accelerator_built", lambda: True)
    assert choose_start_method() == "forkserver"
    monkeypatch.setenv("REPRO_START_METHOD", "spawn")
    assert choose_start_method() == "spawn"
    assert choose_start_method("forkserver") == "forkserver"


def test_start_method_errors_name_the_value(monkeypatch):
    monkeypatch.setenv("REPRO_START_METHOD", "teleport")
    with pytest.raises(ValueError, match="'teleport'.*not one of"):
        choose_start_method()
    monkeypatch.delenv("REPRO_START_METHOD")
    monkeypatch.setattr(spawn_module, "accelerator_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="fork' after CUDA was initialised"):
        choose_start_method("fork")


_TRAIN_AFTER_BACKWARD = textwrap.dedent("""
    import json, os, sys, torch
    import repro.dist.spawn
    S = sys.modules["repro.dist.spawn"]
    S.accelerator_built = lambda: True          # what a CUDA build of torch reports
    from tests.foundation.spawn_targets import train_tp2
    x = torch.randn(4, requires_grad=True)
    (x * x).sum().backward()                    # autograd has run in the parent
    os.environ["REPRO_MARK"] = "set after the forkserver may have started"
    method = S.choose_start_method()
    losses = S.spawn(train_tp2, 2, 3, timeout_s=240)
    print(json.dumps({"method": method, "ranks": losses}), flush=True)
""")


def test_parent_after_backward_starts_two_ranks_that_train():
    """The parent runs a backward, then starts 2 ranks (as on a GPU build: from a forkserver) that train tp=2 for
    3 steps; both ranks see the parent's current environment and report the same falling losses."""
    proc = subprocess.run([sys.executable, "-c", _TRAIN_AFTER_BACKWARD], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**{k: v for k, v in os.environ.items() if k != "REPRO_START_METHOD"}, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["method"] == "forkserver"
    (losses, marks), other = report["ranks"]
    assert other == [losses, marks]
    assert marks == ["set after the forkserver may have started"]
    assert len(losses) == 3 and losses[-1] < losses[0]


def dynamo_imported(rank: int, world_size: int) -> bool:
    """Whether ``torch._dynamo`` is imported in this rank before it runs anything (a spawn target)."""
    return "torch._dynamo" in sys.modules


_RANKS_FIND_TORCH_LOADED = textwrap.dedent("""
    import json, sys
    from repro.dist.spawn import spawn
    from tests.foundation.test_spawn_start import dynamo_imported
    assert "torch._dynamo" not in sys.modules  # the parent itself has not imported it
    print(json.dumps({m: spawn(dynamo_imported, 2, start_method=m) for m in ("fork", "forkserver")}), flush=True)
""")


def test_ranks_start_with_torchs_modules_imported():
    """torch._dynamo (which a model's first init and torch.optim's first optimizer import, ~2 s of CPU) is imported
    once before the ranks start, by the parent for forked ranks and by the forkserver for the others, not again in
    every rank."""
    proc = subprocess.run([sys.executable, "-c", _RANKS_FIND_TORCH_LOADED], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"fork": [True, True], "forkserver": [True, True]}


def compile_a_new_graph(rank: int, world_size: int, shift: float) -> float:
    """Compile a graph the parent did not (a spawn target): its value, once its kernel is built. ``shift`` is a
    constant of the graph, so a new one makes a kernel that no cache holds."""
    return float(torch.compile(lambda x: (x + shift).cos().sum())(torch.ones(8)))


_COMPILE_THEN_FORK = textwrap.dedent("""
    import json, sys, torch
    from repro.dist.spawn import spawn
    from tests.foundation.test_spawn_start import compile_a_new_graph
    scale, shift = float(sys.argv[1]), float(sys.argv[2])
    torch.compile(lambda x: (x * scale).sin())(torch.ones(8))  # the parent's compile makes inductor's thread pool
    print(json.dumps(spawn(compile_a_new_graph, 1, shift, start_method="fork", timeout_s=120)), flush=True)
""")


def test_a_rank_forked_after_its_parent_compiled_compiles_too():
    """A parent compiles a graph, then forks a rank that compiles another, both missing inductor's cache (each
    graph holds a constant drawn for this run, so no cache has its kernel, as on a fresh machine) with 2 compile
    threads: the rank builds its kernel instead of waiting forever on the thread pool it inherited without its
    threads (it did, on torch 2.4.1 and 2.13, until the spawn timed out). The cache directory is the run's own, so
    that torch's probe of the CPU's vector instructions (~12 s of C++ builds in an empty directory) is not redone."""
    scale, shift = (1 + random.random() for _ in range(2))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_THEN_FORK, repr(scale), repr(shift)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [pytest.approx(8 * math.cos(1 + shift))]
