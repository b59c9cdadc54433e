"""Bad options of ``python -m evals`` and ``repro data fetch``: one line naming the value, exit code 2, before any
work (no spawned ranks, no training, no files written); and their valid neighbours still run.

Each case runs the command's ``main(argv)`` in this process: every refusal here comes before a model is scored or
trained, and a tp > 1 case is refused in this process before any rank is spawned.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from evals import cli, fetch
from evals.checkpoints import save_consolidated
from repro.models import BertConfig, BertModel
from repro.testing import needs
from tests.foundation.bad_input_helpers import assert_refused, run_in_process

from evals_test_models import tiny_gpt, tiny_gpt_config

E = ["--no-write", "--quiet"]
LAMBADA = [*E, "lambada", "--checkpoint", "{gpt}", "--limit", "2"]
FINETUNE = [*E, "race-finetune", "--train-limit", "4", "--eval-limit", "2", "--max-steps", "1",
            "--max-seq-length", "64"]
CONVERT = [*E, "convert-hf", "--hf-dir", "{hf}", "--out"]
TOY = [*E, "toy-e2e", "--train-seconds", "1", "--no-lm-eval", "--tp-check", "0", "--race-train-questions", "2",
       "--race-eval-questions", "2", "--eval-limit", "1", "--wikitext-max-tokens", "500", "--out"]

#: name -> (argv, text the one line must hold)
EVAL_CASES = {
    "tp2_missing_checkpoint": ([*E, "lambada", "--checkpoint", "/nonexistent", "--tp", "2"], "'/nonexistent'"),
    "tp2_bert_checkpoint": ([*E, "lambada", "--checkpoint", "{bert}", "--tp", "2"], "{bert}"),
    "tp3_does_not_divide_heads": ([*LAMBADA, "--tp", "3"], "tp=3"),
    "tp0": ([*LAMBADA, "--tp", "0"], "tp=0"),
    "wikitext_max_tokens_negative": ([*E, "wikitext", "--checkpoint", "{gpt}", "--max-tokens", "-5"], "'-5'"),
    "wikitext_max_tokens_zero": ([*E, "wikitext", "--checkpoint", "{gpt}", "--max-tokens", "0"], "'0'"),
    "wikitext_stride_zero": ([*E, "wikitext", "--checkpoint", "{gpt}", "--stride", "0"], "'0'"),
    "lambada_seq_len_over_positions": ([*LAMBADA, "--seq-len", "128"], "seq_len=128"),
    "lambada_tp2_seq_len_over_positions": ([*LAMBADA, "--seq-len", "128", "--tp", "2"], "seq_len=128"),
    "race_zeroshot_seq_len_over_positions": ([*E, "race-zeroshot", "--checkpoint", "{gpt}", "--limit", "1",
                                              "--seq-len", "128"], "seq_len=128"),
    "results_dir_under_proc": (["--quiet", "--results-dir", "/proc/repro-x", "lambada", "--checkpoint", "{gpt}"],
                               "/proc/repro-x"),
    "results_dir_name_too_long": (["--quiet", "--results-dir", "{long}", "lambada", "--checkpoint", "{gpt}"],
                                  "the file system allows 255"),
    "finetune_device_tpu": ([*FINETUNE, "--device", "tpu"], "'tpu'"),
    "finetune_save_a_file": ([*FINETUNE, "--save", "{file}"], "{file}"),
    "finetune_save_under_a_file": ([*FINETUNE, "--save", "{file}/sub"], "{file}"),
    "finetune_train_limit_negative": ([*FINETUNE, "--train-limit", "-1"], "'-1'"),
    "finetune_eval_limit_negative": ([*FINETUNE, "--eval-limit", "-1"], "'-1'"),
    "finetune_seed_negative": ([*FINETUNE, "--seed", "-1"], "'-1'"),
    "convert_tp0": ([*CONVERT, "{dir}/c0", "--tp", "0"], "'0'"),
    "convert_tp_negative": ([*CONVERT, "{dir}/c0", "--tp", "-2"], "'-2'"),
    "convert_out_a_file": ([*CONVERT, "{file}"], "{file}"),
    "convert_out_under_a_file": ([*CONVERT, "{file}/x"], "{file}"),
    "convert_out_under_proc": ([*CONVERT, "/proc/repro-x"], "/proc/repro-x"),
    "convert_out_name_too_long": ([*CONVERT, "{long}"], "the file system allows 255"),
    "convert_hf_dir_missing": ([*E, "convert-hf", "--hf-dir", "/nonexistent", "--out", "{dir}/c1"], "/nonexistent"),
    "convert_hf_dir_without_config": ([*E, "convert-hf", "--hf-dir", "{gpt}", "--out", "{dir}/c1"], "{gpt}"),
    "convert_hf_dir_a_file": ([*E, "convert-hf", "--hf-dir", "{file}", "--out", "{dir}/c1"], "{file}"),
    "toy_out_a_file": ([*TOY, "{file}"], "{file}"),
    "toy_eval_limit_zero": ([*TOY, "{dir}/t", "--eval-limit", "0"], "'0'"),
    "toy_eval_limit_negative": ([*TOY, "{dir}/t", "--eval-limit", "-1"], "'-1'"),
    "toy_tp_check_negative": ([*TOY, "{dir}/t", "--tp-check", "-1"], "'-1'"),
    "toy_wikitext_max_tokens_negative": ([*TOY, "{dir}/t", "--wikitext-max-tokens", "-5"], "'-5'"),
    "toy_wikitext_max_tokens_zero": ([*TOY, "{dir}/t", "--wikitext-max-tokens", "0"], "'0'"),
    "data_dir_a_file": (["--data-dir", "{file}", *LAMBADA], "{file}' (from --data-dir) is a file"),
    "data_dir_empty": (["--data-dir", "", "count"], "'' (from --data-dir) is empty"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """A tiny repro GPT (2 heads, 64 positions), a tiny repro BERT and the GPT as a Hugging Face directory."""
    root = tmp_path_factory.mktemp("models")
    save_consolidated(root / "gpt", tiny_gpt(dtype=torch.float32).state_dict(), architecture="gpt",
                      config=tiny_gpt_config())
    bert = BertConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_attention_heads=2,
                      max_position_embeddings=64)
    save_consolidated(root / "bert", BertModel(bert).state_dict(), architecture="bert", config=bert)
    from evals.hf_export import export_hf

    export_hf(root / "gpt", root / "hf")
    return {name: str(root / name) for name in ("gpt", "bert", "hf")}


def _values(models: dict[str, str], tmp_path: Path) -> dict[str, str]:
    afile = tmp_path / "afile.txt"
    afile.write_text("x\n")
    return {**models, "file": str(afile), "dir": str(tmp_path), "long": str(tmp_path / ("y" * 300))}


@needs("tokenizers")  # some cases are refused after the tokenizer and the checkpoint are read
@pytest.mark.parametrize("name", sorted(EVAL_CASES))
def test_bad_eval_option_exits_2_with_one_line(name, models, data_dir, tmp_path, capsys):
    values = _values(models, tmp_path)
    argv, text = [a.format(**values) for a in EVAL_CASES[name][0]], EVAL_CASES[name][1].format(**values)
    assert_refused(argv, *run_in_process(cli.main, argv, capsys), text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt"]  # nothing written, nothing created


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_finetune_on_cuda_without_a_gpu_is_refused(data_dir, tmp_path, capsys):
    argv = [*FINETUNE, "--device", "cuda", "--save", str(tmp_path / "s")]
    assert_refused(argv, *run_in_process(cli.main, argv, capsys), "'cuda'")
    assert not (tmp_path / "s").exists()


@needs("datasets", "tokenizers")
def test_valid_neighbours_still_run(models, data_dir, tmp_path, capsys):
    """The values beside the refused ones: --seq-len within the positions (now the context LAMBADA reads), a
    --max-tokens prefix, a results directory that does not exist yet, tp 2 shards from a Hugging Face directory."""
    values = _values(models, tmp_path)
    assert cli.main([*E, "lambada", "--checkpoint", values["gpt"], "--limit", "2", "--seq-len", "32"]) == 0
    assert cli.main([*E, "wikitext", "--checkpoint", values["gpt"], "--limit", "1", "--max-tokens", "200"]) == 0
    results = tmp_path / "new" / "results"
    assert cli.main(["--quiet", "--results-dir", str(results), "lambada", "--checkpoint", values["gpt"],
                     "--limit", "2"]) == 0
    assert list(results.glob("evals/lambada/*.jsonl"))
    assert cli.main([*E, "convert-hf", "--hf-dir", values["hf"], "--out", str(tmp_path / "c2"), "--tp", "2"]) == 0
    assert json.loads((tmp_path / "c2" / "repro_checkpoint.json").read_text())["tp_size"] == 2
    assert capsys.readouterr().err.count("error") == 0


@needs("datasets", "tokenizers")
def test_finetune_saves_to_a_new_directory(data_dir, tmp_path):
    assert cli.main([*FINETUNE, "--seed", "0", "--save", str(tmp_path / "saved")]) == 0
    assert (tmp_path / "saved" / "repro_checkpoint.json").is_file()


def _race_tarball(data_dir: Path, folder: Path, train: dict[str, bytes]) -> None:
    """``folder/RACE.tar.gz``: the real RACE test and dev files plus the given train members."""
    folder.mkdir()
    with tarfile.open(folder / "RACE.tar.gz", "w:gz", compresslevel=1) as tar:  # speed, not size
        for split in ("test", "dev"):
            tar.add(data_dir / "race" / "RACE" / split, arcname=f"RACE/{split}")
        for name, data in train.items():
            info = tarfile.TarInfo(f"RACE/train/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


FETCH_CASES = {
    "mirror_not_a_url": (["--only", "lambada", "--mirror", "not-a-url"], "'not-a-url'"),
    "race_not_a_tarball": (["--only", "race", "--mirror", "{garbage}"], "RACE.tar.gz is not a readable tar"),
    "race_unnumbered_member": (["--only", "race", "--mirror", "{unnumbered}"], "'RACE/train/high/abc.txt'"),
    "race_member_not_json": (["--only", "race", "--mirror", "{not_json}"], "'RACE/train/high/1.txt'"),
    "wikitext_not_a_zip": (["--only", "wikitext103", "--mirror", "{garbage}"], "wikitext-103-v1.zip is not"),
}


@pytest.mark.parametrize("name", sorted(FETCH_CASES))
def test_bad_fetch_input_exits_2_with_one_line(name, data_dir, tmp_path, capsys):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    for file_name in ("RACE.tar.gz", "wikitext-103-v1.zip"):
        (garbage / file_name).write_bytes(b"notatar")
    values = {"garbage": garbage.as_uri(), "unnumbered": str(tmp_path / "m1"), "not_json": str(tmp_path / "m2")}
    if name == "race_unnumbered_member":
        _race_tarball(Path(data_dir), tmp_path / "m1", {"high/abc.txt": b'{"article": "a"}',
                                                         "middle/1.txt": b'{"article": "a"}'})
    if name == "race_member_not_json":
        _race_tarball(Path(data_dir), tmp_path / "m2", {"high/1.txt": b"\xff\xfe{bad",
                                                         "middle/1.txt": b'{"article": "a"}'})
    target = tmp_path / "fd"
    argv = ["fetch", *(a.format(**values) for a in FETCH_CASES[name][0]), "--data-dir", str(target)]
    code, err = run_in_process(fetch.main, argv, capsys)
    assert_refused(argv, code, err, FETCH_CASES[name][1].format(**values))
    assert not list(target.glob(".fetch/*.part"))  # no download left behind to resume


def test_fetch_takes_a_local_folder_as_its_mirror(data_dir, tmp_path, monkeypatch, capsys):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "lambada_test.jsonl").write_bytes((Path(data_dir) / "lambada" / "lambada_test.jsonl").read_bytes())
    monkeypatch.chdir(tmp_path)
    assert fetch.main(["fetch", "--only", "lambada", "--mirror", "mirror", "--data-dir", "fd"]) == 0
    assert (tmp_path / "fd" / "lambada" / "lambada_test.jsonl").is_file()
