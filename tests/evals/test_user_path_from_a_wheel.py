"""A cluster user's whole path outside this repository, with only the wheel and a site's mirror standing in for the
internet: in a fresh venv, from a folder outside the checkout, with no data directory set (the per-user default,
``$XDG_DATA_HOME/repro``), ``repro data fetch --mirror file://DATA_DIR`` (a mirror laid out as a data directory) ->
``repro corpus`` -> 10 steps of ``repro train`` at tp 2 under ``repro.dist.torchrun``, given Megatron-LM's option
names -> ``python -m evals`` on that checkpoint (LAMBADA and WikiText, lm-eval's Value ± Stderr table) -> ``repro
export-hf`` -> transformers gives the same logits and lm-eval's HFLM the harness's numbers
(tests/evals/user_path_checks.py, run by the venv's Python)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from repro.results import REPO_ROOT
from repro.testing import needs
from tests.foundation.warm_commands import forked

#: one pytest-xdist group with tests/foundation/test_packaging.py: the session's wheel and venv are built once
pytestmark = [needs("datasets", "tokenizers", "transformers", "lm_eval", "accelerate"),
              pytest.mark.xdist_group("installed-wheel")]


def test_fetch_train_evaluate_export_outside_the_checkout(installed, data_dir, tmp_path):
    bin_dir = installed / "bin"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "REPRO_RESULTS_DIR", "REPRO_ROOT", "REPRO_DATA", "REPRO_DATA_MIRROR")}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # the per-user data directory: xdg/repro

    def run(*command: str, timeout: float = 600) -> str:
        done = subprocess.run([str(bin_dir / command[0]), *command[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=timeout, env=env)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        return done.stdout

    fetched = run("repro", "data", "fetch", "--mirror", data_dir.as_uri(), "--only", "tokenizers", "--only",
                  "lambada", "--only", "wikitext103")
    assert f"data directory {tmp_path / 'xdg' / 'repro'}: every file checked" in fetched
    run("repro", "corpus", "--wikitext103", "valid", "--output-prefix", "wt-valid", "--no-progress")
    trained = run("python", "-m", "repro.dist.torchrun", "--nproc-per-node", "2", "-m", "repro.training",
                  "--tensor-model-parallel-size", "2", "--train-iters", "10", "--num-layers", "2", "--hidden-size",
                  "16", "--num-attention-heads", "2", "--seq-length", "32", "--micro-batch-size", "2",
                  "--global-batch-size", "8", "--data-path", "wt-valid", "--save", "ckpt")
    assert "training done: iteration 10" in trained
    # the rest forked from one interpreter of the venv (tests/foundation/warm_commands.py): each its own process,
    # folder and environment, without an interpreter's start and torch's import each; the commands above are real
    checks = Path(__file__).with_name("user_path_checks.py")
    done = forked(bin_dir / "python", tmp_path,
                  ("python", "-m", "evals", "lambada", "--checkpoint", "ckpt", "--limit", "8"),
                  ("python", "-m", "evals", "wikitext", "--checkpoint", "ckpt", "--limit", "1", "--max-tokens",
                   "2000"), ("repro", "export-hf", "ckpt", "hf"),
                  ("python", str(checks), "ckpt", "hf", str(tmp_path / "xdg" / "repro")),
                  ("python", "-c", "import repro, evals; print(repro.__file__, evals.__file__)"), env=env)
    for command in done:
        assert command.returncode == 0, f"{' '.join(command.args)}:\n{command.stdout[-2000:]}\n{command.stderr[-2000:]}"
    table, perplexity, _, checked, where = (command.stdout for command in done)
    header = [cell.strip() for cell in table.splitlines()[0].split("|")[1:-1]]
    assert header == ["task", "definition", "metric", "value", "", "stderr", "unit"] and "±" in table, table
    assert "perplexity" in perplexity
    assert (tmp_path / "results" / "evals").is_dir()  # results beside the user, not in site-packages
    assert (tmp_path / "hf").is_dir()  # repro export-hf wrote it (user_path_checks.py reads it)
    assert checked.startswith("ok")
    assert str(REPO_ROOT) not in where and str(installed) in where
