"""slurm/launch.sh refuses a bad environment variable, experiment, scale or array index before any srun step: exit
code 2 and one line that names the value (the planning worker's refusal passed on once, after launch's own prefix),
no traceback; the valid neighbour of each still launches. Without a cluster: tests/slurm/launch_stubs.py's srun
only logs its steps here (SRUN_RUN=0), so a case costs a planning worker."""

from __future__ import annotations

import subprocess
import sys

import pytest

from repro.provenance import new_run_id
from repro.results import REPO_ROOT
from tests.foundation.bad_input_helpers import one_line
from tests.slurm.launch_stubs import LAUNCH, make_stubs, stub_env

#: name: (launch.sh's arguments, environment on top of the stubs' ({tmp} and {file} filled in), text of the line)
CASES = {
    "port_with_a_blank": (["fake_sum"], {"REPRO_MASTER_PORT": "1 2"}, "REPRO_MASTER_PORT='1 2' must be a port"),
    "port_not_a_number": (["fake_sum"], {"REPRO_MASTER_PORT": "abc"}, "REPRO_MASTER_PORT=abc must be a port"),
    "port_too_large": (["fake_sum"], {"REPRO_MASTER_PORT": "70000"}, "REPRO_MASTER_PORT=70000 must be a port"),
    "port_zero": (["fake_sum"], {"REPRO_MASTER_PORT": "0"}, "REPRO_MASTER_PORT=0 must be a port number 1-65535"),
    "port_last_point_past_65535": (["fake_sum"], {"REPRO_MASTER_PORT": "65535"},
                                   "REPRO_MASTER_PORT=65535 leaves no port for the last of the 2 point(s)"),
    "results_a_file": (["fake_sum"], {"REPRO_RESULTS_DIR": "{file}"}, "REPRO_RESULTS_DIR={file} is a file"),
    "results_under_a_file": (["fake_sum"], {"REPRO_RESULTS_DIR": "{file}/res"},
                             "REPRO_RESULTS_DIR={file}/res is under {file}, which is a file"),
    "python_not_a_command": (["fake_sum"], {"REPRO_PYTHON": "nopython"}, "REPRO_PYTHON=nopython is not a command"),
    "run_id_bad": (["fake_sum"], {"REPRO_RUN_ID": "bad"}, "REPRO_RUN_ID=bad is not a timestamp run id"),
    "array_task_not_a_number": (["fake_sum"], {"SLURM_ARRAY_TASK_ID": "abc"}, "SLURM_ARRAY_TASK_ID=abc must be"),
    "array_task_empty": (["fake_sum"], {"SLURM_ARRAY_TASK_ID": ""}, "SLURM_ARRAY_TASK_ID='' must be a whole"),
    "job_id_not_a_number": (["fake_sum"], {"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID=abc must be a whole number"),
    "restart_count_not_a_number": (["fake_sum"], {"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT=x must be"),
    "scale_unknown": (["fake_sum", "huge"], {}, "cannot plan fake_sum at scale huge: "),
    "experiment_unknown": (["nope"], {}, "cannot plan nope at scale ci: unknown experiment 'nope'"),
    "experiment_empty": ([""], {}, "cannot plan '' at scale ci: unknown experiment ''"),
    "array_index_out_of_range": (["fake_sum"], {"SLURM_ARRAY_TASK_ID": "5"}, "point index 5 is out of range"),
}

#: valid neighbours: each launches every point it is given (SRUN_RUN=0: the steps are only logged)
NEIGHBOURS = {
    "port_leaves_a_port_for_each_point": ({"REPRO_MASTER_PORT": "65534"}, 2),
    "run_id_from_new_run_id": ({"REPRO_RUN_ID": new_run_id()}, 2),
    "array_task_in_range": ({"SLURM_ARRAY_TASK_ID": "1"}, 1),
    "results_a_new_folder": ({"REPRO_RESULTS_DIR": "{tmp}/new/res"}, 2),
    "restart_count_empty_is_zero": ({"SLURM_RESTART_COUNT": ""}, 2),
}


def _launch(tmp_path, args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess:
    stubs = make_stubs(tmp_path)
    (tmp_path / "afile").touch()
    filled = {key: value.format(tmp=tmp_path, file=tmp_path / "afile") for key, value in extra.items()}
    env = stub_env(tmp_path, stubs, SRUN_RUN="0", SRUN_LOG=str(tmp_path / "srun.log"), REPRO_PYTHON=sys.executable)
    env.update(filled)
    return subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          env=env)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line_before_any_step(name, tmp_path):
    args, extra, text = CASES[name]
    proc = _launch(tmp_path, args, extra)
    text = text.format(file=tmp_path / "afile")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith("repro launch: error: ") and text in line, line
    assert line.count(": error: ") == 1, line  # the worker's own prefix is not repeated
    assert proc.stdout == "" and not (tmp_path / "srun.log").exists(), proc.stdout


@pytest.mark.parametrize("name", sorted(NEIGHBOURS))
def test_valid_neighbour_launches_its_points(name, tmp_path):
    extra, steps = NEIGHBOURS[name]
    proc = _launch(tmp_path, ["fake_sum"], extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len((tmp_path / "srun.log").read_text().splitlines()) == steps, proc.stdout
