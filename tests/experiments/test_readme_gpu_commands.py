"""The GPU section's commands in README.md run as documented (smoke on CPU; submit as a dry run)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from repro.results import REPO_ROOT

#: the toy GPT of the smoke point ``toy_1rank`` is compiled in one worker: why, in
#: tests/gpu_path/test_gpu_path_experiment.py
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")


def test_readme_gpu_commands_run(readme_gpu_smoke, tmp_path):
    commands, smoke, _ = readme_gpu_smoke  # the first command, run once for the session (tests/conftest.py)
    assert len(commands) == 2
    assert smoke.returncode == 0, f"{commands[0]}: {smoke.stderr[-2000:]}"
    for command in commands[1:]:
        argv = shlex.split(command)
        assert argv[:3] == ["python3", "-m", "repro"]
        result = subprocess.run([sys.executable, "-m", "repro", "--results-dir", str(tmp_path), *argv[3:]],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
        if "--dry-run" in argv:
            assert "sbatch" in result.stdout and "--gpus-per-node=1" in result.stdout
