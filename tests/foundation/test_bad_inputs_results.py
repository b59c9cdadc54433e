"""Bad run files and bad worker input end with exit code 2 and one line that names the value and the rule.

Run files: ``repro list``, ``claims`` and ``figures`` (and the worker's ``--skip-done``) read every row through
:func:`repro.results.read_run`, which names ``file:line`` and what is wrong there. The worker
(``python -m repro.harness.worker``): its options, its results directory and the launch variables it reads are
checked before any point runs. Each case runs the entry point in this process, except one that shows a real
process prints no usage block; each family has a valid neighbour that still works.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from repro import results as R
from repro.cli import main as repro_main
from repro.harness.worker import main as worker_main
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES, assert_refused, one_line, run_in_process

EXPERIMENT = "mtnlg_layout"
RUN_ID = "20261128T170000.000000Z-abcdef"
SLURM_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                   "SLURM_NTASKS_PER_NODE", "REPRO_RESULTS_DIR")


@pytest.fixture(autouse=True)
def _no_launch_variables(monkeypatch):
    for name in LAUNCH_VARIABLES + SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def base_results(tmp_path_factory) -> Path:
    """A results directory holding one ci run of mtnlg_layout (analytic, under a second)."""
    root = tmp_path_factory.mktemp("results")
    assert repro_main(["--results-dir", str(root), "run", EXPERIMENT]) == 0
    return root


def _run_file(root: Path) -> Path:
    (path,) = R.run_files(root, EXPERIMENT)
    return path


def _append(line: str) -> Callable[[Path], Path]:
    def edit(root: Path) -> Path:
        path = _run_file(root)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        return path
    return edit


def _set_values(make: Callable[[object], object], *, every: bool) -> Callable[[Path], Path]:
    """An edit that sets the first row's value (every row's with ``every``) to ``make(value)``."""
    def edit(root: Path) -> Path:
        path = _run_file(root)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows if every else rows[:1]:
            row["value"] = make(row["value"])
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path
    return edit


def _new_format_run(root: Path) -> Path:
    run_id = "20991128T000000.000000Z-02037e"
    path = R.run_path(root, EXPERIMENT, run_id)
    row = {"format": 2, "record": {"metric": "m", "value": 1.0, "unit": "s"}, "experiment": EXPERIMENT,
           "scale": "ci", "point": "analytic-model", "run_id": run_id}
    path.write_text(json.dumps(row) + "\n")
    return path


def _random_bytes(root: Path) -> Path:
    path = _run_file(root)
    path.write_bytes(b"\x80\xb6\xff" + bytes(range(256)))
    return path


def _folder(root: Path) -> Path:
    path = R.run_path(root, EXPERIMENT, RUN_ID)
    path.mkdir()
    return path


#: name -> (edit of a copy of the results, command, what the line says after "<file>:<line>: ")
RUN_FILE_CASES = {
    "row_is_an_array_list": (_append("[1,2]"), "list", ":40: a row must be a JSON object"),
    "row_is_an_array_claims": (_append("[1,2]"), "claims", ":40: a row must be a JSON object"),
    "row_is_an_array_figures": (_append("[1,2]"), "figures", ":40: a row must be a JSON object"),
    "row_is_a_string": (_append('"hello"'), "list", ":40: a row must be a JSON object, got a string 'hello'"),
    "value_is_text": (_set_values(lambda v: "oops", every=False), "claims", ":1: value must be a number"),
    "every_value_is_text_claims": (_set_values(str, every=True), "claims", ":1: value must be a number"),
    "every_value_is_text_figures": (_set_values(str, every=True), "figures", ":1: value must be a number"),
    "value_is_true": (_set_values(lambda v: True, every=False), "list", ":1: value must be a number"),
    "row_lacks_keys_list": (_append('{"metric":"x","value":1,"unit":"s"}'), "list",
                            ":40: the row lacks experiment, scale, point, run_id"),
    "row_lacks_keys_claims": (_append('{"metric":"x","value":1,"unit":"s"}'), "claims",
                              ":40: the row lacks experiment, scale, point, run_id"),
    "row_of_another_format": (_new_format_run, "claims", ":1: the row lacks metric, value, unit"),
    "metric_not_text": (_append(json.dumps({"experiment": EXPERIMENT, "scale": "ci", "point": "p", "run_id": RUN_ID,
                                            "metric": 3, "value": 1, "unit": "s"})), "list",
                        ":40: metric must be a string"),
    "provenance_not_an_object": (_append(json.dumps({"experiment": EXPERIMENT, "scale": "ci", "point": "p",
                                                     "run_id": RUN_ID, "metric": "m", "value": 1, "unit": "s",
                                                     "provenance": "x"})), "list",
                                 ":40: provenance must be a JSON object"),
    "not_utf8": (_random_bytes, "list", ":1: not UTF-8 text"),
    "not_json": (_append("{not json"), "list", ":40: not a JSON row"),
    "run_file_is_a_folder": (_folder, "list", ": cannot be read as a run file"),
}


@pytest.mark.parametrize("name", sorted(RUN_FILE_CASES))
def test_a_corrupt_run_file_is_one_line_naming_file_and_line(name, base_results, tmp_path, capsys):
    edit, command, text = RUN_FILE_CASES[name]
    root = tmp_path / "copy"
    shutil.copytree(base_results, root)
    path = edit(root)
    argv = ["--results-dir", str(root), command]
    code, err = run_in_process(repro_main, argv, capsys)
    assert_refused(argv, code, err, f"{path}{text}")
    assert one_line(err).startswith("repro: error: ")
    assert not (root / "claims.md").exists() and not (root / "figures").exists()  # refused before any work


def test_valid_run_files_still_list_and_null_values_still_load(base_results, tmp_path, capsys):
    root = tmp_path / "copy"
    shutil.copytree(base_results, root)
    assert repro_main(["--results-dir", str(root), "list"]) == 0
    _set_values(lambda v: None, every=False)(root)  # experiments write null for "no value" (t3_overlap)
    _append("")(root)  # a blank line is skipped
    rows = R.load_rows(root)
    assert len(rows) == 39 and rows["value"].isna().sum() == 1
    assert repro_main(["--results-dir", str(root), "list"]) == 0
    assert "error" not in capsys.readouterr().err


def test_a_point_may_not_return_a_value_the_reader_refuses():
    R.check_row({"metric": "m", "value": None, "unit": "s"})
    R.check_row({"metric": "m", "value": 3, "unit": "s"})
    with pytest.raises(ValueError, match="value must be a number"):
        R.check_row({"metric": "m", "value": "3", "unit": "s"}, where="e/p")


#: name -> (worker arguments, environment, text the line names); {dir} is a fresh results directory, {file} a file
WORKER_CASES = {
    "no_experiment": ([], {}, "the following arguments are required: experiment"),
    "point_index_text": ([EXPERIMENT, "--point-index", "abc", "--plan"], {}, "'abc' is not an integer"),
    "point_index_negative": ([EXPERIMENT, "--point-index", "-1", "--plan"], {}, "'-1' must be an integer >= 0"),
    "unknown_device": ([EXPERIMENT, "--device", "tpu", "--plan"], {}, "'tpu'"),
    "results_dir_is_a_file": ([EXPERIMENT, "--results-dir", "{file}"], {}, "{file} is a file"),
    "results_dir_under_a_file": ([EXPERIMENT, "--results-dir", "{file}/x"], {}, "{file}/x is under"),
    "results_dir_unwritable": ([EXPERIMENT, "--results-dir", "/proc/repro-x"], {}, "/proc/repro-x"),
    "results_env_is_a_file": ([EXPERIMENT], {"REPRO_RESULTS_DIR": "{file}"}, "REPRO_RESULTS_DIR"),
    "results_dir_empty": ([EXPERIMENT, "--results-dir", ""], {}, "'' is empty"),
    "run_id_month_13": ([EXPERIMENT, "--run-id", "20261399T999999Z-abcdef", "--plan"], {},
                        "20261399T999999 is not a real UTC time"),
    "run_id_february_30": ([EXPERIMENT, "--run-id", "20260230T000000.000000Z-abcdef", "--plan"], {},
                           "20260230T000000 is not a real UTC time"),
    "world_size_text": ([EXPERIMENT, "--results-dir", "{dir}"], {"WORLD_SIZE": "abc"},
                        "WORLD_SIZE='abc' must be an integer >= 1"),
    "world_size_zero": ([EXPERIMENT, "--results-dir", "{dir}"], {"WORLD_SIZE": "0"},
                        "WORLD_SIZE='0' must be an integer >= 1"),
    "world_size_negative": ([EXPERIMENT, "--results-dir", "{dir}"], {"WORLD_SIZE": "-3"},
                            "WORLD_SIZE='-3' must be an integer >= 1"),
    "srun_task_count_text": ([EXPERIMENT, "--results-dir", "{dir}"],
                             {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1",
                              "SLURM_STEP_NUM_TASKS": "xyz"}, "SLURM_STEP_NUM_TASKS='xyz'"),
    "array_task_id_text": ([EXPERIMENT, "--results-dir", "{dir}"],
                           {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "abc"},
                           "SLURM_ARRAY_TASK_ID='abc' must be an integer >= 0"),
}


def _filled(text: str, tmp_path: Path) -> str:
    return text.format(dir=tmp_path / "res", file=tmp_path / "afile")


@pytest.mark.parametrize("name", sorted(WORKER_CASES))
def test_bad_worker_input_is_refused_before_any_point_runs(name, tmp_path, monkeypatch, capsys):
    args, env, text = WORKER_CASES[name]
    (tmp_path / "afile").touch()
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, _filled(value, tmp_path))
    argv = [_filled(arg, tmp_path) for arg in args]
    code, err = run_in_process(worker_main, argv, capsys)
    assert_refused(argv, code, err, _filled(text, tmp_path))
    assert not list(tmp_path.rglob("*.jsonl")), "a point ran before the refusal"
    assert not (tmp_path / "res").exists() and not (tmp_path / "runs").exists()


def test_a_worker_usage_error_is_one_line_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "repro.harness.worker", EXPERIMENT, "--point-index", "abc",
                           "--plan"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "'abc' is not an integer" in one_line(proc.stderr)


def _job_run(root: Path, lines: list[str]) -> None:
    path = R.run_path(root, EXPERIMENT, RUN_ID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


GOOD_ROW = json.dumps({"experiment": EXPERIMENT, "scale": "ci", "point": "analytic-model", "run_id": RUN_ID,
                       "metric": "m", "value": 1.0, "unit": "s", "provenance": {"job_id": "77"}})
SKIP_DONE_CASES = {
    "row_is_an_array": (["[1,2]"], ":1: a row must be a JSON object"),
    "provenance_is_text": ([GOOD_ROW, GOOD_ROW.replace('{"job_id": "77"}', '"x"')],
                           ":2: provenance must be a JSON object"),
}


@pytest.mark.parametrize("name", sorted(SKIP_DONE_CASES))
def test_skip_done_refuses_a_corrupt_run_file(name, tmp_path, monkeypatch, capsys):
    lines, text = SKIP_DONE_CASES[name]
    _job_run(tmp_path, lines)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    argv = [EXPERIMENT, "--plan", "--run-id", RUN_ID, "--skip-done", "--results-dir", str(tmp_path)]
    code, err = run_in_process(worker_main, argv, capsys)
    assert_refused(argv, code, err, f"{R.run_path(tmp_path, EXPERIMENT, RUN_ID)}{text}")


def test_skip_done_refuses_a_folder_in_place_of_the_run_file(tmp_path, monkeypatch, capsys):
    R.run_path(tmp_path, EXPERIMENT, RUN_ID).mkdir(parents=True)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    argv = [EXPERIMENT, "--plan", "--run-id", RUN_ID, "--skip-done", "--results-dir", str(tmp_path)]
    code, err = run_in_process(worker_main, argv, capsys)
    assert_refused(argv, code, err, "cannot be read as a run file")


def test_valid_worker_input_still_works(tmp_path, monkeypatch, capsys):
    """The neighbours of the cases above: a good run file is skipped by its own job, a real run id plans, and
    WORLD_SIZE=1 with a results directory still to be made runs the point locally."""
    _job_run(tmp_path / "done", [GOOD_ROW])
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    argv = [EXPERIMENT, "--plan", "--run-id", RUN_ID, "--skip-done", "--results-dir", str(tmp_path / "done")]
    assert worker_main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "already in run" in captured.err
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert worker_main([EXPERIMENT, "--point-index", "0", "--run-id", "20260228T235959Z-0a0b0c", "--plan"]) == 0
    assert capsys.readouterr().out.startswith("analytic-model\t1\t")
    assert worker_main([EXPERIMENT, "--results-dir", str(tmp_path / "new" / "res")]) == 0
    (path,) = R.run_files(tmp_path / "new" / "res", EXPERIMENT)
    assert R.read_run(path)[0]["provenance"]["job_id"] == "77_0"
