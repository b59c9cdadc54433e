"""The GPU section's commands in README.md run as documented (smoke on CPU; submit as a dry run)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from repro.results import REPO_ROOT

#: the toy GPT of the smoke point ``toy_1rank`` is compiled in one worker: why, in
#: tests/gpu_path/test_gpu_path_experiment.py
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
