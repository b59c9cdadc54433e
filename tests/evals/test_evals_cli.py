"""``python -m evals``: help text, clear errors, and rows with provenance written through repro.results."""

from __future__ import annotations

import json

import pytest
import torch

from evals.checkpoints import save_consolidated
from evals.cli import build_parser, main
from repro.models import merge_state_dicts
from repro.testing import needs

from evals_test_models import tiny_gpt


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for word in ("count", "wikitext", "lambada", "race-finetune", "race-zeroshot", "convert-hf", "toy-e2e",
                 "reconcile", "adjusted ppl", "245,566", "--strict-lambada", "REPRO_DATA"):
        assert word in text


def test_missing_data_dir_is_one_clear_line(tmp_path, capsys):
    assert main(["--no-write", "--data-dir", str(tmp_path / "none"), "count"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repro eval: error: data directory") and err.count("\n") == 1
    assert f"repro data fetch --data-dir {tmp_path / 'none'}" in err


@needs("datasets", "tokenizers")  # the CLI reads LAMBADA (one line, exit 2 without them)
def test_lambada_rows_written_with_provenance(tmp_path, data_dir, capsys):
    model = tiny_gpt(dtype=torch.float32)
    save_consolidated(tmp_path / "ckpt", merge_state_dicts([model.state_dict()], model.config),
                      architecture="gpt", config=model.config)
    code = main(["--quiet", "--data-dir", str(data_dir), "--results-dir", str(tmp_path / "results"), "lambada",
                 "--checkpoint", str(tmp_path / "ckpt"), "--limit", "6"])
    assert code == 0
    files = list((tmp_path / "results" / "evals" / "lambada").glob("*.jsonl"))
    assert len(files) == 1
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    accuracy = [r for r in rows if r["metric"] == "accuracy"]
    assert {r["definition"] for r in accuracy} == {"strict", "nonstrict", "lm_eval"}
    first = rows[0]
    assert len(first["checkpoint_sha256"]) == 64 and first["data_sha256"].startswith("4aa8d02c")
    assert first["provenance"]["git_commit"] and first["settings"]["limit"] == 6
    # every row carries lm-eval's standard error: mean_stderr of the 0/1 scores for an accuracy (in %, as the
    # value), the bootstrap for a perplexity, none for a count
    for r in accuracy:
        p = r["value"] / 100
        assert r["stderr"] == pytest.approx(100 * (p * (1 - p) / 5) ** 0.5, rel=1e-12)  # sample stddev / sqrt(6)
    assert all(r["stderr"] > 0 for r in rows if r["metric"] == "last_word_perplexity")
    assert all(r["stderr"] is None for r in rows if r["unit"] == "count")
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("|task"))
    assert out[header].split("|")[1:-1] == [c.ljust(len(c)) for c in out[header].split("|")[1:-1]]
    assert [c.strip() for c in out[header].split("|")[1:-1]] == ["task", "definition", "metric", "value", "",
                                                                "stderr", "unit"]
    shown = [line for line in out[header + 2:] if line.startswith("|lambada")]
    assert len(shown) == len(rows) and all("±" in line for line in shown if "|accuracy" in line)


@needs("datasets", "tokenizers")
def test_convert_hf_then_evaluate_sharded(tmp_path, data_dir):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    assert main(["--no-write", "convert-hf", "--hf-dir", str(tmp_path / "hf"), "--out", str(tmp_path / "tp2"),
                 "--tp", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "tp2").iterdir()) == [
        "model_tp0of2.pt", "model_tp1of2.pt", "repro_checkpoint.json"]
    assert main(["--no-write", "--quiet", "--data-dir", str(data_dir), "lambada", "--checkpoint",
                 str(tmp_path / "tp2"), "--limit", "3"]) == 0
