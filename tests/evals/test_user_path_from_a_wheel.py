"""A cluster user's whole path outside this repository (issue 34), with only the wheel and a local mirror standing
in for the internet: in a fresh venv, from a folder outside the checkout, ``repro data fetch`` -> the corpus tool ->
10 steps of ``repro train`` at tp 2 under ``repro.dist.torchrun`` -> ``python -m evals`` on that checkpoint
(LAMBADA and WikiText) -> ``repro export-hf`` -> transformers gives the same logits and lm-eval's HFLM the harness's
numbers (tests/evals/user_path_checks.py, run by the venv's Python)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from repro.results import REPO_ROOT
from repro.testing import needs
from test_data_fetch import mirror  # noqa: F401 - a fixture

pytestmark = needs("datasets", "tokenizers", "transformers", "lm_eval", "accelerate")


def test_fetch_train_evaluate_export_outside_the_checkout(installed, mirror, tmp_path):  # noqa: F811
    bin_dir = installed / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REPRO_RESULTS_DIR", "REPRO_ROOT")}
    env["REPRO_DATA"] = str(tmp_path / "data")

    def run(*command: str, timeout: float = 600) -> str:
        done = subprocess.run([str(bin_dir / command[0]), *command[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=timeout, env=env)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        return done.stdout

    run("repro", "data", "fetch", "--mirror", mirror, "--only", "tokenizers", "--only", "lambada",
        "--only", "wikitext103")
    run("python", "-m", "repro.training.corpus", "--wikitext103", "valid", "--output-prefix", "wt-valid",
        "--no-progress")
    run("python", "-m", "repro.dist.torchrun", "--nproc-per-node", "2", "-m", "repro.training", "--tp", "2",
        "--steps", "10", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "32", "--data", "wt-valid",
        "--save", "ckpt")
    assert "perplexity" in run("python", "-m", "evals", "lambada", "--checkpoint", "ckpt", "--limit", "8")
    assert "perplexity" in run("python", "-m", "evals", "wikitext", "--checkpoint", "ckpt", "--limit", "1",
                               "--max-tokens", "2000")
    assert (tmp_path / "results" / "evals").is_dir()  # results beside the user, not in site-packages
    run("repro", "export-hf", "ckpt", "hf")
    checks = Path(__file__).with_name("user_path_checks.py")
    assert run("python", str(checks), "ckpt", "hf", str(tmp_path / "data")).startswith("ok")
    assert str(REPO_ROOT) not in run("python", "-c", "import repro, evals; print(repro.__file__, evals.__file__)")
