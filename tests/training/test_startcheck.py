"""What ``repro train`` honours and estimates at start (issue 27): DeepSpeed batch keys, seeds, the corpus index's
largest token id, and the memory and checkpoint estimates behind the start checks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from repro.training.argcheck import check_args
from repro.training.cli import build_parser
from repro.training.config import TrainConfig
from repro.training.corpus import max_token_id
from repro.training.data import SyntheticSamples
from repro.training.startcheck import checkpoint_bytes, state_bytes
from repro.zero import config as zero_config
from repro.zero.config import OffloadConfig, ZeroConfig
from repro.zero.deepspeed_json import OFFLOAD_KEYS, ZERO_KEYS, DeepSpeedBatch
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _checked(tmp_path, ds: dict, *argv: str):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    return check_args(build_parser().parse_args(["--deepspeed-config", str(path), *argv]))


@pytest.mark.parametrize("ds, argv, expected", [
    ({"train_batch_size": 16}, [], (2, 8)),  # micro-batches derived from --micro-batch-size 2
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}, [], (4, 4)),
    ({"train_batch_size": 12, "gradient_accumulation_steps": 3}, [], (4, 3)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, ["--micro-batches", "9"], (4, 3)),
    ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, [], (3, 2)),
    ({"zero_optimization": {"stage": 1}}, ["--micro-batch-size", "5", "--micro-batches", "2"], (5, 2)),
])
def test_deepspeed_batch_keys_are_honoured(tmp_path, ds, argv, expected):
    config = _checked(tmp_path, ds, *argv)
    assert (config.training.micro_batch_size, config.training.micro_batches) == expected


def test_train_batch_size_counts_the_data_parallel_ranks():
    assert DeepSpeedBatch(16, None, None).resolve(micro_batch_size=2, micro_batches=4, dp=4) == (2, 2)
    with pytest.raises(ValueError, match=r"train_batch_size=16 != .* = 2 x 4 x 4 = 32"):
        DeepSpeedBatch(16, 2, 4).resolve(micro_batch_size=2, micro_batches=4, dp=4)


def test_a_run_trains_with_the_configs_train_batch_size(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 3}))
    proc = subprocess.run([sys.executable, "-m", "repro.training", "--steps", "1", "--layers", "1", "--hidden", "16",
                           "--heads", "2", "--deepspeed-config", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "global batch size:     6" in proc.stdout


def test_every_deepspeed_key_read_or_ignored_has_a_type():
    assert set(ZERO_KEYS) == zero_config._DS_ZERO_KEYS | zero_config._DS_ZERO_IGNORED
    assert set(OFFLOAD_KEYS) == zero_config._DS_OFFLOAD_KEYS


def test_seeds_below_2_63_give_their_own_data_and_others_are_refused():
    largest = SyntheticSamples(vocab_size=64, seq_len=8, seed=2**63 - 1).batch(0, 4)
    assert not largest.equal(SyntheticSamples(vocab_size=64, seq_len=8, seed=2**63 - 2).batch(0, 4))
    for seed in (-1, 2**63, 2**64 - 1):
        with pytest.raises(ValueError, match=r"must be an integer in \[0, 2\*\*63\)"):
            SyntheticSamples(vocab_size=64, seq_len=8, seed=seed)
    assert build_parser().parse_args(["--seed", str(2**63 - 1)]).seed == 2**63 - 1


def test_max_token_id_of_old_indexes():
    from repro.text.data_files import GPT2_MERGES, GPT2_VOCAB

    pinned = {"files": {"gpt2-vocab.json": GPT2_VOCAB.sha256, "gpt2-merges.txt": GPT2_MERGES.sha256}}
    assert max_token_id({"max_token_id": 7, "tokenizer": pinned}) == 7
    assert max_token_id({"tokenizer": pinned}) == 50256  # GPT-2's BPE emits nothing larger
    assert max_token_id({"tokenizer": {"files": {"gpt2-vocab.json": "0" * 64}}}) is None
    assert max_token_id({}) is None


def test_the_corpus_tool_records_max_token_id(tmp_path, data_dir):
    from repro.training.corpus import TokenCorpus, tokenize_corpus

    path = tmp_path / "a.txt"
    path.write_text("Hello world, a few tokens.\n")
    corpus = TokenCorpus(tokenize_corpus([path], tmp_path / "c", vocab_dir=data_dir / "tokenizers", progress=False))
    assert corpus.index["max_token_id"] == int(corpus.tokens.max()) == 50256  # the EOD token closes the document


def test_state_bytes_follow_the_zero_stages():
    params, dp = 1000, 4
    assert state_bytes(params, dp=dp, zero=None) == (16_000, 0)
    assert state_bytes(params, dp=dp, zero=ZeroConfig(stage=1)) == (4000 + 4000 + 2000, 0)
    assert state_bytes(params, dp=dp, zero=ZeroConfig(stage=2)) == (4000 + 1000 + 2000, 0)
    assert state_bytes(params, dp=dp, zero=ZeroConfig(stage=3)) == (1000 + 1000 + 2000, 0)
    cpu = ZeroConfig(stage=3, offload_optimizer=OffloadConfig("cpu"), offload_param=OffloadConfig("cpu"))
    assert state_bytes(params, dp=dp, zero=cpu) == (1000, 3000)
    nvme = ZeroConfig(stage=1, offload_optimizer=OffloadConfig("nvme", nvme_path="/x"))
    assert state_bytes(params, dp=dp, zero=nvme) == (8000, 0)


def test_checkpoint_estimate_counts_each_dp_copy_without_zero():
    config = TrainConfig.from_settings(vocab=128).gpt_config()
    from repro.models.params import count_parameters

    assert checkpoint_bytes(config, tp=1, dp=2, zero_stage=0) == count_parameters(config) * 12 * 2
    assert checkpoint_bytes(config, tp=1, dp=2, zero_stage=1) == count_parameters(config) * 12


def test_on_a_gpu_the_estimate_meets_the_gpus_free_memory(monkeypatch):
    """No GPU here: the device and its free memory are stood in for (torch.cuda.mem_get_info's (free, total))."""
    import torch

    import repro.dist.device
    from repro.dist.launch import read_launch_env
    from repro.training.startcheck import UsageError, check_memory

    monkeypatch.setattr(repro.dist.device, "select_device", lambda *a, **k: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (2**30, 80 * 2**30))
    config = TrainConfig.from_settings(hidden=4096, heads=32, layers=4, vocab=50257, dp=1)
    with pytest.raises(UsageError, match=r"1,011,703,808 parameters\) needs at least 15\.1 GiB on cuda .* has "
                                        r"1\.0 GiB \(free on cuda:0\)"):
        check_memory(config, launch=read_launch_env())
    config = config.replaced(hidden=256, heads=4)
    check_memory(config, launch=read_launch_env())  # about 16 M parameters: 0.25 GiB fits
