"""``python -m repro.dist.torchrun`` and a signal: a job whose ranks all finished and saved exits 0 whatever signal
arrives after (it used to exit 1 with torchrun's report, or 75). The rule that decides it (every rank that started
also finished) as a table, and a real job of one rank, the agent polling its ranks every 2 s so that the late signal
finds it between its ranks' exit and its own. The signal during training (passed on without torchrun's
SignalException traceback, 75 after the ranks saved) is checked on a stop of tests/training/
test_torchrun_preemption.py's training, which makes that very job; here, the same signal when torch's own code
raises another error over it. And the wrapper starts without torch: it reads from torch's source whether the agent
takes ``--signals-to-handle``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.dist.torchrun import all_finished
from tests.training.ranks import SMALL

#: name -> (lines of the ranks file, every rank finished?)
RANK_NOTES = {
    "both_finished": ([("0", "started"), ("1", "started"), ("0", "finished"), ("1", "finished")], True),
    "one_still_running": ([("0", "started"), ("1", "started"), ("0", "finished")], False),
    "none_noted": ([], False),
    "finished_without_start_note": ([("0", "finished")], False),
    "a_line_cut_short": ([("0", "started"), ("0", "finished")], True),
}


@pytest.mark.parametrize("name", sorted(RANK_NOTES))
def test_a_job_finished_when_every_started_rank_finished(name, tmp_path):
    notes, finished = RANK_NOTES[name]
    lines = [json.dumps({"rank": int(rank), "event": event}) for rank, event in notes]
    if name == "a_line_cut_short":
        lines.append('{"rank": 1, "ev')  # a rank killed while writing: not a rank that started
    (tmp_path / "ranks").write_text("\n".join(lines) + "\n")
    assert all_finished(tmp_path / "ranks") is finished
    assert all_finished(tmp_path / "absent") is False


def _job(tmp_path: Path, name: str, steps: int, monitor_interval_s: float) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_"))}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "repro.dist.torchrun", "--nproc-per-node", "1", "--monitor-interval",
             str(monitor_interval_s), "-m", "repro.training", *SMALL, "--steps", str(steps), "--save",
             str(tmp_path / name)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, log


def _signal_when(proc: subprocess.Popen, log: Path, pattern: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, log.read_text(), re.M):
        assert proc.poll() is None, f"ended before {pattern!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)


def test_a_signal_through_the_wrapper_after_the_end(tmp_path):
    # the agent looks at its rank every 2 s, so the signal comes between the rank's exit and its own
    proc, log = _job(tmp_path, "after_the_end", 2, 2)
    try:
        _signal_when(proc, log, r"^training done")
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    assert code == 0, out[-3000:]


WRAPPER_START = """
import json, sys
import repro.dist.spawn  # the submodule first, as a user's import may
import repro.dist.torchrun as wrapper
handles = wrapper.agent_handles_signal_option()
from repro.dist import spawn
print(json.dumps({"handles": handles, "spawn": [spawn.__module__, spawn.__name__],
                  "torch": sorted(name for name in sys.modules if name.split(".")[0] == "torch")}))
"""


def test_the_wrapper_starts_without_torch():
    """``python -m repro.dist.torchrun`` runs ``repro/dist/__init__.py`` and the wrapper: neither imports torch (its
    agent does, once per job), and the source's answer to "does the agent take --signals-to-handle" is the class's.
    The package's names are still there, ``spawn`` the function even where its module was imported first."""
    from torch.distributed.launcher.api import LaunchConfig

    import repro.dist
    from repro.dist import CollectiveLedger, CommGroup, SpawnError, init_parallel, read_launch_env, spawn

    run = subprocess.run([sys.executable, "-c", WRAPPER_START], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert got["torch"] == [], got["torch"]
    assert got["handles"] == ("signals_to_handle" in {field.name for field in dataclasses.fields(LaunchConfig)})
    assert got["spawn"] == ["repro.dist.spawn", "spawn"]
    assert [spawn.__module__, spawn.__name__, SpawnError.__module__] == ["repro.dist.spawn", "spawn",
                                                                          "repro.dist.spawn"]
    assert [init_parallel.__module__, read_launch_env.__module__, CommGroup.__module__, CollectiveLedger.__module__] \
        == ["repro.dist.groups", "repro.dist.launch", "repro.dist.comm", "repro.dist.ledger"]
    assert set(repro.dist.__all__) <= set(dir(repro.dist))
    with pytest.raises(AttributeError, match="no_such_name"):
        repro.dist.no_such_name


#: torchrun's agent, its run standing for ``torch.distributed.run``: a call through torch's metrics ``prof`` wrapper
#: (as the agent's ``_monitor_workers`` is) in which the SIGTERM handler's ``SignalException`` comes from the
#: wrapper's first line, ``start = time.time()``, so its ``finally`` raises ``UnboundLocalError`` over it
SIGNAL_IN_TIMER = """
import runpy, signal, sys, time
import torch.distributed.elastic.metrics.api as metrics
from torch.distributed.elastic.multiprocessing.api import SignalException
from repro.dist import torchrun_agent

def signalled_clock():
    time.time = clock
    raise SignalException(f"Process 1 got signal: {signal.SIGTERM}", sigval=signal.SIGTERM)

def run_module(*args, **kwargs):
    time.time = signalled_clock
    metrics.prof(lambda: None, group="torchelastic")()

clock, runpy.run_module = time.time, run_module
sys.exit(torchrun_agent.main(["--nproc-per-node", "1", "train.py"]))
"""


def test_a_signal_that_torch_turns_into_another_error_is_still_one_line():
    """The agent's signal, whatever torch's code raised over it on the way out (seen once in the torch-floor job: an
    ``UnboundLocalError`` from torch's metrics timer, and its traceback, on a SIGTERM to a wrapped job): one line
    and 128 + 15, as for a plain ``SignalException``."""
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_TIMER], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stderr.strip() == "repro torchrun: torchrun's agent got SIGTERM and stopped its ranks", proc.stderr
    other = subprocess.run([sys.executable, "-c", SIGNAL_IN_TIMER.replace("raise SignalException(", "raise OSError(")
                            .replace(", sigval=signal.SIGTERM)", ")")], capture_output=True, text=True, timeout=120)
    assert other.returncode == 1 and "UnboundLocalError" in other.stderr  # any other error stays torch's to report
