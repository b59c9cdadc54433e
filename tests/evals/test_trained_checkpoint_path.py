"""What ``repro train`` writes, the harness evaluates and ``repro export-hf`` hands to Hugging Face (issue 34).

One run of the whole path on CPU: WikiText-103 valid tokenized by the corpus tool, 10 steps at tp 2 (two rank
processes of ``python -m repro.training``, as srun starts them, forked from a warm server: tests/training/forked.py),
then that save directory evaluated by the harness's command (``python -m evals``, called in this process) on LAMBADA
and WikiText, exported by ``repro export-hf`` (forked too), loaded by ``transformers`` with the consolidated model's
logits (fp64, 1e-10), and run through lm-eval's own ``HFLM`` with the same numbers as the harness on the trained
checkpoint (1e-6, as the peer parity tests ask). test_user_path_from_a_wheel.py runs the same path as commands in new
interpreters (training under ``python -m repro.dist.torchrun``); forking here spares four interpreters' start (~5 s
of CPU each, importing torch and repro)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from repro.dist.spawn import free_port
from repro.models.reference import ReferenceGPT
from repro.testing import needs
from repro.training.consolidate import load_trained_gpt
from tests.training import forked
from test_evals_lm_eval_parity import assert_same, ours, subsets, theirs  # noqa: F401 - subsets is a fixture

#: the corpus tool reads WikiText through datasets and tokenizes it with tokenizers
pytestmark = needs("datasets", "tokenizers")

SHAPE = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "64", "--micro-batch-size", "2",
         "--micro-batches", "2"]


def _run(*command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = forked.run(list(command), timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def _train_tp2(argv: list[str], log_dir: Path, timeout: float = 300) -> None:
    """``python -m repro.training ARGV`` as two rank processes, with the launch variables srun or torchrun set."""
    port = free_port()
    logs = [log_dir / f"rank{rank}.log" for rank in range(2)]
    ranks = [forked.Forked(["-m", "repro.training", *argv], out=logs[rank], cwd=log_dir,
                           env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for rank in range(2)]
    try:
        codes = [rank.wait(timeout) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    printed = "\n".join(log.read_text()[-2000:] for log in logs)
    assert codes == [0, 0] and "training done: iteration 10" in printed, printed


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("trained")
    from repro.training import corpus

    assert corpus.main(["--wikitext103", "valid", "--data-dir", str(data_dir), "--output-prefix", str(tmp / "wt-valid"),
                        "--no-progress"]) == 0
    _train_tp2([*SHAPE, "--tp", "2", "--steps", "10", "--data", str(tmp / "wt-valid"), "--save", str(tmp / "ckpt")],
               tmp)
    return tmp / "ckpt"


def test_the_harness_evaluates_what_repro_train_saved(trained, data_dir, tmp_path, capsys):
    from evals.cli import main

    for task in (["lambada", "--limit", "8"], ["wikitext", "--limit", "1", "--max-tokens", "2000"]):
        code = main(["--data-dir", str(data_dir), "--results-dir", str(tmp_path), task[0], "--checkpoint",
                     str(trained), *task[1:]])
        printed = capsys.readouterr()
        assert code == 0, printed.out + printed.err
        assert "perplexity" in printed.out, printed.out


def test_export_loads_in_transformers_and_lm_eval_agrees(trained, data_dir, gpt2_tok, subsets, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # lm-eval's HFLM imports it
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from evals.model_builders import load_gpt_for_eval

    out = tmp_path / "hf"
    done = _run("-m", "repro", "export-hf", str(trained), str(out), "--data-dir", str(data_dir))
    assert "and the GPT-2 tokenizer" in done.stdout
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float64).eval()
    consolidated = load_trained_gpt(trained)
    reference = ReferenceGPT(consolidated.config).double().eval()
    reference.load_state_dict({k: v.double() for k, v in consolidated.state_dict.items()})
    ids = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, reference(ids), rtol=0, atol=1e-10)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tokenizer("The quick brown fox").input_ids == gpt2_tok.encode("The quick brown fox")
    hflm = HFLM(pretrained=hf_model, tokenizer=hf_tokenizer, batch_size=8, max_length=64)
    model, loaded = load_gpt_for_eval(trained, gpt2_tok, dtype=torch.float64)
    assert loaded.source == "repro-train"
    assert_same(ours(model, gpt2_tok, subsets), theirs(hflm, subsets))
