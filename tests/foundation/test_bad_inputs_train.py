"""Issues 12 and 27: every bad input to ``repro train`` is refused at start, on every rank, in one line with exit
code 2: options, DeepSpeed configs, corpora, launch variables, memory and output paths.

Each case runs ``repro.cli.main(["train", ...])`` in this process: all are found by ``check_args`` before a process
group exists (the trainer is replaced by a failure, so a case that slips through cannot start training here). A few
run as real processes too, to show the entry point itself prints one line and exits in time: two from a new
interpreter, the others forked from a warm server (tests/training/forked.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import repro.training.cli as train_cli
from repro.cli import main
from repro.training.corpus import FORMAT, FORMAT_VERSION
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES, assert_refused, run_in_process, run_process
from tests.training import forked

TORCHRUN = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
GPT2_FILES = {"gpt2-vocab.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
              "gpt2-merges.txt": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}

DS = {
    "ds_stage_bool": {"zero_optimization": {"stage": True}},
    "ds_stage_5": {"zero_optimization": {"stage": 5}},
    "ds_bucket_0": {"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}},
    "ds_sub_group_negative": {"zero_optimization": {"stage": 3, "sub_group_size": -3}},
    "ds_prefetch_fraction": {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1.5}},
    "ds_param_offload_stage2": {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
    "ds_unknown_key": {"zero_optimization": {"stage": 1, "bucket_sise": 10}},
    "ds_offload_device": {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "gpu"}}},
    "ds_zero_block_list": {"zero_optimization": [1]},
    "ds_fp16_true": {"fp16": True},
    "ds_top_level_typo": {"zero_optimisation": {"stage": 2}},
    "ds_unknown_top_key": {"frobnicate": 1},
    "ds_offload_string": {"zero_optimization": {"stage": 1, "offload_optimizer": "cpu"}},
    "ds_offload_unknown_key": {"zero_optimization": {"stage": 1, "offload_optimizer": {"devise": "cpu"}}},
    "ds_offload_pin_text": {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu",
                                                                                    "pin_memory": "yes"}}},
    "ds_cpu_offload_text": {"zero_optimization": {"stage": 1, "cpu_offload": "yes"}},
    "ds_quantized_weights": {"zero_optimization": {"stage": 1, "zero_quantized_weights": True}},
    "ds_overlap_comm_number": {"zero_optimization": {"stage": 1, "overlap_comm": 1}},
    "ds_batch_mismatch": {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
                          "gradient_accumulation_steps": 4},
    "ds_batch_indivisible": {"train_batch_size": 7},
    "ds_micro_batch_zero": {"train_micro_batch_size_per_gpu": 0},
    "ds_accumulation_text": {"gradient_accumulation_steps": "4"},
    "ds_optimizer_block": {"optimizer": {"type": "Adam", "params": {"lr": 1e-4}}},
    "ds_scheduler_block": {"scheduler": {"type": "WarmupLR"}},
    "ds_bf16_enabled_text": {"bf16": {"enabled": "yes"}},
    "ds_fp16_enabled": {"fp16": {"enabled": True}},
    "ds_clipping_negative": {"gradient_clipping": -1},
    "ds_not_an_object": [],
    "ds_batch_float": {"train_batch_size": 8.0},
    # the monitor blocks: honoured or refused, never ignored
    "ds_csv_monitor_enabled": {"csv_monitor": {"enabled": True, "output_path": "logs"}},
    "ds_comet_enabled": {"comet": {"enabled": True}},
    "ds_tensorboard_without_path": {"tensorboard": {"enabled": True}},
    "ds_wandb_without_project": {"wandb": {"enabled": True}},
    "ds_tensorboard_unknown_key": {"tensorboard": {"enabled": True, "output_dir": "tb"}},
}
#: DeepSpeed configs that contradict an option given beside them: name -> (config, options, expected text)
DS_WITH_OPTIONS = {
    "ds_batch_contradicts_micro_batches": ({"train_batch_size": 16}, ["--micro-batches", "4"],
                                           "--micro-batches 4 contradicts"),  # train_batch_size won, silently
    "ds_micro_batch_contradicts_option": ({"train_micro_batch_size_per_gpu": 4}, ["--micro-batch-size", "2"],
                                          "--micro-batch-size 2 contradicts"),
    "ds_stage_contradicts_option": ({"zero_optimization": {"stage": 1}}, ["--zero-stage", "2"],
                                    "--zero-stage 2 contradicts"),
    "ds_clipping_contradicts_option": ({"gradient_clipping": 0.5}, ["--clip-grad", "1"], "--clip-grad 1.0 contradicts"),
    "ds_steps_per_print_contradicts_option": ({"steps_per_print": 10}, ["--log-interval", "2"],
                                              "--log-interval 2 contradicts"),
    "ds_tensorboard_contradicts_option": ({"tensorboard": {"enabled": True, "output_path": "a"}},
                                          ["--tensorboard-dir", "b"], "--tensorboard-dir b contradicts"),
}
#: DeepSpeed configs written as raw bytes: name -> (bytes, expected text)
DS_RAW = {
    "ds_duplicate_key": (b'{"zero_optimization": {"stage": 1}, "zero_optimization": {"stage": 2}}',
                         "key 'zero_optimization' appears twice"),
    "ds_binary": (b"\xff\xfe\x00\x01 not text", "is not UTF-8 text"),
}
DS_TEXT = {
    "ds_stage_bool": "stage=True", "ds_stage_5": "stage=5", "ds_bucket_0": "reduce_bucket_size=0",
    "ds_sub_group_negative": "sub_group_size=-3", "ds_prefetch_fraction": "1.5", "ds_param_offload_stage2":
    "offload_param", "ds_unknown_key": "bucket_sise", "ds_offload_device": "'gpu'", "ds_zero_block_list":
    "zero_optimization=[1]", "ds_fp16_true": "fp16=True", "ds_top_level_typo": "did you mean 'zero_optimization'",
    "ds_unknown_top_key": "'frobnicate'", "ds_offload_string": "offload_optimizer='cpu'", "ds_offload_unknown_key":
    "did you mean 'device'", "ds_offload_pin_text": "pin_memory='yes'", "ds_cpu_offload_text": "cpu_offload='yes'",
    "ds_quantized_weights": "zero_quantized_weights=True", "ds_overlap_comm_number": "overlap_comm=1",
    "ds_batch_mismatch": "train_batch_size=10", "ds_batch_indivisible": "train_batch_size=7",
    "ds_micro_batch_zero": "train_micro_batch_size_per_gpu=0", "ds_accumulation_text":
    "gradient_accumulation_steps='4'", "ds_optimizer_block": "optimizer is not supported", "ds_scheduler_block":
    "scheduler is not supported", "ds_bf16_enabled_text": "bf16.enabled='yes'", "ds_fp16_enabled": "enables fp16",
    "ds_clipping_negative": "gradient_clipping=-1", "ds_not_an_object": "must hold a JSON object",
    "ds_batch_float": "train_batch_size=8.0",
    "ds_csv_monitor_enabled": "csv_monitor.enabled=true is not supported", "ds_comet_enabled": "comet.enabled=true",
    "ds_tensorboard_without_path": "needs tensorboard.output_path", "ds_wandb_without_project": "needs wandb.project",
    "ds_tensorboard_unknown_key": "unknown tensorboard keys ['output_dir']",
}

#: corpora written by hand: name -> (tokens, index fields to set, fields to drop, whole index instead)
CORPORA = {
    "good": (list(range(200)), {}, (), None),
    "index_list": (list(range(100)), {}, (), []),
    "no_num_tokens": (list(range(100)), {}, ("num_tokens",), None),
    "num_tokens_text": (list(range(100)), {"num_tokens": "100"}, (), None),
    "max_token_negative": (list(range(100)), {"max_token_id": -1}, (), None),
    "wrong_version": (list(range(100)), {"version": 99}, (), None),
    "above_vocab": ([1, 2, 300] * 40, {}, (), None),
    "valid_above_vocab": ([1, 2, 300] * 40, {"vocab_size": 512}, (), None),
    "old_unknown_tokenizer": (list(range(100)), {}, ("max_token_id",), None),
    "old_gpt2_small_vocab": (list(range(100)), {"tokenizer": {"name": "gpt2-bpe", "files": GPT2_FILES}},
                             ("max_token_id",), None),
    "too_short": (list(range(10)), {}, (), None),
    "truncated": (list(range(100)), {"num_tokens": 150}, (), None),
    "no_bin": (list(range(100)), {}, (), None),
}

TRAIN_CASES = {
    # options
    "train_tp_zero": (["--tp", "0"], "'0'"),
    "train_lr_negative": (["--lr", "-1"], "'-1'"),
    "train_lr_nan": (["--lr", "nan"], "'nan'"),
    "train_steps_text": (["--steps", "abc"], "'abc'"),
    "train_zero_stage_4": (["--zero-stage", "4"], "4"),
    "train_precision": (["--precision", "fp8"], "'fp8'"),
    "train_device_tpu": (["--device", "tpu"], "'tpu'"),
    "train_decay_style": (["--lr-decay-style", "bogus"], "'bogus'"),
    "train_log_interval_zero": (["--log-interval", "0"], "'0'"),
    "train_micro_batch_size_zero": (["--micro-batch-size", "0"], "'0'"),
    "train_save_interval_alone": (["--save-interval", "5"], "--save-interval 5"),
    "train_warmup_past_decay": (["--lr-warmup-iters", "50", "--steps", "20"], "--lr-warmup-iters 50"),
    "train_min_lr_above_lr": (["--min-lr", "1", "--lr", "0.1"], "--min-lr 1.0"),
    "train_heads": (["--hidden", "30", "--heads", "4"], "--hidden 30"),
    "train_zero2_pipeline": (["--zero-stage", "2", "--pp", "2"], "--pp 2"),
    "train_fp16_zero": (["--precision", "fp16", "--zero-stage", "1"], "--zero-stage 1"),
    "train_timeout_huge": (["--timeout-s", "1e300"], "--timeout-s 1e+300"),
    "train_timeout_infinite": (["--timeout-s", "inf"], "'inf'"),
    "train_watchdog_huge": (["--watchdog-s", "1e12"], "--watchdog-s 1e+12"),
    "train_hidden_huge": (["--hidden", "1000000000"], "--hidden 1000000000"),
    "train_vocab_huge": (["--vocab", "2000000000"], "--vocab 2000000000"),
    "train_layers_huge": (["--layers", "100000000", "--hidden", "1024"], "--layers 100000000"),
    "train_dropout_above_one": (["--dropout", "1.5"], "--dropout: '1.5'"),
    "train_dropout_negative": (["--dropout", "-0.1"], "'-0.1'"),
    "train_seed_negative": (["--seed", "-1"], "'-1'"),
    "train_seed_2_63": (["--seed", str(2**63)], f"'{2**63}'"),
    "train_seed_2_64": (["--seed", str(2**64)], f"'{2**64}'"),
    "train_seed_text": (["--seed", "abc"], "'abc'"),
    # activations of one micro-batch past any machine's memory (was accepted, then a 'hang' 40 s later)
    "train_micro_batch_size_huge": (["--micro-batch-size", "1000000"], "activations need at least"),
    "train_seq_len_huge": (["--seq-len", "20000000", "--hidden", "16"], "--seq-len 20000000"),
    "train_dp_mismatch": (["--dp", "2"], "world size 1 != tp * pp * dp"),
    # output paths
    "train_save_a_file": (["--save", "{file}"], "{file}"),
    "train_save_below_a_file": (["--save", "{file}/ckpt"], "{file}/ckpt"),
    "train_save_unwritable": (["--save", "/proc/repro-ckpt"], "/proc/repro-ckpt"),
    "train_save_disk_full": (["--save", "{dir}/ckpt"], "{dir}/ckpt"),
    "train_load_a_file": (["--load", "{file}"], "{file}"),
    "train_log_jsonl_directory": (["--log-jsonl", "{dir}"], "--log-jsonl {dir}"),
    "train_log_jsonl_under_proc": (["--log-jsonl", "/proc/repro.jsonl"], "/proc/repro.jsonl"),
    "train_log_jsonl_below_a_file": (["--log-jsonl", "{file}/log.jsonl"], "{file}/log.jsonl"),
    "train_tensorboard_a_file": (["--tensorboard-dir", "{file}"], "{file}"),
    "train_tensorboard_under_proc": (["--tensorboard-dir", "/proc/repro-tb"], "/proc/repro-tb"),
    # loggers whose package is missing (each case hides it): one line, not a note and exit 0
    "train_tensorboard_not_installed": (["--tensorboard-dir", "{dir}/tb"], "--tensorboard-dir needs the package "
                                        "tensorboard, which is not installed: pip install tensorboard"),
    "train_wandb_not_installed": (["--wandb-project", "repro"], "--wandb-project needs the package wandb"),
    "train_log_jsonl_full_device": (["--log-jsonl", "/dev/full"], "/dev/full cannot be appended to (the device is "
                                    "full)"),  # was ENOSPC at the first write, a traceback
    "train_save_name_too_long": (["--save", "{dir}/" + "s" * 300 + "/ck"], "the file system allows 255"),
    "train_log_jsonl_name_too_long": (["--log-jsonl", "{dir}/" + "j" * 300], "the file system allows 255"),
    "train_load_name_too_long": (["--load", "{dir}/" + "l" * 300], "the file system allows 255"),
    # corpora
    "train_missing_corpus": (["--data", "/nonexistent/corpus"], "/nonexistent/corpus"),
    "train_valid_without_interval": (["--valid-data", "/x/valid"], "--valid-data /x/valid"),
    "train_corpus_index_list": (["--data", "{index_list}"], "holds a JSON list"),
    "train_corpus_no_num_tokens": (["--data", "{no_num_tokens}"], "lacks num_tokens"),
    "train_corpus_num_tokens_text": (["--data", "{num_tokens_text}"], "num_tokens='100'"),
    "train_corpus_max_token_negative": (["--data", "{max_token_negative}"], "max_token_id=-1"),
    "train_corpus_wrong_version": (["--data", "{wrong_version}"], "99"),
    "train_corpus_token_above_vocab": (["--data", "{above_vocab}"], "token ids up to 300"),
    "train_corpus_below_vocab_option": (["--data", "{good}", "--vocab", "100"], "token ids up to 199"),
    "train_valid_corpus_above_vocab": (["--data", "{good}", "--valid-data", "{valid_above_vocab}",
                                        "--eval-interval", "1"], "--valid-data {valid_above_vocab} holds"),
    "train_corpus_old_index_unknown_tokenizer": (["--data", "{old_unknown_tokenizer}"], "no max_token_id"),
    "train_corpus_old_gpt2_index_small_vocab": (["--data", "{old_gpt2_small_vocab}"], "token ids up to 50256"),
    "train_corpus_too_short": (["--data", "{too_short}"], "fewer than seq_len + 1"),
    "train_corpus_truncated": (["--data", "{truncated}"], "truncated"),
    "train_corpus_no_bin": (["--data", "{no_bin}"], "no_bin.bin"),
    # DeepSpeed configs
    "train_deepspeed_missing": (["--deepspeed-config", "/nonexistent.json"], "/nonexistent.json"),
    "train_deepspeed_not_json": (["--deepspeed-config", "{file}"], "not valid JSON"),
    **{name: (["--deepspeed-config", "{" + name + "}"], DS_TEXT[name]) for name in DS},
    **{name: (["--deepspeed-config", "{" + name + "}"], text) for name, (_, text) in DS_RAW.items()},
    **{name: (["--deepspeed-config", "{" + name + "}", *options], text)
       for name, (_, options, text) in DS_WITH_OPTIONS.items()},
    # empty paths ('' is the current directory to some, nothing to others): refused
    **{f"train_{option[2:].replace('-', '_')}_empty": ([option, ""], f"{option} '' is empty")
       for option in ("--save", "--load", "--log-jsonl", "--tensorboard-dir", "--data", "--deepspeed-config")},
    # launch variables (names ending in _env set ENV[name] first)
    "launch_rank_text_env": ([], "RANK='abc'"),
    "launch_world_text_env": ([], "WORLD_SIZE='x'"),
    "launch_rank_beyond_world_env": ([], "RANK='3', WORLD_SIZE='2'"),
    "launch_world_zero_env": ([], "world size 0"),
    "launch_local_rank_text_env": ([], "LOCAL_RANK='q'"),
    "launch_local_rank_negative_env": ([], "LOCAL_RANK=-1"),
    "launch_master_port_range_env": ([], "MASTER_PORT='99999'"),
    "launch_master_missing_env": ([], "MASTER_ADDR or MASTER_PORT is missing"),
    "launch_slurm_procid_text_env": ([], "SLURM_PROCID='x'"),
    "launch_slurm_ntasks_missing_env": ([], "SLURM_NTASKS is missing"),
    "launch_slurm_job_id_text_env": ([], "SLURM_JOB_ID='abc'"),
    "launch_world_not_tp_env": (["--tp", "2"], "world size 3 is not divisible by tp * pp = 2 * 1"),
    "launch_heads_not_tp_env": (["--tp", "3", "--hidden", "48", "--heads", "4"],
                                "num_attention_heads=4 is not divisible by tp=3"),
}
ENV = {
    "launch_rank_text_env": {"RANK": "abc", "WORLD_SIZE": "2", **TORCHRUN},
    "launch_world_text_env": {"RANK": "0", "WORLD_SIZE": "x", **TORCHRUN},
    "launch_rank_beyond_world_env": {"RANK": "3", "WORLD_SIZE": "2", **TORCHRUN},
    "launch_world_zero_env": {"RANK": "0", "WORLD_SIZE": "0", **TORCHRUN},
    "launch_local_rank_text_env": {"LOCAL_RANK": "q"},
    "launch_local_rank_negative_env": {"LOCAL_RANK": "-1"},
    "launch_master_port_range_env": {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"},
    "launch_master_missing_env": {"RANK": "0", "WORLD_SIZE": "1"},
    "launch_slurm_procid_text_env": {"SLURM_PROCID": "x", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
    "launch_slurm_ntasks_missing_env": {"SLURM_PROCID": "0", "SLURM_LOCALID": "0"},
    "launch_slurm_job_id_text_env": {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                                     "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "abc"},
    "launch_world_not_tp_env": {"RANK": "0", "WORLD_SIZE": "3", **TORCHRUN},
    "launch_heads_not_tp_env": {"RANK": "0", "WORLD_SIZE": "3", **TORCHRUN},
}


def write_corpus(prefix: Path, tokens: list[int], fields: dict, drop: tuple, whole) -> None:
    """A corpus as the corpus tool lays it out (uint16 .bin, JSON index), with the index changed as asked."""
    data = np.asarray(tokens, dtype="<u2").tobytes()
    if prefix.name != "no_bin":
        Path(f"{prefix}.bin").write_bytes(data)
    index = {"format": FORMAT, "version": FORMAT_VERSION, "dtype": "<u2", "num_tokens": len(tokens),
             "num_documents": 1, "eod_id": 0, "vocab_size": 256, "max_token_id": max(tokens),
             "bin_sha256": hashlib.sha256(data).hexdigest(), **fields}
    for key in drop:
        index.pop(key)
    Path(f"{prefix}.idx.json").write_text(json.dumps(index if whole is None else whole))


def materialise(argv: list[str], text: str, tmp_path: Path) -> tuple[list[str], str]:
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not json {")
    values = {"file": str(a_file), "dir": str(tmp_path)}
    for name, config in DS.items():
        values[name] = str(tmp_path / f"{name}.json")
        Path(values[name]).write_text(json.dumps(config))
    for name, (config, _, _) in DS_WITH_OPTIONS.items():
        values[name] = str(tmp_path / f"{name}.json")
        Path(values[name]).write_text(json.dumps(config))
    for name, (raw, _) in DS_RAW.items():
        values[name] = str(tmp_path / f"{name}.json")
        Path(values[name]).write_bytes(raw)
    for name, spec in CORPORA.items():
        values[name] = str(tmp_path / name)
        write_corpus(tmp_path / name, *spec)
    return [arg.format(**values) for arg in argv], text.format(**values)


@pytest.fixture
def launch_env(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", sorted(TRAIN_CASES))
def test_bad_train_input_exits_2_with_one_line(name, tmp_path, capsys, launch_env):
    for variable, value in ENV.get(name, {}).items():
        launch_env.setenv(variable, value)
    if name == "train_save_disk_full":
        from repro.training import startcheck

        launch_env.setattr(startcheck.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    if name.endswith("_not_installed"):
        from repro.training import argcheck

        launch_env.setattr(argcheck, "available", lambda module: False)
    elif "tensorboard" in str(TRAIN_CASES[name]):  # the file's or the option's tensorboard, where it is absent
        from repro.training import argcheck

        launch_env.setattr(argcheck, "available", lambda module: True)
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: pytest.fail(f"{name} was accepted"))
    steps = [] if "--steps" in TRAIN_CASES[name][0] else ["--steps", "2"]  # an option is given once
    argv, text = materialise(["train", *steps, "--layers", "2", *TRAIN_CASES[name][0]],
                             TRAIN_CASES[name][1], tmp_path)
    assert_refused(argv, *run_in_process(main, argv, capsys), text)


def test_every_listed_case_has_its_environment():
    assert {name for name in TRAIN_CASES if name.endswith("_env")} == set(ENV)
    assert set(DS) == set(DS_TEXT)


PROCESS_CASES = {
    "train_world_not_divisible": (["--tp", "2"], "world size 1 is not divisible by tp * pp = 2 * 1", {}),
    "train_resume_other_model": (["--hidden", "64", "--load", "{ckpt}"], "holds a different model (hidden_size",
                                 {}),
    "train_resume_other_zero_stage": (["--hidden", "32", "--zero-stage", "1", "--load", "{ckpt}"],
                                      "zero_stage=0, this run has zero_stage=1", {}),
    "process_timeout_huge": (["--timeout-s", "1e300"], "--timeout-s 1e+300", {}),
    "process_hidden_huge": (["--hidden", "1000000000"], "needs at least", {}),
    "process_rank_beyond_world": ([], "RANK='3'", {"RANK": "3", "WORLD_SIZE": "2", **TORCHRUN}),
    "process_rank_text": ([], "RANK='abc'", {"RANK": "abc", "WORLD_SIZE": "2", **TORCHRUN}),
}


#: the cases that start a new interpreter (one refused at the start, one at the load); the others are processes
#: forked from a warm server (tests/training/forked.py): the same entry point, without importing torch again
NEW_INTERPRETER = {"process_rank_text", "train_resume_other_model"}


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> Path:
    ckpt = tmp_path_factory.mktemp("ckpt") / "c"
    proc = forked.train(["--steps", "1", "--hidden", "32", "--layers", "2", "--save", str(ckpt)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return ckpt


@pytest.mark.parametrize("name", sorted(PROCESS_CASES))
def test_bad_input_found_in_a_real_process_exits_2_with_one_line(name, request):
    argv, text, env = PROCESS_CASES[name]
    if any("{ckpt}" in arg for arg in argv):
        argv = [arg.format(ckpt=request.getfixturevalue("small_checkpoint")) for arg in argv]
    environ = {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}, **env}
    command = ["train", "--steps", "2", "--layers", "2", *argv]
    if name in NEW_INTERPRETER:
        code, err = run_process(command, env=environ)
    else:
        done = forked.run(["-m", "repro", *command], env=environ, timeout=120)
        code, err = done.returncode, done.stderr
    assert_refused(argv, code, err, text)
