"""Whether the local Slurm of ``slurm/local/start.sh`` answers (one node, or ``--nodes N`` emulated ones); the Slurm
integration tests skip without it, the multi-node ones also with fewer nodes than they need."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


#: set once ``sinfo`` failed or timed out in this process: with Slurm installed but not running, each call waits
#: ~9 s for the controller, and five test modules ask at collection (45 s of every pytest worker's start)
_no_answer = False


def slurm_state() -> str:
    """``sinfo``'s node states, or "" when there is no Slurm (or it does not answer in 10 s, now or earlier in this
    process)."""
    global _no_answer
    if _no_answer or shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return ""
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        proc = None
    if proc is None or proc.returncode != 0:
        _no_answer = True
        return ""
    return proc.stdout.strip()


def usable_nodes() -> list[str]:
    """The names of the nodes that are idle, mixed or allocated ([] when there is no Slurm)."""
    if not slurm_state():
        return []
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return []
    lines = [line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2]
    return sorted({name for name, state in lines if state.startswith(("idle", "mix", "alloc"))})


def skip_without_local_slurm(nodes: int = 1) -> None:
    """Skip the calling test module unless ``nodes`` nodes (default 1) are idle, mixed or allocated."""
    if nodes <= 1:
        if not any(s.startswith(("idle", "mix", "alloc")) for s in slurm_state().split()):
            pytest.skip("no local Slurm is running (start it with slurm/local/start.sh)", allow_module_level=True)
        return
    found = usable_nodes()
    if len(found) < nodes:
        pytest.skip(f"needs a local Slurm of {nodes} nodes, found {len(found)} usable "
                    f"(start it with slurm/local/start.sh --nodes {nodes})", allow_module_level=True)


def sbatch(argv: list[str], env: dict[str, str]) -> str:
    """Run ``sbatch --parsable ...`` from the checkout; the job id it printed."""
    from repro.results import REPO_ROOT

    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def read_log(path: Path) -> str:
    """A job log as it is now ("" before Slurm has opened it)."""
    return path.read_text(errors="replace") if path.exists() else ""


def restarts(job_id: str) -> int:
    """How often Slurm requeued the job (``Restarts=`` of scontrol; -1 when it no longer knows the job)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True).stdout
    found = re.search(r"\bRestarts=(\d+)", out)
    return int(found.group(1)) if found else -1


#: Megatron's log line of one iteration (``repro train``'s rank 0): iteration, total, lm loss
ITERATION = re.compile(r"^ \[[^]]+\] iteration\s+(\d+)/\s*(\d+) \|.*\| lm loss: ([0-9.eE+-]+) \|", re.M)


def losses(log: str) -> dict[int, float]:
    """``{iteration: lm loss}`` of a training log."""
    return {int(i): float(loss) for i, _, loss in ITERATION.findall(log)}


def check_resumed_like_straight(first: str, second: str, straight: str, steps: int = 40) -> None:
    """The first attempt stopped at iteration k >= 3 and saved it, the second went on from k + 1 to ``steps``, and
    together they printed the same losses as a job that was never interrupted, to the last digit."""
    log = first + second
    assert "resumed from checkpoint" in second and f"training done: iteration {steps}" in second, log
    before, after = sorted(losses(first)), sorted(losses(second))
    assert before == list(range(1, len(before) + 1)) and len(before) >= 3, log
    assert after == list(range(len(before) + 1, steps + 1)), log
    assert losses(log) == losses(straight) and len(losses(straight)) == steps
    final = re.findall(rf"training done: iteration {steps} lm loss ([0-9.eE+-]+)", log)
    assert final and final == re.findall(rf"training done: iteration {steps} lm loss ([0-9.eE+-]+)", straight)
