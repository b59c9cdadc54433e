"""repro installed from a wheel, outside the checkout (issue 34): the wheel carries what it needs beside the packages
(the Slurm launcher and batch files, the papers' claims), results go to the current directory (never next to
site-packages), and the commands a user starts with work there: repro list, a ci experiment, the claims report,
repro submit --dry-run. Also: every package folder is listed in pyproject.toml (its packages are listed, not found,
since two of them are folders outside repro/)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from repro.results import REPO_ROOT


def test_every_package_folder_is_listed():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO_ROOT).parts) for top in ("repro", "evals")
               for p in (REPO_ROOT / top).rglob("__init__.py")}
    assert folders <= listed, f"package folders missing from pyproject.toml: {sorted(folders - listed)}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv (seeing this machine's torch and other dependencies) with only the wheel's repro in it."""
    tmp = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO_ROOT), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp / "dist"), "-q"], capture_output=True, text=True, timeout=300)
    if built.returncode != 0 and "bdist_wheel" in built.stderr:
        pytest.skip("this Python cannot build wheels without network (setuptools lacks bdist_wheel)")
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp / "dist").glob("repro_llm_systems-*.whl"))
    venv.create(tmp / "venv", system_site_packages=True, with_pip=True)
    python = tmp / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "venv"


def _run(venv_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REPRO_RESULTS_DIR", "REPRO_ROOT")}
    return subprocess.run([str(venv_dir / "bin" / "repro"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def test_the_wheel_works_outside_the_checkout(installed, tmp_path):
    where = subprocess.run([str(installed / "bin" / "python"), "-c", "import repro; print(repro.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert str(installed) in where.stdout, where.stdout + where.stderr  # the wheel's repro, not the checkout's
    listed = _run(installed, tmp_path, "list")
    assert listed.returncode == 0 and "zero_memory_tables" in listed.stdout, listed.stderr
    ran = _run(installed, tmp_path, "run", "zero_memory_tables")
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert list((tmp_path / "results" / "runs" / "zero_memory_tables").glob("*.jsonl"))
    site = next((installed / "lib").glob("python*/site-packages"))
    assert not (site / "results").exists()  # never next to site-packages
    claims = _run(installed, tmp_path, "claims")  # the papers' claims come from the wheel
    assert claims.returncode == 0 and (tmp_path / "results" / "claims.md").exists(), claims.stderr[-2000:]
    dry = _run(installed, tmp_path, "submit", "zero_memory_tables", "--dry-run")
    assert dry.returncode == 0 and str(tmp_path / "slurm" / "zero_memory_tables.sbatch") in dry.stdout, dry.stdout
