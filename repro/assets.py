"""Where the files beside the packages are: in a checkout, where they are; installed from a wheel, the copies it
carries (``repro.slurm_assets``, ``repro.paper_assets``: see pyproject.toml) and the current directory.

A wheel installs the packages into site-packages, away from the checkout's ``slurm/`` (the launcher and the batch
files) and ``results/paper/`` (the papers' claims). Outside a checkout the project's working folder is the current
directory: results go to ``./results`` (:func:`repro.results.results_dir`), batch files are written to
``./slurm`` (with a copy of the launcher they call) when a job is submitted.
"""

from __future__ import annotations

from pathlib import Path

from repro.results import REPO_ROOT, in_checkout


def _shipped(folder: str) -> Path:
    """A folder the wheel installs inside the repro package (a namespace package: no __init__.py of its own)."""
    return Path(__file__).resolve().parent / folder


def project_root() -> Path:
    """The checkout, or (installed) the current directory: where slurm/ and results/ are, where sbatch runs."""
    return REPO_ROOT if in_checkout() else Path.cwd()


def paper_dir() -> Path:
    """The papers' claims and tables: ``results/paper/`` of the checkout, else the wheel's copy."""
    return REPO_ROOT / "results" / "paper" if in_checkout() else _shipped("paper_assets")


def slurm_dir() -> Path:
    """Where the batch files are read and written: the checkout's ``slurm/``, else ``./slurm``."""
    return project_root() / "slurm"


def launcher() -> Path:
    """``launch.sh``, which every batch file runs: the checkout's, else the wheel's copy."""
    return REPO_ROOT / "slurm" / "launch.sh" if in_checkout() else _shipped("slurm_assets") / "launch.sh"
