"""repro installed from a wheel, outside the checkout (issue 34): the wheel carries what it needs beside the packages
(the Slurm launcher and batch files, the papers' claims, GPT-2's tokenizer files and the commit it was built from),
results go to the current directory and data to the per-user data directory (never next to site-packages), and the
commands a user starts with work there: repro list, a ci experiment, the claims report, repro submit --dry-run and
--write-only, repro --version, repro data fetch from a data-directory mirror, repro corpus and repro export-hf
without a data directory. Also: every package folder is listed in pyproject.toml (its packages are listed, not found,
since two of them are folders outside repro/). The venv is the session's ``installed`` fixture (tests/conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repro.results import REPO_ROOT
from tests.foundation.warm_commands import clean_env, forked

#: one pytest-xdist group with tests/evals/test_user_path_from_a_wheel.py: the session's wheel and venv (the
#: ``installed`` fixture) are built once, not once in each file's worker
pytestmark = pytest.mark.xdist_group("installed-wheel")


def test_every_package_folder_is_listed():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO_ROOT).parts) for top in ("repro", "evals")
               for p in (REPO_ROOT / top).rglob("__init__.py")}
    assert folders <= listed, f"package folders missing from pyproject.toml: {sorted(folders - listed)}"


def _run(venv_dir: Path, cwd: Path, *args: str, env: dict | None = None,
         program: str = "repro") -> subprocess.CompletedProcess:
    """The venv's ``program`` as a new process (an interpreter's start and all)."""
    return subprocess.run([str(venv_dir / "bin" / program), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=clean_env(env))


def test_the_wheel_works_outside_the_checkout(installed, tmp_path):
    where = _run(installed, tmp_path, "-c", "import repro; print(repro.__file__)", program="python")
    assert str(installed) in where.stdout, where.stdout + where.stderr  # the wheel's repro, not the checkout's
    listed = _run(installed, tmp_path, "list")  # the console script itself, once; the rest forked (same wheel)
    assert listed.returncode == 0 and "zero_memory_tables" in listed.stdout, listed.stderr
    batch = tmp_path / "slurm" / "zero_memory_tables.sbatch"
    (tmp_path / "no-slurm").mkdir()
    ran, claims, dry, written, refused = forked(
        installed / "bin" / "python", tmp_path, ("repro", "run", "zero_memory_tables"), ("repro", "claims"),
        ("repro", "submit", "zero_memory_tables", "--dry-run"),
        ("repro", "submit", "zero_memory_tables", "--write-only"), ("repro", "submit", "zero_memory_tables"),
        env=clean_env(), paths={2: [batch]}, envs={4: {"PATH": str(tmp_path / "no-slurm")}})
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert list((tmp_path / "results" / "runs" / "zero_memory_tables").glob("*.jsonl"))
    site = next((installed / "lib").glob("python*/site-packages"))
    assert not (site / "results").exists()  # never next to site-packages
    # the papers' claims come from the wheel
    assert claims.returncode == 0 and (tmp_path / "results" / "claims.md").exists(), claims.stderr[-2000:]
    assert dry.returncode == 0 and str(batch) in dry.stdout, dry.stdout
    # the lines name ./slurm/zero_memory_tables.sbatch, which does not exist here: said, and how to write it
    assert f"note: {batch} does not exist yet" in dry.stdout and "--write-only" in dry.stdout and \
        not dry.exists[batch]
    assert written.returncode == 0 and batch.is_file() and (tmp_path / "slurm" / "launch.sh").is_file(), \
        written.stderr
    assert "note:" not in written.stdout and "sbatch command" in written.stdout
    assert refused.returncode == 2 and "`sbatch` is not on PATH" in refused.stderr, refused.stderr
    assert "from a checkout of the repository" in refused.stderr and "`sudo slurm/local/start.sh`" not in \
        refused.stderr  # the wheel has no slurm/local/


def test_the_wheels_data_directory_tokenizer_and_version(installed, tmp_path, data_dir):
    """Installed: the data directory is the per-user one ($XDG_DATA_HOME/repro), never inside the install, and
    repro data fetch fills it from a mirror laid out as a data directory; without GPT-2's tokenizer there, the
    corpus tool and repro export-hf use the wheel's own copies (a complete Hugging Face directory); repro --version
    names the commit the wheel was built from."""
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    (tmp_path / "a.txt").write_text("Hello world.\n")
    make = ("import torch; from evals.checkpoints import save_consolidated; from repro.models import GPTConfig, "
            "GPTModel, merge_state_dicts; c = GPTConfig(vocab_size=50257, hidden_size=16, num_layers=1, "
            "num_attention_heads=2, max_position_embeddings=16); "
            "save_consolidated('gpt', merge_state_dicts([GPTModel(c).state_dict()], c), architecture='gpt', config=c)")
    # forked from one interpreter of the venv (test_the_wheel_works_outside_the_checkout starts the real ones)
    version, fetched, corpus, made, exported = forked(
        installed / "bin" / "python", tmp_path, ("repro", "--version"),
        ("repro", "data", "fetch", "--only", "lambada", "--mirror", data_dir.as_uri()),
        ("repro", "corpus", "--input", "a.txt", "--output-prefix", "c", "--no-progress"), ("python", "-c", make),
        ("repro", "export-hf", "gpt", "hf"), env=clean_env(env))
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith(f"repro 0.1.0 (commit {commit.stdout.strip()}")
    assert "installed), torch " in version.stdout, version.stdout
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "xdg" / "repro" / "lambada" / "lambada_test.jsonl").is_file()
    assert f"data directory {tmp_path / 'xdg' / 'repro'}:" in fetched.stdout
    assert not list(installed.rglob("lambada_test.jsonl"))  # nothing inside the install
    shipped = next(installed.glob("lib/python*/site-packages/repro/text/gpt2_tokenizer"))
    assert sorted(p.name for p in shipped.iterdir()) == ["gpt2-merges.txt", "gpt2-vocab.json"]
    assert corpus.returncode == 0 and "5 tokens" in corpus.stdout, corpus.stderr  # 4 BPE + <|endoftext|>
    assert made.returncode == 0, made.stderr
    assert exported.returncode == 0 and "and the GPT-2 tokenizer" in exported.stdout, exported.stderr
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= {p.name for p in (tmp_path / "hf").iterdir()}
