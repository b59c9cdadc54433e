"""Shared by the bad-input tables (test_bad_inputs*.py): run a command in this process or as a real process and
hold its stderr to one line that names the value, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from typing import Callable, Sequence

#: launch variables a test process may have inherited; every bad-input case starts without them
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST")


def one_line(err: str) -> str:
    """The only non-blank line of ``err``; fails on a traceback or on several lines."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{err}"
    return lines[0]


def run_in_process(entry: Callable[[Sequence[str]], int], argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of ``entry(argv)``; argparse's SystemExit counts as its exit code."""
    try:
        code = entry(argv)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def run_process(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str]:
    """(exit code, stderr) of ``python -m repro ARGV`` as a real process, bounded by ``timeout`` (no hang)."""
    proc = subprocess.run([sys.executable, "-m", "repro", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc.returncode, proc.stderr


def assert_refused(argv: Sequence[str], code: int, err: str, text: str) -> None:
    """Exit code 2 and one line with ``error`` and ``text`` (the bad value) in it."""
    assert code == 2, f"{list(argv)}: exit code {code}\n{err}"
    line = one_line(err)
    assert text in line and "error" in line, f"{list(argv)}: {line!r} does not name {text!r}"
