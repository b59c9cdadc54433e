"""Issue 12: bad input to any command ends with exit code 2 and one line that names the value and the rule.

One table: the command line, and a piece of the message that shows the bad value was named. Most cases run the
entry points in this process; the ones a rank only finds after its process group is up run as real processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli import main

DS = {
    "ds_stage_bool": ({"zero_optimization": {"stage": True}}, "stage=True"),
    "ds_stage_5": ({"zero_optimization": {"stage": 5}}, "stage=5"),
    "ds_bucket_0": ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}, "reduce_bucket_size=0"),
    "ds_sub_group_negative": ({"zero_optimization": {"stage": 3, "sub_group_size": -3}}, "sub_group_size=-3"),
    "ds_prefetch_fraction": ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1.5}}, "1.5"),
    "ds_param_offload_stage2": ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
                                "offload_param"),
    "ds_unknown_key": ({"zero_optimization": {"stage": 1, "bucket_sise": 10}}, "bucket_sise"),
    "ds_offload_device": ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "gpu"}}}, "gpu"),
}

CASES = {
    # repro train: options
    "train_tp_zero": (["train", "--tp", "0"], "'0'"),
    "train_lr_negative": (["train", "--lr", "-1"], "'-1'"),
    "train_lr_nan": (["train", "--lr", "nan"], "'nan'"),
    "train_steps_text": (["train", "--steps", "abc"], "'abc'"),
    "train_zero_stage_4": (["train", "--zero-stage", "4"], "4"),
    "train_precision": (["train", "--precision", "fp8"], "'fp8'"),
    "train_save_interval_alone": (["train", "--save-interval", "5"], "--save-interval 5"),
    "train_warmup_past_decay": (["train", "--lr-warmup-iters", "50", "--steps", "20"], "--lr-warmup-iters 50"),
    "train_min_lr_above_lr": (["train", "--min-lr", "1", "--lr", "0.1"], "--min-lr 1.0"),
    "train_heads": (["train", "--hidden", "30", "--heads", "4"], "--hidden 30"),
    "train_zero2_pipeline": (["train", "--zero-stage", "2", "--pp", "2"], "--pp 2"),
    "train_fp16_zero": (["train", "--precision", "fp16", "--zero-stage", "1"], "--zero-stage 1"),
    "train_missing_corpus": (["train", "--data", "/nonexistent/corpus"], "/nonexistent/corpus"),
    "train_valid_without_interval": (["train", "--valid-data", "/x/valid"], "--valid-data /x/valid"),
    "train_load_a_file": (["train", "--load", "{file}"], "{file}"),
    "train_deepspeed_missing": (["train", "--deepspeed-config", "/nonexistent.json"], "/nonexistent.json"),
    "train_deepspeed_not_json": (["train", "--deepspeed-config", "{file}"], "not valid JSON"),
    **{name: (["train", "--deepspeed-config", "{" + name + "}"], text) for name, (_, text) in DS.items()},
    # repro run / submit / list
    "run_unknown_experiment": (["run", "no_such_experiment"], "'no_such_experiment'"),
    "run_unknown_scale": (["run", "parameter_counts", "--scale", "huge"], "'huge'"),
    "run_unknown_point": (["run", "parameter_counts", "--point", "nope"], "'nope'"),
    "list_unknown_scale": (["list", "--scale", "huge"], "'huge'"),
    "submit_bad_time": (["submit", "parameter_counts", "--time", "garbage", "--dry-run"], "'garbage'"),
    "submit_zero_nodes": (["submit", "parameter_counts", "--nodes", "0", "--dry-run"], "'0'"),
    "submit_negative_gpus": (["submit", "parameter_counts", "--gpus-per-node", "-1", "--dry-run"], "'-1'"),
    "submit_unknown_scale": (["submit", "parameter_counts", "--scale", "huge", "--dry-run"], "'huge'"),
    "submit_unknown_point": (["submit", "parameter_counts", "--point", "nope", "--dry-run"], "'nope'"),
    "submit_mem_text": (["submit", "parameter_counts", "--mem", "lots", "--dry-run"], "'lots'"),
    "submit_partition_chars": (["submit", "parameter_counts", "--partition", "a;b", "--dry-run"], "'a;b'"),
    "submit_cpus_zero": (["submit", "parameter_counts", "--cpus-per-task", "0", "--dry-run"], "'0'"),
    "submit_sbatch_arg_not_an_option": (["submit", "parameter_counts", "--sbatch-arg", "account", "--dry-run"],
                                        "'account'"),
    "submit_sbatch_arg_own_option": (["submit", "parameter_counts", "--sbatch-arg", "--time=5", "--dry-run"],
                                     "'--time=5'"),
    "submit_timeout_negative": (["submit", "parameter_counts", "--timeout", "-5", "--dry-run"], "'-5'"),
    "submit_progress_zero": (["submit", "parameter_counts", "--progress-every", "0", "--dry-run"], "'0'"),
    "submit_wait_dry_run": (["submit", "parameter_counts", "--wait", "--dry-run"], "--wait with --dry-run"),
    "figures_unknown_scale": (["figures", "--scale", "huge"], "'huge'"),
    "figures_unknown_figure": (["figures", "--only", "nope"], "'nope'"),
    "claims_unknown_scale": (["claims", "--scale", "huge"], "'huge'"),
    "reproduce_unknown_scale": (["reproduce", "--scale", "any"], "'any'"),
    "reproduce_unknown_experiment": (["reproduce", "--only", "nope"], "'nope'"),
    "results_dir_is_a_file": (["--results-dir", "{file}", "list"], "{file}"),
    # repro eval
    "eval_threads_zero": (["eval", "--threads", "0", "count"], "'0'"),
    "eval_missing_data_dir": (["eval", "--data-dir", "/nonexistent", "count"], "'/nonexistent'"),
    "eval_missing_checkpoint": (["eval", "lambada", "--checkpoint", "/nonexistent"], "'/nonexistent'"),
    "eval_unknown_command": (["eval", "squad"], "'squad'"),
    # repro zero-report
    "zero_report_world_zero": (["zero-report", "--world-size", "0"], "'0'"),
    "zero_report_nvme_without_path": (["zero-report", "--offload", "nvme"], "--nvme-path"),
    "zero_report_stage_7": (["zero-report", "--stages", "7"], "7"),
}


def _materialise(argv: list[str], text: str, tmp_path: Path) -> tuple[list[str], str]:
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not json {")
    values = {"file": str(a_file)}
    for name, (config, _) in DS.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        values[name] = str(path)
    return [arg.format(**values) for arg in argv], text.format(**values)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{err}"
    assert "Traceback" not in err
    return lines[0]


def test_the_table_covers_at_least_25_kinds_of_bad_input():
    assert len(CASES) + len(PROCESS_CASES) >= 25


#: cases that get past the data-directory check first (skipped where the data is absent)
NEEDS_DATA = {"eval_missing_checkpoint"}
#: cases that import an optional package before they meet the bad value (skipped, naming it, where it is absent)
NEEDS_PACKAGES = {"eval_missing_checkpoint": ("tokenizers",), "figures_unknown_figure": ("matplotlib", "seaborn")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, tmp_path, capsys, request):
    if name in NEEDS_DATA:
        request.getfixturevalue("data_dir")
    for package in NEEDS_PACKAGES.get(name, ()):
        pytest.importorskip(package, reason=f"needs {package}: pip install {package}")
    argv, text = _materialise(*CASES[name], tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2, f"{argv}: exit code {code}\n{captured.err}"
    line = _one_line(captured.err)
    assert text in line and "error" in line, f"{argv}: {line!r} does not name {text!r}"


PROCESS_CASES = {
    "train_world_not_divisible": (["--tp", "2"], "world size 1 is not divisible by tp * pp = 2 * 1"),
    "train_resume_other_model": (["--hidden", "64", "--load", "{ckpt}"], "holds a different model (hidden_size"),
    "train_resume_other_zero_stage": (["--hidden", "32", "--zero-stage", "1", "--load", "{ckpt}"],
                                      "zero_stage=0, this run has zero_stage=1"),
}


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> Path:
    ckpt = tmp_path_factory.mktemp("ckpt") / "c"
    proc = subprocess.run([sys.executable, "-m", "repro.training", "--steps", "1", "--hidden", "32", "--layers",
                           "2", "--save", str(ckpt)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return ckpt


@pytest.mark.parametrize("name", sorted(PROCESS_CASES))
def test_bad_input_found_after_start_exits_2_with_one_line(name, small_checkpoint):
    argv, text = PROCESS_CASES[name]
    argv = [arg.format(ckpt=small_checkpoint) for arg in argv]
    proc = subprocess.run([sys.executable, "-m", "repro", "train", "--steps", "2", "--layers", "2", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, f"{argv}: exit code {proc.returncode}\n{proc.stderr}"
    line = _one_line(proc.stderr)
    assert text in line, f"{argv}: {line!r} does not name {text!r}"
