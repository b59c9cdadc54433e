"""The README's training section runs as documented (in a scratch directory; then once more, resuming).

Each command runs as ``python -m ...`` forked from a warm server (tests/training/forked.py): its own process, exit
code, output and environment, without the ~5 s of CPU a fresh interpreter spends importing torch and repro, seven
times over. The same entry points start real interpreters elsewhere: tests/evals/test_user_path_from_a_wheel.py
(``repro corpus``, ``python -m evals``, ``repro export-hf``, training under ``repro.dist.torchrun``),
tests/training/test_corpus.py (``python -m repro.training.corpus``) and test_interrupt.py (``repro train``)."""

from __future__ import annotations

import os
import shlex

from repro.results import REPO_ROOT
from repro.testing import needs
from tests.readme_blocks import commands
from tests.training import forked


def _commands(block: int = 0) -> list[str]:
    return commands(section="## Training that survives a cluster", block=block)


def _run(command: str, cwd, data_dir) -> str:
    argv = shlex.split(command)
    argv = ["-m", "repro", *argv[1:]] if argv[0] == "repro" else argv[1:]  # `python -m M ...` or `repro ...`
    # results (the evaluations' rows) into the scratch directory, not the checkout's results/; one thread: the suite
    # runs several test files at once on few cores, where torch's threads spin (8 steps of the README's training:
    # 29 s of CPU with its default threads, 9 s with one, on 2 busy cores)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), REPRO_DATA=str(data_dir), REPRO_RESULTS_DIR=str(cwd / "results"),
               OMP_NUM_THREADS="1")
    result = forked.run(argv, cwd=cwd, env=env, timeout=600)
    assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
    return result.stdout


@needs("datasets", "tokenizers")  # the first command tokenizes WikiText-103
def test_readme_training_commands_run(tmp_path, data_dir):
    commands = _commands()
    assert len(commands) == 3
    for command in commands:
        out = _run(command, tmp_path, data_dir)
    assert "training done: iteration 100" in out and "validation loss at iteration 100" in out
    assert (tmp_path / "ckpt/wt103/latest_checkpointed_iteration.txt").read_text().strip() == "100"
    again = _run(commands[-1], tmp_path, data_dir)  # the same command resumes at the end: nothing left to train
    assert "resumed from checkpoint" in again and "nothing left to train: at iteration 100" in again
    evaluate, export = _commands(1)[:2], _commands(1)[2:]  # what was trained: evaluated, then exported
    assert len(evaluate) == 2 and len(export) == 1
    for command in evaluate:
        assert "perplexity" in _run(command, tmp_path, data_dir)
    _run(export[0], tmp_path, data_dir)
    assert {"config.json", "model.safetensors", "vocab.json"} <= {p.name for p in (tmp_path / "hf/wt103").iterdir()}
