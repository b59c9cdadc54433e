"""Bad input to ``repro submit`` and ``repro zero-report``: exit code 2 and one line that names the value and the
rule, before anything is submitted, measured or written; beside each table, the valid neighbours still work.

Every case runs the entry point in this process (each is found in argument checking); ``repro submit`` without
``--dry-run`` meets a stand-in ``sbatch`` on PATH that records its arguments, working folder and environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from repro.cli import main
from repro.harness import submit as S
from repro.harness import zero_report
from repro.testing import needs
from tests.foundation.bad_input_helpers import assert_refused, run_in_process

DRY = ["--dry-run"]
SUBMIT_CASES = {
    "submit_sbatch_arg_double_dash": (["mtnlg_layout", "--sbatch-arg=--", *DRY], "'--'"),  # was AttributeError
    "submit_sbatch_arg_double_dash_apart": (["mtnlg_layout", "--sbatch-arg", "--", *DRY], "'--'"),
    "submit_sbatch_arg_mem_per_cpu": (["mtnlg_layout", "--sbatch-arg=--mem-per-cpu=4G", *DRY], "use --mem"),
    "submit_sbatch_arg_mem_per_gpu": (["mtnlg_layout", "--sbatch-arg=--mem-per-gpu=4G", *DRY], "use --mem"),
    "submit_sbatch_arg_gpus": (["mtnlg_layout", "--sbatch-arg=--gpus=4", *DRY], "use --gpus-per-node"),
    "submit_sbatch_arg_gpus_short": (["mtnlg_layout", "--sbatch-arg=-G4", *DRY], "'-G4'"),
    "submit_sbatch_arg_gpus_per_task": (["mtnlg_layout", "--sbatch-arg=--gpus-per-task=1", *DRY], "--gpus-per-node"),
    "submit_sbatch_arg_cpus_per_gpu": (["mtnlg_layout", "--sbatch-arg=--cpus-per-gpu=2", *DRY], "--cpus-per-task"),
    "submit_sbatch_arg_wrap": (["mtnlg_layout", "--sbatch-arg=--wrap=ls", *DRY], "'--wrap=ls'"),
    "submit_sbatch_arg_export_none": (["mtnlg_layout", "--sbatch-arg=--export=NONE", *DRY], "--export=ALL"),
    "submit_sbatch_arg_export_some": (["mtnlg_layout", "--sbatch-arg=--export=PATH", *DRY], "'--export=PATH'"),
    "submit_sbatch_arg_chdir": (["mtnlg_layout", "--sbatch-arg=--chdir=/", *DRY], "'--chdir=/'"),
    "submit_sbatch_arg_chdir_short": (["mtnlg_layout", "--sbatch-arg=-D/", *DRY], "'-D/'"),
    "submit_gpus_zero_for_gpu_points": (["megatron_weak_scaling_gpu", "--scale", "paper", "--gpus-per-node", "0",
                                         *DRY], "--gpus-per-node 0"),
    "submit_time_past_32_bits": (["mtnlg_layout", "--time", "99999999999", *DRY], "'99999999999'"),
    "submit_time_days_past_32_bits": (["mtnlg_layout", "--time", "9999999-00", *DRY], "'9999999-00'"),
    "submit_mem_huge": (["mtnlg_layout", "--mem", "99999999999", *DRY], "'99999999999'"),
    "submit_cpus_past_16_bits": (["mtnlg_layout", "--cpus-per-task", "99999999999", *DRY], "'99999999999'"),
    "submit_gpus_past_16_bits": (["mtnlg_layout", "--gpus-per-node", "100000", *DRY], "'100000'"),
    # values Slurm would take and no cluster grants: a century of time, a thousand GPUs on one node
    "submit_time_a_century": (["mtnlg_layout", "--time", "99999999", *DRY], "--time '99999999'"),
    "submit_time_days_two_years": (["mtnlg_layout", "--time", "730-00", *DRY], "--time '730-00'"),
    "submit_gpus_a_thousand": (["mtnlg_layout", "--gpus-per-node", "1000", *DRY], "--gpus-per-node '1000'"),
    "submit_cpus_ten_thousand": (["mtnlg_layout", "--cpus-per-task", "10000", *DRY], "--cpus-per-task '10000'"),
    "submit_mem_a_petabyte": (["mtnlg_layout", "--mem", "1048576", *DRY], "--mem '1048576'"),
    "submit_max_parallel_huge": (["mtnlg_layout", "--max-parallel", "99999999999999999999", *DRY],
                                 "'99999999999999999999'"),
}


@pytest.mark.parametrize("name", sorted(SUBMIT_CASES))
def test_bad_submit_input_exits_2_with_one_line(name, tmp_path, capsys):
    argv = ["--results-dir", str(tmp_path / "results"), "submit", *SUBMIT_CASES[name][0]]
    assert_refused(argv, *run_in_process(main, argv, capsys), SUBMIT_CASES[name][1])


def test_valid_neighbours_of_the_submit_cases_still_plan(tmp_path, capsys):
    for argv in (["mtnlg_layout", "--sbatch-arg=--export=ALL,X=1", "--sbatch-arg=--account=abc"],
                 ["mtnlg_layout", "--time", "366-00", "--mem", "65536", "--cpus-per-task", "1024"],
                 ["mtnlg_layout", "--gpus-per-node", "64", "--max-parallel", "4000001"],
                 ["mtnlg_layout", "--gpus-per-node", "0"],  # a CPU experiment asks for no GPUs anyway
                 ["megatron_weak_scaling_gpu", "--scale", "paper", "--gpus-per-node", "0", "--cpu"]):
        code = main(["--results-dir", str(tmp_path / "results"), "submit", *argv, *DRY])
        out, err = capsys.readouterr()
        assert code == 0 and "sbatch --parsable" in out, f"{argv}: {err}"
        if "--export=ALL,X=1" in argv[1]:
            assert "--export=ALL,X=1 --account=abc" in out


SBATCH = """#!/usr/bin/env python3
import json, os, sys
json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "results": os.environ.get("REPRO_RESULTS_DIR")},
          open(os.environ["FAKE_SBATCH_OUT"], "w"))
