"""A rank that hangs anywhere ends the job within ``--timeout-s`` + 15 s, and the line says who and where (issue 27).

Each job is two independent ranks (as srun starts them: no parent that kills the others), pp=2. Rank 1 is stopped
with SIGSTOP (as a frozen node or a debugger stops it): by the test during a step, or by itself in an evaluation, a
save or a load (tests/training/stopping_rank_job.py). A stopped rank cannot say anything; rank 0, waiting for it in
a collective of one of its groups, must give up after ``--timeout-s``, exit 124 and print one line naming itself,
what it was doing and rank 1. Timeouts are short (5 s); the bound is the issue's: ``--timeout-s`` + 15 s.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from tests.training.forked import ForkedRanks  # rank processes forked from a warm server: see forked.py
from tests.training.ranks import Ranks

TIMEOUT_S = 5
JOB = ["-m", "tests.training.stopping_rank_job"]


def _exit_after_stop(job: Ranks, stopped_at: float | None = None) -> tuple[int, float]:
    """Rank 0's exit code, and how long after rank 1 stopped it exited (wall clock: ``stopped_at``, or the time
    that rank 1 printed before stopping itself). Rank 1 is left stopped until it is killed."""
    try:
        code = job.procs[0].wait(timeout=120)
        exited = time.time()
    finally:
        job.kill()  # SIGKILL ends a stopped process too
    if stopped_at is None:
        stopped = re.search(r"rank 1: stopping in \w+ at ([0-9.]+)", job.output(1))
        assert stopped, f"rank 1 never stopped; rank 0 exited with {code}:\n{job.all_output()}"
        stopped_at = float(stopped.group(1))
    return code, exited - stopped_at


def _assert_named(job: Ranks, code: int, elapsed: float, doing: str, *,
                  heard: str = r"not heard from for \d+ s") -> None:
    """Rank 0 exited 124 within the bound, with one line naming itself, ``doing`` (a regular expression), rank 1, and
    how rank 1 was last heard of (``heard``, a regular expression)."""
    output = job.output(0)
    print(f"rank 0 exited with {code} {elapsed:.1f} s after rank 1 stopped (--timeout-s {TIMEOUT_S})")
    assert code == 124, job.all_output()
    assert elapsed < TIMEOUT_S + 15, f"{elapsed:.1f} s:\n{job.all_output()}"
    assert re.search(rf"\[watchdog\] rank 0: no progress for \d+ s in '{doing}' \(.*--timeout-s {TIMEOUT_S}\); "
                     rf"waiting for rank 1 \({heard}.*exiting with 124", output), job.all_output()
    assert "Traceback" not in output, output


def test_a_rank_stopped_in_a_step_ends_the_job_within_timeout_plus_15_s(tmp_path):
    job = ForkedRanks(tmp_path, "stop", 2, ["--steps", "100000", "--pp", "2"], timeout_s=TIMEOUT_S)
    try:
        job.wait_for(r" iteration +2/")
        job.procs[1].send_signal(signal.SIGSTOP)
        stopped_at = time.time()
    except BaseException:
        job.kill()
        raise
    # the step after the last logged one, or the preemption agreement that follows every step
    _assert_named(job, *_exit_after_stop(job, stopped_at), r"(step|agreeing on preemption after iteration) \d+")


def test_a_rank_stopped_in_an_evaluation_ends_the_job_naming_it(tmp_path):
    job = ForkedRanks(tmp_path, "evaluation", 2, ["--steps", "1000", "--pp", "2", "--eval-interval", "2",
                                                  "--stop-rank", "1", "--stop-in", "evaluation", "--stop-at", "2"],
                      timeout_s=TIMEOUT_S, program=JOB)
    _assert_named(job, *_exit_after_stop(job), r"evaluation at iteration 2: batch 2/2")


def test_a_rank_stopped_in_a_save_then_in_a_load_ends_the_job_naming_it(tmp_path):
    """Rank 1 stops while writing its file of the second save (iteration 4); the rerun loads the first (iteration
    2), and rank 1 stops while reading its file. The rerun starts once the first save is published, while the first
    job waits out its timeout (the second save is never published: its rank 1 is stopped in it)."""
    ckpt = str(tmp_path / "ckpt")
    save = ForkedRanks(tmp_path, "save", 2, ["--steps", "1000", "--pp", "2", "--save", ckpt, "--save-interval",
                                             "2", "--stop-rank", "1", "--stop-in", "save", "--stop-at", "2"],
                       timeout_s=TIMEOUT_S, program=JOB)
    try:
        save.wait_for(r"saved checkpoint at iteration\s+2 ")
        load = ForkedRanks(tmp_path, "load", 2, ["--steps", "1000", "--pp", "2", "--load", ckpt,
                                                 "--stop-rank", "1", "--stop-in", "load"], timeout_s=TIMEOUT_S,
                           program=JOB)
    except BaseException:
        save.kill()
        raise
    try:
        _assert_named(save, *_exit_after_stop(save),
                      "saving checkpoint iteration 4: agreeing that every rank wrote its file")
    except BaseException:
        load.kill()
        raise
    # the loading rank stops as it starts, maybe before its first heartbeat (every second) reached the store: seen
    # once on a loaded machine as "(never heard from)", which names rank 1 as well
    _assert_named(load, *_exit_after_stop(load), "loading checkpoint: agreeing that every rank read its files",
                  heard=r"(not heard from for \d+ s|never heard from)")


#: ``repro train`` that first notes when its modules are loaded (wall clock, in the file $LOADED_AT), so that the
#: time to the exit counts the rendezvous, not the seconds a loaded machine takes to import torch
STAMPED = ("import os, sys, time; from repro.training.cli import main; "
           "open(os.environ['LOADED_AT'], 'w').write(repr(time.time())); sys.exit(main(sys.argv[1:]))")


def _lone_ranks(tmp: Path, cases: tuple[tuple[int, str], ...]) -> list[tuple[int, str, float]]:
    """One rank of two started alone per case, all at once (each only waits): nobody answers at ``addr`` (rank 1),
    or nobody joins (rank 0). Each case has a port of its own. Returns each one's exit code, output, and the seconds
    from its modules loaded to its exit."""
    import os
    import subprocess
    import sys

    from repro.dist.spawn import free_port

    runs, outputs = [], [tmp / f"lone{index}.log" for index in range(len(cases))]
    for index, (rank, addr) in enumerate(cases):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR=addr,
                   MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", LOADED_AT=str(tmp / f"loaded{index}"))
        with open(outputs[index], "w") as out:
            runs.append(subprocess.Popen([sys.executable, "-c", STAMPED, "--steps", "2", "--layers", "2", "--hidden",
                                          "32", "--timeout-s", str(TIMEOUT_S)], env=env, stdout=out,
                                         stderr=subprocess.STDOUT))
    exited: dict[int, float] = {}
    deadline = time.monotonic() + 180
    try:
        while len(exited) < len(runs):  # each one's exit time, whichever ends first
            for index, proc in enumerate(runs):
                if index not in exited and proc.poll() is not None:
                    exited[index] = time.time()
            assert time.monotonic() < deadline, [path.read_text() for path in outputs]
            time.sleep(0.05)
    finally:
        for proc in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for index, proc in enumerate(runs):
        loaded = tmp / f"loaded{index}"
        elapsed = exited[index] - float(loaded.read_text()) if loaded.exists() else float("inf")
        results.append((proc.returncode, outputs[index].read_text(), elapsed))
    return results


def test_a_rendezvous_that_never_happens_is_one_line_and_124(tmp_path):
    """--help promises it: the start-up rendezvous is bounded by --timeout-s too (it was exit 1 with a C++ stack
    dump and a traceback, ~75 lines). The three cases run at once: each only waits."""
    cases = ((1, "127.0.0.1", "rank 1: no rendezvous at MASTER_ADDR=127.0.0.1"),
             (1, "nosuchhost.invalid", "the host does not resolve"),
             (0, "127.0.0.1", "rank 0: only 1 of 2 ranks joined the rendezvous"))
    for (code, output, elapsed), (_, _, text) in zip(_lone_ranks(tmp_path, tuple(case[:2] for case in cases)), cases):
        assert code == 124, output
        assert output.strip().count("\n") == 0 and text in output and "--timeout-s 5" in output, output
        assert elapsed < TIMEOUT_S + 15, f"{elapsed:.1f} s: {output}"


def test_a_step_that_is_only_slow_says_so():
    """One rank, no peer to blame: the watchdog's line says the micro-batch may be slow and names --watchdog-s
    (--seq-len 100000 on a CPU was reported as a bare 'no progress' hang). Forked from the warm server: the
    watchdog's exit, not the interpreter's start, is tested (the rendezvous test above keeps real interpreters)."""
    import os

    from tests.training import forked

    # one thread: the step only has to outlast the watchdog, not to use every core while it does
    proc = forked.train(["--steps", "1", "--layers", "2", "--hidden", "32", "--seq-len", "30000", "--watchdog-s", "2"],
                        timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert "if one micro-batch is only slow (--seq-len 30000" in proc.stderr and "raise --watchdog-s" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
