"""``repro --version`` says which repro, which commit and which torch; ``repro corpus`` is the corpus tool (the
command its messages name), the same as ``python -m repro.training.corpus``. (From a wheel: test_packaging.py.)"""

from __future__ import annotations

import subprocess
import sys

import torch

from repro.provenance import git_state
from repro.results import REPO_ROOT


def _repro(*args: str, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_version_names_the_version_the_commit_and_torch():
    done = _repro("--version")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    sha, _ = git_state()
    assert done.stdout.startswith("repro 0.1.0 (commit ") and f"torch {torch.__version__}" in done.stdout
    assert (sha in done.stdout) if sha != "unknown" else "commit unknown" in done.stdout


def test_repro_corpus_is_the_corpus_tool(tmp_path):
    (tmp_path / "a.txt").write_text("One document.\n")
    done = _repro("corpus", "--input", str(tmp_path / "a.txt"), "--output-prefix", str(tmp_path / "c"),
                  "--no-progress")
    assert done.returncode == 0 and (tmp_path / "c.bin").is_file(), done.stderr
    bad = _repro("corpus", "--input", str(tmp_path / "a.txt"))
    assert bad.returncode == 2 and bad.stderr.startswith("repro corpus: error: ") and bad.stderr.count("\n") == 1
    listed = " ".join(_repro("--help").stdout.split())
    assert "corpus tokenize text into a corpus for repro train (= python -m repro.training.corpus)" in listed