print("123")
"""


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``sbatch`` first on PATH; returns the JSON file where it records what it was given."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "sbatch").write_text(SBATCH)
    (folder / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH_OUT", str(tmp_path / "sbatch.json"))
    monkeypatch.setattr(S, "SLURM_DIR", tmp_path / "slurm")
    return tmp_path / "sbatch.json"


def test_a_relative_results_dir_reaches_sbatch_as_an_absolute_path(fake_sbatch, tmp_path, monkeypatch, capsys):
    work = tmp_path / "here"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("REPRO_RESULTS_DIR", raising=False)
    assert main(["--results-dir", "relres", "submit", "mtnlg_layout"]) == 0, capsys.readouterr().err
    seen = json.loads(fake_sbatch.read_text())
    logs = work.resolve() / "relres" / "slurm-logs"  # the working folder, as os.getcwd() names it
    assert f"--output={logs / '%x-%j.out'}" in seen["argv"], seen
    assert seen["results"] == str(work.resolve() / "relres"), seen
    assert logs.is_dir() and seen["cwd"] != str(work)  # sbatch runs in the checkout; the log folder is here


def test_submit_makes_a_relative_results_variable_absolute(fake_sbatch, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from repro.experiments import registry

    job = S.plans(registry().get("mtnlg_layout"), "ci", write_files=False, log_dir=tmp_path / "logs")[0]
    assert S.submit(job, env={"REPRO_RESULTS_DIR": "rel"}) == "123"
    assert json.loads(fake_sbatch.read_text())["results"] == str(tmp_path.resolve() / "rel")


OK_ROW = {"framework": "x", "psi": 1000, "stage": 1, "dp_size": 2, "rss_peak": 5000000, "rss_start": 1000000}
ROWS = {
    "empty": [], "framework_only": [{"framework": "x"}], "psi_text": [{**OK_ROW, "psi": "many", "rss_peak": 5e6}],
    "stage_7": [{**OK_ROW, "stage": 7, "dp_size": 0}], "dp_size_0": [{**OK_ROW, "dp_size": 0}],
    "rss_negative": [{**OK_ROW, "rss_peak": -1}], "rss_text": [{**OK_ROW, "rss_start": "1 MB"}],
    "ledger_key": [{**OK_ROW, "ledger": {"params": 5}}], "transient_text": [{**OK_ROW, "transient_peak": {"a": "b"}}],
    "spec_dtype": [{**OK_ROW, "spec": {"zero": {"dtype": "fp8"}}}], "ok": [OK_ROW],
    "second_row_bad": [OK_ROW, {**OK_ROW, "framework": 5}],
}
NO_MEASURE = ["--no-measure", "--out", "{dir}/z/report"]
ZERO_CASES = {
    "zero_report_rows_empty_list": (["--rows", "{empty}", *NO_MEASURE], "no rows"),
    "zero_report_rows_lack_keys": (["--rows", "{framework_only}", *NO_MEASURE], "row 1 lacks 'stage'"),
    "zero_report_rows_psi_text": (["--rows", "{psi_text}", *NO_MEASURE], "row 1 has psi 'many'"),
    "zero_report_rows_stage_7": (["--rows", "{stage_7}", *NO_MEASURE], "row 1 has stage 7"),
    "zero_report_rows_dp_size_0": (["--rows", "{dp_size_0}", *NO_MEASURE], "row 1 has dp_size 0"),
    "zero_report_rows_rss_negative": (["--rows", "{rss_negative}", *NO_MEASURE], "rss_peak -1"),
    "zero_report_rows_rss_text": (["--rows", "{rss_text}", *NO_MEASURE], "rss_start '1 MB'"),
    "zero_report_rows_ledger_key": (["--rows", "{ledger_key}", *NO_MEASURE], "{ledger_key}: row 1 has ledger"),
    "zero_report_rows_transient_text": (["--rows", "{transient_text}", *NO_MEASURE], "transient_peak"),
    "zero_report_rows_spec_dtype": (["--rows", "{spec_dtype}", *NO_MEASURE], "'fp8'"),
    "zero_report_rows_second_row": (["--rows", "{second_row_bad}", *NO_MEASURE], "row 2 has framework 5"),
    "zero_report_rows_empty_path": (["--rows", "", *NO_MEASURE], "--rows '' is empty"),
    "zero_report_out_empty": (["--rows", "{ok}", "--no-measure", "--out", ""], "--out '' is empty"),
    "zero_report_out_a_folder": (["--rows", "{ok}", "--no-measure", "--out", "{dir}/z/sub/"], "'{dir}/z/sub/'"),
    "zero_report_out_dot": (["--rows", "{ok}", "--no-measure", "--out", "."], "--out '.'"),
    "zero_report_nvme_path_without_nvme": (["--nvme-path", "{dir}/afile", "--rows", "{ok}", *NO_MEASURE],
                                           "'{dir}/afile'"),
    "zero_report_nvme_path_with_cpu": (["--offload", "cpu", "--nvme-path", "{dir}", "--rows", "{ok}", *NO_MEASURE],
                                       "--offload nvme"),
}


def rows_files(tmp_path: Path) -> dict[str, str]:
    values = {"dir": str(tmp_path)}
    (tmp_path / "afile").write_text("")
    for name, rows in ROWS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(rows))
        values[name] = str(tmp_path / f"{name}.json")
    return values


@pytest.mark.parametrize("name", sorted(ZERO_CASES))
def test_bad_zero_report_input_exits_2_with_one_line(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = rows_files(tmp_path)
    argv = [arg.format(**values) for arg in ZERO_CASES[name][0]]
    assert_refused(argv, *run_in_process(zero_report.main, argv, capsys), ZERO_CASES[name][1].format(**values))
    assert not (tmp_path / "z").exists() and not list(tmp_path.glob(".*.json"))  # nothing written


@needs("matplotlib")  # the report always draws <out>.png
def test_valid_rows_still_make_the_report(tmp_path, capsys):
    values = rows_files(tmp_path)
    measured = zero_report.measure_stages(world_size=1, stages=[1], model_kwargs={
        "vocab_size": 128, "hidden_size": 32, "num_layers": 1, "num_attention_heads": 4,
        "max_position_embeddings": 16}, seq_len=16, steps=1)
    (tmp_path / "measured.json").write_text(json.dumps([{**m, "framework": "repro"} for m in measured]))
    for rows, out in ((values["ok"], tmp_path / "z" / "a"), (str(tmp_path / "measured.json"), tmp_path / "m")):
        assert zero_report.main(["--rows", rows, "--no-measure", "--out", str(out)]) == 0, capsys.readouterr().err
        assert Path(f"{out}.json").exists() and Path(f"{out}.png").stat().st_size > 0
