"""Issues 12 and 27: bad input to any command ends with exit code 2 and one line that names the value and the rule.

One table per command family: the command line, and a piece of the message that shows the bad value was named.
This file holds ``repro run``, ``submit``, ``list``, ``figures``, ``claims``, ``reproduce``, ``eval`` and
``zero-report``; ``repro train`` is in test_bad_inputs_train.py and the corpus tool in test_bad_inputs_corpus.py.
Almost every case runs the entry point in this process (each is found in argument checking, before any work).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.cli import main
from repro.gpu_session import main as gpu_session_main
from tests.foundation.bad_input_helpers import assert_refused, run_in_process
from tests.foundation.test_bad_inputs_corpus import CORPUS_CASES
from tests.foundation.test_bad_inputs_train import PROCESS_CASES, TRAIN_CASES

CASES = {
    # repro run / list
    "run_unknown_experiment": (["run", "no_such_experiment"], "'no_such_experiment'"),
    "run_second_experiment_unknown": (["run", "parameter_counts", "nope_exp"], "'nope_exp'"),
    "run_unknown_scale": (["run", "parameter_counts", "--scale", "huge"], "'huge'"),
    "run_unknown_point": (["run", "parameter_counts", "--point", "nope"], "'nope'"),
    "run_unknown_device": (["run", "parameter_counts", "--device", "gpu"], "'gpu'"),
    "list_unknown_scale": (["list", "--scale", "huge"], "'huge'"),
    # repro submit
    "submit_unknown_experiment": (["submit", "nope_exp", "--dry-run"], "'nope_exp'"),
    "submit_bad_time": (["submit", "parameter_counts", "--time", "garbage", "--dry-run"], "'garbage'"),
    "submit_zero_time": (["submit", "parameter_counts", "--time", "0", "--dry-run"], "'0'"),
    "submit_minutes_99": (["submit", "parameter_counts", "--time", "10:99", "--dry-run"], "'10:99'"),
    "submit_zero_nodes": (["submit", "parameter_counts", "--nodes", "0", "--dry-run"], "'0'"),
    "submit_nodes_text": (["submit", "parameter_counts", "--nodes", "abc", "--dry-run"], "'abc'"),
    "submit_nodes_not_dividing": (["submit", "parameter_counts", "--nodes", "3", "--dry-run"], "--nodes 3"),
    "submit_negative_gpus": (["submit", "parameter_counts", "--gpus-per-node", "-1", "--dry-run"], "'-1'"),
    "submit_gpus_text": (["submit", "parameter_counts", "--gpus-per-node", "abc", "--dry-run"], "'abc'"),
    "submit_unknown_scale": (["submit", "parameter_counts", "--scale", "huge", "--dry-run"], "'huge'"),
    "submit_unknown_point": (["submit", "parameter_counts", "--point", "nope", "--dry-run"], "'nope'"),
    "submit_mem_text": (["submit", "parameter_counts", "--mem", "lots", "--dry-run"], "'lots'"),
    "submit_mem_negative": (["submit", "parameter_counts", "--mem", "-1", "--dry-run"], "'-1'"),
    "submit_partition_chars": (["submit", "parameter_counts", "--partition", "a;b", "--dry-run"], "'a;b'"),
    "submit_partition_empty": (["submit", "parameter_counts", "--partition", "", "--dry-run"], "''"),
    "submit_cpus_zero": (["submit", "parameter_counts", "--cpus-per-task", "0", "--dry-run"], "'0'"),
    "submit_cpus_fraction": (["submit", "parameter_counts", "--cpus-per-task", "1.5", "--dry-run"], "'1.5'"),
    "submit_sbatch_arg_not_an_option": (["submit", "parameter_counts", "--sbatch-arg", "account", "--dry-run"],
                                        "'account'"),
    "submit_sbatch_arg_own_option": (["submit", "parameter_counts", "--sbatch-arg", "--time=5", "--dry-run"],
                                     "'--time=5'"),
    "submit_timeout_negative": (["submit", "parameter_counts", "--timeout", "-5", "--dry-run"], "'-5'"),
    "submit_timeout_infinite": (["submit", "parameter_counts", "--timeout", "inf", "--dry-run"], "'inf'"),
    "submit_progress_zero": (["submit", "parameter_counts", "--progress-every", "0", "--dry-run"], "'0'"),
    "submit_max_parallel_zero": (["submit", "parameter_counts", "--max-parallel", "0", "--dry-run"], "'0'"),
    "submit_max_parallel_no_array": (["submit", "parameter_counts", "--max-parallel", "2", "--no-array",
                                      "--dry-run"], "--max-parallel 2"),
    "submit_wait_dry_run": (["submit", "parameter_counts", "--wait", "--dry-run"], "--wait with --dry-run"),
    # repro figures / claims / reproduce
    "figures_unknown_scale": (["figures", "--scale", "huge"], "'huge'"),
    "figures_unknown_figure": (["figures", "--only", "nope"], "'nope'"),
    "claims_unknown_scale": (["claims", "--scale", "huge"], "'huge'"),
    "reproduce_unknown_scale": (["reproduce", "--scale", "any"], "'any'"),
    "reproduce_unknown_experiment": (["reproduce", "--only", "nope"], "'nope'"),
    "results_dir_is_a_file": (["--results-dir", "{file}", "list"], "{file}"),
    # checked before a point runs (it failed after the point had run)
    "results_dir_under_a_file": (["--results-dir", "{file}/sub", "run", "mtnlg_layout"], "{file}/sub"),
    "results_dir_unwritable": (["--results-dir", "/proc/repro-results", "run", "parameter_counts"],
                               "/proc/repro-results"),
    "results_dir_name_too_long": (["--results-dir", "{dir}/" + "r" * 300, "list"], "the file system allows 255"),
    # repro eval
    "eval_threads_zero": (["eval", "--threads", "0", "count"], "'0'"),
    "eval_limit_negative": (["eval", "lambada", "--limit", "-1"], "'-1'"),  # it scored 5,152 of 5,153 passages
    "eval_limit_zero": (["eval", "wikitext", "--limit", "0"], "'0'"),
    "eval_threads_text": (["eval", "--threads", "abc", "count"], "'abc'"),
    "eval_missing_data_dir": (["eval", "--data-dir", "/nonexistent", "count"], "'/nonexistent'"),
    "eval_results_dir_is_a_file": (["eval", "--results-dir", "{file}", "count"], "{file}"),
    "eval_missing_checkpoint": (["eval", "lambada", "--checkpoint", "/nonexistent"], "'/nonexistent'"),
    "eval_not_a_checkpoint": (["eval", "lambada", "--checkpoint", "{dir}"], "{dir}"),
    "eval_hf_garbage_bin": (["eval", "lambada", "--checkpoint", "{hf_bin}"], "pytorch_model.bin' is not a PyTorch "
                            "weights file"),  # was an UnpicklingError traceback
    "eval_hf_garbage_safetensors": (["eval", "lambada", "--checkpoint", "{hf_safetensors}"],
                                    "model.safetensors' is not a safetensors file"),
    "eval_tp_zero": (["eval", "lambada", "--checkpoint", "/nonexistent", "--tp", "0"], "tp=0"),
    "eval_batch_size_zero": (["eval", "lambada", "--checkpoint", "/x", "--batch-size", "0"], "'0'"),
    "eval_unknown_device": (["eval", "lambada", "--checkpoint", "/x", "--device", "tpu"], "'tpu'"),
    "eval_unknown_split": (["eval", "wikitext", "--checkpoint", "/x", "--split", "train"], "'train'"),
    "eval_unknown_command": (["eval", "squad"], "'squad'"),
    # repro export-hf / repro data fetch
    "export_hf_not_a_checkpoint": (["export-hf", "{dir}", "{dir}/out"], "is not a checkpoint directory of a known "
                                   "format"),
    "export_hf_out_a_file": (["export-hf", "{dir}", "{file}"], "{file} is a file"),
    "data_unknown_command": (["data", "pull"], "pull: the one command is 'fetch'"),
    "data_fetch_unknown_source": (["data", "fetch", "--only", "squad"], "'squad'"),
    "data_fetch_dir_a_file": (["data", "fetch", "--data-dir", "{file}"], "{file} is a file"),
    # repro zero-report
    "zero_report_world_zero": (["zero-report", "--world-size", "0"], "'0'"),
    "zero_report_world_text": (["zero-report", "--world-size", "abc"], "'abc'"),
    "zero_report_nvme_without_path": (["zero-report", "--offload", "nvme"], "--nvme-path"),
    "zero_report_nvme_path_a_file": (["zero-report", "--offload", "nvme", "--nvme-path", "{file}"], "{file}"),
    "zero_report_stage_7": (["zero-report", "--stages", "7"], "7"),
    "zero_report_dtype": (["zero-report", "--dtype", "fp8"], "'fp8'"),
    "zero_report_offload_gpu": (["zero-report", "--offload", "gpu"], "'gpu'"),
    "zero_report_heads": (["zero-report", "--num-heads", "3"], "--num-heads 3"),
    "zero_report_vocab_negative": (["zero-report", "--vocab-size", "-5"], "'-5'"),
    "zero_report_rows_missing": (["zero-report", "--rows", "/nonexistent.json", "--no-measure"], "/nonexistent.json"),
    "zero_report_rows_not_json": (["zero-report", "--rows", "{file}", "--no-measure"], "{file}"),
    "zero_report_rows_not_a_list": (["zero-report", "--rows", "{rows_object}", "--no-measure"], "{rows_object}"),
    "zero_report_out_unwritable": (["zero-report", "--out", "/proc/repro/report", "--rows", "{rows}",
                                    "--no-measure"], "/proc/repro/report"),
    "zero_report_out_under_a_file": (["zero-report", "--out", "{file}/sub/report", "--rows", "{rows}",
                                      "--no-measure"], "is under {file}, which is a file"),
    "zero_report_out_name_too_long": (["zero-report", "--out", "{dir}/" + "z" * 300, "--rows", "{rows}",
                                       "--no-measure"], "the file system allows 255"),
    "zero_report_no_measure_alone": (["zero-report", "--no-measure"], "--no-measure"),
}


def materialise(argv: list[str], text: str, tmp_path: Path) -> tuple[list[str], str]:
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not json {")
    (tmp_path / "rows.json").write_text('[{"framework": "x"}]')
    (tmp_path / "rows_object.json").write_text('{"framework": "x"}')
    values = {"file": str(a_file), "dir": str(tmp_path), "rows": str(tmp_path / "rows.json"),
              "rows_object": str(tmp_path / "rows_object.json")}
    config = '{"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50257, "n_positions": 64}'
    for name, weights, data in (("hf_bin", "pytorch_model.bin", b"garbage"),
                                ("hf_safetensors", "model.safetensors", b"\x10" + b"\0" * 7 + b"{not json}xx")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config)
        (tmp_path / name / weights).write_bytes(data)
        values[name] = str(tmp_path / name)
    return [arg.format(**values) for arg in argv], text.format(**values)


def test_the_tables_cover_at_least_100_kinds_of_bad_input():
    tables = (CASES, TRAIN_CASES, PROCESS_CASES, CORPUS_CASES, GPU_SESSION_CASES)
    names = [name for table in tables for name in table]
    assert len(names) == len(set(names)) and len(names) >= 100
    commands = {argv[0] for argv, _ in CASES.values() if not argv[0].startswith("-")}
    assert {"run", "submit", "eval", "zero-report"} <= commands


#: cases that get past the data-directory check first (skipped where the data is absent)
NEEDS_DATA = {"eval_missing_checkpoint", "eval_not_a_checkpoint", "eval_hf_garbage_bin", "eval_hf_garbage_safetensors"}
#: cases that import an optional package before they meet the bad value (skipped, naming it, where it is absent)
NEEDS_PACKAGES = {"eval_missing_checkpoint": ("tokenizers",), "eval_not_a_checkpoint": ("tokenizers",),
                  "eval_hf_garbage_bin": ("tokenizers",), "eval_hf_garbage_safetensors": ("tokenizers",),
                  "figures_unknown_figure": ("matplotlib", "seaborn")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, tmp_path, capsys, request):
    if name in NEEDS_DATA:
        request.getfixturevalue("data_dir")
    for package in NEEDS_PACKAGES.get(name, ()):
        pytest.importorskip(package, reason=f"needs {package}: pip install {package}")
    argv, text = materialise(*CASES[name], tmp_path)
    assert_refused(argv, *run_in_process(main, argv, capsys), text)


GPU_SESSION_CASES = {
    "gpu_session_out_a_file": (["--out", "{file}"], "{file} is a file"),
    "gpu_session_out_under_a_file": (["--out", "{file}/sub"], "is under {file}"),
    "gpu_session_out_unwritable": (["--out", "/proc/repro-gpu"], "/proc/repro-gpu"),
}


@pytest.mark.parametrize("name", sorted(GPU_SESSION_CASES))
def test_gpu_session_bad_out_exits_2_with_one_line(name, tmp_path, capsys):
    argv, text = materialise(*GPU_SESSION_CASES[name], tmp_path)
    assert_refused(argv, *run_in_process(gpu_session_main, argv, capsys), text)
