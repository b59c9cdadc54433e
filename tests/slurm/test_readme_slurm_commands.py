"""The commands of slurm/README.md's first block run as documented (issue 13): every ``repro`` line without Slurm
(``repro submit`` as ``--dry-run``), and, on the local Slurm of ``slurm/local/start.sh``, the plain ``sbatch`` line
and ``repro submit ... --wait``, whose logs must be named ``repro-EXP-<job id>[_<task>].out`` under the results
folder. (The training section's commands are run by test_train_requeue.py, README.md's by the tests named there.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.results import REPO_ROOT
from tests.slurm.local_slurm import slurm_state
from tests.readme_blocks import SLURM_README, commands



def _commands() -> list[list[str]]:
    """The first bash block of slurm/README.md, one argv per line (comments dropped)."""
    return [shlex.split(line) for line in commands(SLURM_README)]


def _repro(argv: list[str], results: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro", "--results-dir", str(results), *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _has_slurm() -> bool:
    return any(s.startswith(("idle", "mix", "alloc")) for s in slurm_state().split())


def test_the_block_holds_the_commands_this_test_knows():
    kinds = [argv[:2] for argv in _commands()]
    assert kinds == [["sbatch", "slurm/zero_memory_tables.sbatch"], ["repro", "submit"], ["repro", "submit"],
                     ["repro", "submit"], ["repro", "list"]], kinds


def test_repro_commands_run_without_slurm(tmp_path, monkeypatch):
    for argv in _commands():
        if argv[0] != "repro":
            assert (REPO_ROOT / argv[1]).is_file(), argv  # the sbatch line: run below, on the local Slurm
            continue
        args = argv[1:]
        if args[0] == "submit":
            args = [a for a in args if a != "--wait"] + (["--dry-run"] if "--dry-run" not in args else [])
        result = _repro(args, tmp_path)
        assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr[-2000:]}"
        if args[0] == "submit":
            assert result.stdout.startswith("sbatch command (") and "--parsable" in result.stdout, result.stdout


@pytest.mark.slurm
def test_sbatch_and_submit_wait_on_the_local_slurm(tmp_path):
    if not _has_slurm():
        pytest.skip("no local Slurm is running (start it with slurm/local/start.sh)")
    results = tmp_path / "results"
    (results / "slurm-logs").mkdir(parents=True)
    plain = next(argv for argv in _commands() if argv[0] == "sbatch")
    # as documented, but with the results (and so the log, as slurm/README.md says) under a scratch folder
    env = {**os.environ, "REPRO_RESULTS_DIR": str(results)}
    job = subprocess.run([plain[0], "--parsable", f"--output={results}/slurm-logs/%x-%j.out", *plain[1:]],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip().split(";")[0]
    waited = next(argv for argv in _commands() if "--wait" in argv)
    result = _repro([*waited[1:], "--timeout", "240", "--progress-every", "20"], results, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^job \d+: submitted -> (PENDING|RUNNING) \(\d+ s\)$", result.stdout, re.M), result.stdout
    completed = r"^job \d+: (RUNNING|COMPLETING) -> COMPLETED \(exit code 0:0\)"  # squeue may show COMPLETING
    assert re.search(completed, result.stdout, re.M), result.stdout
    submitted = re.search(r"^submitted job (\d+) ", result.stdout, re.M).group(1)
    log = results / "slurm-logs" / f"repro-zero_memory_tables-{submitted}.out"
    assert f"log {log}" in result.stdout, result.stdout
    deadline = time.monotonic() + 120
    plain_log = results / "slurm-logs" / f"repro-zero_memory_tables-{job_id}.out"
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"plain sbatch job {job_id} still queued"
        time.sleep(1)
    assert plain_log.exists() and log.exists(), sorted(p.name for p in (results / "slurm-logs").iterdir())
