"""slurm/README.md's batch script of one's own with torchrun (issue 27), run as written with stand-ins for ``srun``
(runs its command here) and ``scontrol`` (names this host, records a requeue): Slurm's ``--signal=USR1@120``
reaches every process of the step; the ranks save, the step ends with 75 and the script requeues the job; the next
attempt resumes and finishes without a requeue."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from repro.dist.torchrun import children
from repro.results import REPO_ROOT
from tests.training.ranks import iterations
from tests.readme_blocks import SLURM_README, bash_blocks



def _recipe() -> str:
    return bash_blocks(SLURM_README, "### Under torchrun")[0]


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *_descendants(child)]
    return found


def test_the_recipe_requeues_when_preempted_and_resumes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "srun", '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    _executable(bin_dir / "scontrol", '#!/bin/bash\ncase "$*" in\n  "show hostnames"*) echo localhost ;;\n'
                                      '  *) echo "$*" >> "$SCONTROL_LOG" ;;\nesac\n')
    _executable(bin_dir / "python", f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    script = tmp_path / "job.sbatch"
    script.write_text(_recipe())
    job_id = str(30000 + os.getpid() % 10000)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "MASTER_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(REPO_ROOT), SCONTROL_LOG=str(tmp_path / "scontrol.log"),
               SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1")
    log = tmp_path / "job.out"
    with open(log, "w") as out:
        first = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not re.search(r"^ \[[^]]+\] iteration +3/", log.read_text(), re.M):
        assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    for pid in _descendants(first.pid):  # --signal=USR1@120: every process of the step, not the batch shell
        os.kill(pid, signal.SIGUSR1)
    assert first.wait(timeout=120) == 75, log.read_text()[-3000:]
    assert (tmp_path / "scontrol.log").read_text().splitlines() == [f"requeue {job_id}"]
    ckpt = tmp_path / "ckpt" / f"job-{job_id}"
    stopped = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert 3 <= stopped < 40
    again = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**env, "SLURM_RESTART_COUNT": "1"},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resumed from checkpoint" in again.stdout and "training done: iteration 40" in again.stdout
    assert (tmp_path / "scontrol.log").read_text().splitlines() == [f"requeue {job_id}"]
    assert [r["iteration"] for r in iterations(ckpt / "log.jsonl")] == list(range(1, 41))
