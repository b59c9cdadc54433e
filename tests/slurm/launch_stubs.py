"""Stand-ins for running slurm/launch.sh without a cluster: ``srun`` (runs its command here, and can log its
options), ``scontrol`` (records what it is asked), a stand-in trainer, and an environment of one allocation."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from repro.results import REPO_ROOT

LAUNCH = REPO_ROOT / "slurm" / "launch.sh"
FAKE = REPO_ROOT / "tests" / "experiments" / "fake_experiments.py"
JOB = "4242"

#: A stand-in for ``python -m repro.training``: records its arguments, says it is ready, then exits with
#: $FAKE_RC, or with 75 as soon as SIGUSR1 or SIGTERM arrives when $FAKE_WAIT is set.
STAND_IN = """
import json, os, signal, sys, time
out = os.environ["FAKE_OUT"]
got = []
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda signum, frame: got.append(signal.Signals(signum).name))
with open(out + ".args", "w") as handle:
    json.dump(sys.argv[1:], handle)
open(out + ".ready", "w").close()
deadline = time.monotonic() + 30
while os.environ.get("FAKE_WAIT") and not got and time.monotonic() < deadline:
    time.sleep(0.05)
if got:
    open(out + ".signal", "w").write(got[0])
    sys.exit(75)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def make_stubs(tmp_path: Path) -> Path:
    """bin/srun (drops its options, execs the command; appends its options to $SRUN_LOG when set, and runs nothing
    when SRUN_RUN=0: it would start one task where a real srun starts a step's many), bin/scontrol
    (answers `show hostnames` and `show job`, logs anything else), bin/fakepy (the stand-in trainer, exec'd so that
    srun's pid is the trainer's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "srun", '#!/bin/bash\nopts=()\nwhile [[ "$1" == --* ]]; do opts+=("$1"); shift; done\n'
               '[ -z "${SRUN_LOG:-}" ] || echo "${opts[*]}" >> "$SRUN_LOG"\n'
               '[ "${SRUN_RUN:-1}" = 1 ] || exit 0\nexec "$@"\n')
    executable(bin_dir / "scontrol", '#!/bin/bash\n'
                'case "$*" in\n'
                '  "show hostnames"*) echo localhost ;;\n'
                '  *"show job"*) echo "JobId=$SLURM_JOB_ID JobState=${FAKE_JOB_STATE:-RUNNING} '
                'Reason=${FAKE_REASON:-None} Restarts=0" ;;\n'
                '  *) echo "$*" >> "$SCONTROL_LOG" ;;\n'
                'esac\n')
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    # launch.sh runs "$REPRO_PYTHON -m repro.training ARGS": the stand-in drops "-m repro.training"
    executable(bin_dir / "fakepy", f'#!/bin/bash\nshift 2\nexec {sys.executable} {script} "$@"\n')
    return bin_dir


def stub_env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", REPRO_ROOT=str(REPO_ROOT), REPRO_RESULTS_DIR=str(tmp_path / "res"),
               REPRO_EXTRA_EXPERIMENTS=str(FAKE), SCONTROL_LOG=str(tmp_path / "scontrol.log"),
               FAKE_OUT=str(tmp_path / "fake"), SLURM_JOB_ID=JOB, SLURM_JOB_NAME="repro-train",
               SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="2",
               SLURM_CPUS_ON_NODE="2", REPRO_MASTER_PORT=str(29100 + os.getpid() % 800))
    env.update(extra)
    return env
