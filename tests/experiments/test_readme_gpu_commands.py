"""The GPU section's commands in README.md run as documented (smoke on CPU; submit as a dry run)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from repro.results import REPO_ROOT

#: one pytest-xdist group for the three test files that compile the smoke point ``toy_1rank``'s toy GPT (~60 C++
#: kernels): tests/gpu_path/test_gpu_path_experiment.py and test_gpu_session.py, and
#: tests/experiments/test_readme_gpu_commands.py. On a fresh machine the first fills TorchInductor's cache and the
#: others read it; run in two workers at once, each paid the ~100 CPU-s of g++ for the same kernels.
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")


def _gpu_commands() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## GPU experiments", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_gpu_commands_run(tmp_path):
    commands = _gpu_commands()
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["python3", "-m", "repro"]
        result = subprocess.run([sys.executable, "-m", "repro", "--results-dir", str(tmp_path), *argv[3:]],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
        if "--dry-run" in argv:
            assert "sbatch" in result.stdout and "--gpus-per-node=1" in result.stdout
