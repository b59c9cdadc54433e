"""The per-experiment sbatch files: ``slurm/<experiment>.sbatch``, written from the experiment's declaration.

One file per experiment, handing over to the shared ``slurm/launch.sh``. Its ``#SBATCH`` header fits the
experiment's CPU scale (``ci``, else ``smoke``) on one node: ``sbatch slurm/<experiment>.sbatch`` runs every point
of that scale one after the other. Its comment block lists, for every declared scale, the exact sbatch commands
whose options come from the points' resources (:func:`repro.harness.resources.jobs_for`, the same jobs
``repro submit`` builds), so ``sbatch ... slurm/<experiment>.sbatch paper`` as written there gets the paper
resources; a job started at another scale than the header's says so in its log. The header never requests GPUs,
so the same file runs on CPU-only clusters; GPU scales get theirs from the listed options.

Every file is preemptible (:data:`PREEMPTION_DIRECTIVES`, also in the hand-written ``slurm/train.sbatch``): Slurm
sends SIGUSR1 to the batch shell two minutes before the time limit, ``slurm/launch.sh`` passes it on to the running
step and requeues the job when the step stops for it, and every attempt appends to the same log,
``results/slurm-logs/<job name>-<job id>.out``, or ``<job name>-<array job id>_<task>.out`` for an array task
(:data:`LOG_DIRECTIVE`, and the ``--output`` of the array commands listed in the file; the folder is in the
repository, since Slurm opens the log before the script runs and does not create folders).
``python scripts/write_sbatch.py`` (re)writes the files of every registered experiment.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from repro.experiments.base import SCALES, Experiment
from repro.harness.resources import Overrides, cpu_scale_of, envelope, format_time, jobs_for
from repro.assets import launcher, slurm_dir

SLURM_DIR = slurm_dir()

#: Requeue instead of failing when preempted; SIGUSR1 to the batch shell (``B:``) 120 s before the time limit, which
#: launch.sh passes on to the step (a training saves and exits 75, launch.sh runs ``scontrol requeue``); a requeued
#: attempt appends to the log of the first instead of truncating it.
PREEMPTION_DIRECTIVES = ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --open-mode=append")
#: Log names, the same for ``repro submit`` and plain sbatch: ``repro-<experiment>-<array job id>_<task>.out`` for an
#: array task, ``repro-<experiment>-<job id>.out`` for a single job (the job name is ``repro-<experiment>``; ``%a``
#: outside an array is Slurm's NO_VAL, 4294967294, hence the two).
ARRAY_LOG_NAME, JOB_LOG_NAME = "%x-%A_%a.out", "%x-%j.out"
#: Relative to the submit directory (the checkout): an #SBATCH line cannot read $REPRO_RESULTS_DIR, so a plain sbatch
#: that sends results elsewhere passes --output itself (slurm/README.md); ``repro submit`` always does.
LOG_DIR = "results/slurm-logs"
LOG_DIRECTIVE = f"#SBATCH --output={LOG_DIR}/{JOB_LOG_NAME}"


def log_name(array: bool) -> str:
    return ARRAY_LOG_NAME if array else JOB_LOG_NAME

_HEAD = """#!/bin/bash
# repro experiment {name} ({paper}): {title}
#
# The #SBATCH lines below fit the {cpu} scale ({n_cpu} point(s), one after the other on one node):
#   sbatch slurm/{name}.sbatch
# Every scale, with the resources its points declare (nodes, tasks per node, GPUs per node, CPUs per task, memory
# per node, time), as the jobs that `repro submit EXP --scale SCALE` submits (see slurm/README.md):
"""

_TAIL = """# The #SBATCH lines never ask for GPUs (the file runs on CPU-only clusters): GPU scales get them from the options
# above. A point that needs GPUs fails early without them, unless REPRO_DEVICE=cpu is set to run it on CPU.
#SBATCH --job-name=repro-{name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks}
#SBATCH --cpus-per-task={cpus}
#SBATCH --mem={mem}
#SBATCH --time={time}
{log}
{preemption}
set -euo pipefail
SCALE="${{1:-${{REPRO_SCALE:-{cpu}}}}}"
if [ "$SCALE" != {cpu} ]; then
  echo "repro: scale $SCALE runs with the resources given on the sbatch command line; the #SBATCH lines of \
slurm/{name}.sbatch fit the {cpu} scale only (its comments list the options of every scale; repro submit sizes them)" >&2
fi
exec bash "${{REPRO_ROOT:-${{SLURM_SUBMIT_DIR:-.}}}}/slurm/launch.sh" {name} "$SCALE"
"""


def scale_commands(experiment: Experiment, scale: str) -> list[str]:
    """``sbatch <options> slurm/<name>.sbatch <scale>``, one per job that runs the scale (as ``repro submit``); an
    array also names its log ``<job name>-<array job id>_<task>.out``, as ``repro submit`` does."""
    return [f"sbatch {' '.join(job.options())}"
            + (f" --output={LOG_DIR}/{ARRAY_LOG_NAME}" if job.array else "")
            + f" slurm/{experiment.name}.sbatch {scale}"
            for job in jobs_for(experiment, scale)]


def _scale_block(experiment: Experiment, scale: str) -> str:
    points = experiment.points_for(scale)
    gpu = sum(p.needs_gpu for p in points)
    try:
        commands = scale_commands(experiment, scale)
    except ValueError as err:  # inconsistent declaration: visible in the file, and tests fail on it
        return f"#   {scale}: CANNOT BE SIZED: {err}\n"
    what = f"{len(points)} point(s)" + (f", {gpu} needing GPUs" if gpu else "")
    jobs = "1 job" if len(commands) == 1 else f"{len(commands)} jobs, one per resource shape"
    return f"#   {scale}: {what}; {jobs}\n" + "".join(f"#     {command}\n" for command in commands)


def render(experiment: Experiment) -> str:
    """The sbatch file of ``experiment``."""
    cpu = cpu_scale_of(experiment)
    cpu_points = experiment.points_for(cpu)
    header = envelope(experiment, cpu, cpu_points, Overrides(cpu=True), one_after_the_other=True)
    blocks = "".join(_scale_block(experiment, s) for s in SCALES if s in experiment.points)
    return (_HEAD.format(name=experiment.name, paper=experiment.paper, title=experiment.title.replace("\n", " "),
                         cpu=cpu, n_cpu=len(cpu_points))
            + blocks
            + _TAIL.format(name=experiment.name, cpu=cpu, nodes=header.nodes, tasks=header.tasks_per_node,
                           cpus=header.cpus_per_task, mem=f"{header.mem_gib}G" if header.mem_gib else "0",
                           time=format_time(header.time_min), log=LOG_DIRECTIVE,
                           preemption="\n".join(PREEMPTION_DIRECTIVES)))


def sbatch_path(name: str, slurm_dir: Path = SLURM_DIR) -> Path:
    return slurm_dir / f"{name}.sbatch"


def write(experiment: Experiment, slurm_dir: Path = SLURM_DIR, *, overwrite: bool = True) -> Path:
    """Write ``slurm/<name>.sbatch`` (kept as it is when it exists and ``overwrite`` is False)."""
    path = sbatch_path(experiment.name, slurm_dir)
    if path.exists() and not overwrite:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(experiment), encoding="utf-8")
    path.chmod(0o755)
    launch = slurm_dir / "launch.sh"
    if not launch.exists():  # installed from a wheel: the batch file runs ./slurm/launch.sh, the wheel's copy
        shutil.copyfile(launcher(), launch)
        launch.chmod(0o755)
    return path
