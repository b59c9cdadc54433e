"""scripts/torch_versions.sh (issue 28): which versions it tests and how, and that pyproject's floor was proven."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from repro.results import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "torch_versions.sh"


def _floor() -> str:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    return re.search(r'"torch>=([0-9.]+)"', text).group(1)


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd=REPO_ROOT)


def test_dry_run_names_each_version_its_venv_and_lifts_the_pip_cap(tmp_path):
    result = _run("--dry-run", "2.4.1", "2.15.0", env={"REPRO_VENV_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    for version in ("2.4.1", "2.15.0"):
        assert f"PIP_CONFIG_FILE=/dev/null {tmp_path}/torch-{version}/bin/python -m pip install --quiet " \
               f"torch=={version}" in result.stdout
        assert f"{tmp_path}/torch-{version}/bin/python -m pytest -q" in result.stdout
    assert not any(tmp_path.iterdir())  # a dry run creates nothing


def test_default_versions_are_pyprojects_floor_and_the_registrys_newest(tmp_path):
    """The newest version is what `pip index versions torch` lists first (a stand-in pip answers here)."""
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\n[ "$PIP_CONFIG_FILE" = /dev/null ] || exit 3\n'
                    'echo "torch (9.1.0)"\necho "Available versions: 9.1.0, 9.0.0"\n')
    stub.chmod(0o755)
    result = _run("--dry-run", env={"REPRO_PYTHON": str(stub), "REPRO_VENV_DIR": str(tmp_path / "v")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"torch versions: {_floor()} 9.1.0")
    floor = _run("--dry-run", "--floor", env={"REPRO_PYTHON": str(stub), "REPRO_VENV_DIR": str(tmp_path / "v")})
    assert floor.stdout.splitlines()[0].startswith(f"torch versions: {_floor()} (")  # CI's torch-range job


def test_bad_version_is_one_line_and_exit_2():
    result = _run("2.4")
    assert result.returncode == 2
    assert result.stderr.strip() == ("torch_versions: error: '2.4' is not a torch version like 2.4.1 "
                                     "(major.minor.patch), --floor, --newest, --dry-run or --")


@pytest.mark.skipif(os.environ.get("REPRO_TORCH_VERSIONS_RUN") == "1",
                    reason="run by scripts/torch_versions.sh: this run is the proof being made")
def test_pyprojects_floor_names_a_version_whose_whole_suite_passed():
    """pyproject's floor is one the committed runs of this script prove: the whole suite, no failure."""
    floor = _floor()
    assert re.fullmatch(r"\d+\.\d+\.\d+", floor), f"pyproject's torch floor {floor!r} must name a patch release"
    runs = [json.loads(line) for line in (REPO_ROOT / "results" / "torch_versions.jsonl").read_text().splitlines()
            if line.strip()]
    proven = [run for run in runs if run["torch"].split("+")[0] == floor and run["exit_code"] == 0
              and run.get("failed", 0) == 0 and run.get("passed", 0) > 1000]
    assert proven, f"no passing whole-suite run of torch {floor} in results/torch_versions.jsonl"
