"""Whether the one-node Slurm of ``slurm/local/start.sh`` answers; the Slurm integration tests skip without it."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def slurm_state() -> str:
    """``sinfo``'s node states, or "" when there is no Slurm (or it does not answer in 10 s)."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return ""
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def skip_without_local_slurm() -> None:
    """Skip the calling test module unless a node is idle, mixed or allocated."""
    if not any(s.startswith(("idle", "mix", "alloc")) for s in slurm_state().split()):
        pytest.skip("no local Slurm is running (start it with slurm/local/start.sh)", allow_module_level=True)
