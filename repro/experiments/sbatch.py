"""The per-experiment sbatch files: ``slurm/<experiment>.sbatch``, written from the experiment's declaration.

Each file holds resources that fit the ``ci`` scale on one node and hands over to the shared ``slurm/launch.sh``.
GPUs are never requested in the file: they are a command-line option (``sbatch --gpus-per-node=N``, or
``repro submit --gpus-per-node N``) so the same file runs unchanged on CPU-only and GPU clusters.
``python scripts/write_sbatch.py`` (re)writes the files of every registered experiment.
"""

from __future__ import annotations

import math
from pathlib import Path

from repro.experiments.base import Experiment
from repro.results import REPO_ROOT

SLURM_DIR = REPO_ROOT / "slurm"

_TEMPLATE = """#!/bin/bash
# repro experiment {name} ({paper}): {title}
#
#   sbatch slurm/{name}.sbatch [SCALE]                  SCALE: ci (default) or paper; runs every point of the scale
#   sbatch --array=0-{last_paper} slurm/{name}.sbatch paper      one point per array task ({n_paper} paper point(s))
#   repro submit {name} --scale paper                   sizes nodes, tasks per node, GPUs and the array for you
#
# Points: ci: {n_ci} point(s), up to {ws_ci} rank(s); paper: {n_paper} point(s), up to {ws_paper} rank(s).{gpu_note}
# The resources below fit the ci scale on one node; override any of them on the sbatch command line.
# GPUs are never requested here: add --gpus-per-node=N when submitting. Points that need GPUs fail early
# without them, unless REPRO_DEVICE=cpu is set to run them on CPU.
#SBATCH --job-name=repro-{name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node={ws_ci}
#SBATCH --cpus-per-task=1
#SBATCH --time={time}
#SBATCH --output=repro-%x-%j.out
set -euo pipefail
exec bash "${{REPRO_ROOT:-${{SLURM_SUBMIT_DIR:-.}}}}/slurm/launch.sh" {name} "${{1:-${{REPRO_SCALE:-ci}}}}"
"""


def _hhmmss(seconds: float) -> str:
    minutes = max(10, math.ceil(seconds / 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def render(experiment: Experiment) -> str:
    """The sbatch file of ``experiment``."""
    ci, paper = experiment.points_for("ci"), experiment.points_for("paper")
    gpu_points = [p.name for p in paper if p.needs_gpu]
    gpu_note = (f"\n# {len(gpu_points)} paper point(s) need GPUs, e.g. sbatch --gpus-per-node=8 --nodes=N "
                f"slurm/{experiment.name}.sbatch paper") if gpu_points else ""
    return _TEMPLATE.format(
        name=experiment.name, paper=experiment.paper, title=experiment.title.replace("\n", " "),
        n_ci=len(ci), n_paper=len(paper), last_paper=len(paper) - 1,
        ws_ci=max(p.world_size for p in ci), ws_paper=max(p.world_size for p in paper),
        gpu_note=gpu_note, time=_hhmmss(3 * experiment.budget_s.get("ci", 600.0)),
    )


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
    return path
