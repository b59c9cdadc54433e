"""Reading rows back: newest run per point, value changes, Slurm provenance, run ids."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from repro import provenance as P
from repro import results as R


def _write(root, run_id, point, value, scale="ci"):
    R.append_rows(root, experiment="e", scale=scale, point=point, run_id=run_id,
                  rows=[{"metric": "m", "value": value, "unit": "u", "tag": {"k": 1}}], prov={"job_id": None})


def test_latest_run_wins_per_point_and_scale(tmp_path):
    _write(tmp_path, "20260101T000000Z-aaaaaa", "p1", 1.0)
    _write(tmp_path, "20260101T000000Z-aaaaaa", "p2", 2.0)
    _write(tmp_path, "20260102T000000Z-bbbbbb", "p1", 3.0)
    _write(tmp_path, "20260103T000000Z-cccccc", "p1", 9.0, scale="paper")
    ci = R.load_rows(tmp_path, scale="ci")
    assert dict(zip(ci.point, ci.value)) == {"p1": 3.0, "p2": 2.0}
    assert ci["tag"].iloc[0] == '{"k": 1}'  # nested values become JSON text
    assert len(R.load_rows(tmp_path, latest_only=False)) == 4
    assert R.earlier_runs(tmp_path, "e", "ci", ["p1"]) == [R.run_path(tmp_path, "e", "20260102T000000Z-bbbbbb")]
    assert len(R.earlier_runs(tmp_path, "e", "ci")) == 2


def test_empty_results_give_an_empty_table(tmp_path):
    frame = R.load_rows(tmp_path)
    assert frame.empty and list(frame.columns) == R.KEY_COLUMNS


def test_value_changes_lists_changed_new_and_vanished_rows():
    old = pd.DataFrame({"experiment": ["e"] * 3, "scale": "ci", "point": ["a", "b", "c"], "metric": "m",
                        "unit": "u", "run_id": "r1", "value": [1.0, 2.0, 3.0]})
    new = pd.DataFrame({"experiment": ["e"] * 3, "scale": "ci", "point": ["a", "b", "d"], "metric": "m",
                        "unit": "u", "run_id": "r2", "value": [1.0, 2.5, 4.0]})
    changes = R.value_changes(old, new)
    assert set(changes["point"]) == {"b", "c", "d"}
    row = changes[changes.point == "b"].iloc[0]
    assert (row.old_value, row.new_value) == (2.0, 2.5)


def test_slurm_provenance_names_array_tasks():
    env = {"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "15", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_NODELIST": "n1"}
    assert P.slurm_provenance(env) == {"job_id": "15_2", "array_task_id": 2, "nodelist": "n1"}
    assert P.slurm_provenance({"SLURM_JOB_ID": "9"})["job_id"] == "9"
    assert P.slurm_provenance({})["job_id"] is None


def test_run_ids_sort_by_time_and_are_unique():
    early = P.new_run_id(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    late = P.new_run_id(dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc))
    assert early < late and early.startswith("20260101T000000.000000Z-")
    assert len({P.new_run_id() for _ in range(50)}) == 50


def test_a_run_written_by_hand_under_another_id_is_placed_by_its_date(tmp_path):
    """A run id that is not a timestamp (one GPU run was written as 'plainlong') must not win for ever because 'p'
    sorts after '2': such a run is placed by its rows' provenance date."""
    for run_id, point, value, date in (("plainlong", "p1", 1.0, "2026-11-27T22:50:11+00:00"),
                                       ("20261128T000000.000000Z-aaaaaa", "p1", 2.0, "2026-11-28T00:00:00+00:00"),
                                       ("plainlong", "p2", 3.0, "2026-11-27T22:50:11+00:00"),
                                       ("20261127T000000.000000Z-bbbbbb", "p2", 4.0, "2026-11-27T00:00:00+00:00")):
        R.append_rows(tmp_path, experiment="e", scale="node", point=point, run_id=run_id,
                      rows=[{"metric": "m", "value": value, "unit": "u"}], prov={"date": date})
    rows = R.load_rows(tmp_path)
    assert dict(zip(rows.point, rows.value)) == {"p1": 2.0, "p2": 3.0}
    assert P.run_time("20260101T000000Z-aaaaaa") == "20260101T000000.000000"


def test_a_copy_inside_another_git_repository_records_no_commit(tmp_path, monkeypatch):
    """A GPU session once ran an exported copy placed inside another repository and recorded that repository's HEAD
    as the suite's commit: the git top level must be the project's own root."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "other project"], check=True)
    (tmp_path / "copy").mkdir()
    monkeypatch.delenv("REPRO_GIT_COMMIT", raising=False)
    P.git_state.cache_clear()
    assert P.git_state(tmp_path / "copy") == ("unknown", False)
    monkeypatch.setenv("REPRO_GIT_COMMIT", "9923494")  # said by whoever exported the copy
    P.git_state.cache_clear()  # read once per process
    assert P.git_state(tmp_path / "copy") == ("9923494", False)
    P.git_state.cache_clear()
    commit, _ = P.git_state(tmp_path)
    assert len(commit) == 40


def test_results_go_to_the_current_directory_outside_a_checkout(tmp_path, monkeypatch):
    """Installed from a wheel, the package's parent is site-packages: results never go there (issue 34), but to
    $REPRO_RESULTS_DIR, else results/ in the current directory; in a checkout, to its results/."""
    import repro.checkout
    import repro.results as R

    monkeypatch.delenv(R.RESULTS_ENV, raising=False)
    assert R.in_checkout() and R.results_dir() == R.REPO_ROOT / "results"
    site = tmp_path / "site-packages"
    (site / "repro").mkdir(parents=True)
    monkeypatch.setattr(R, "REPO_ROOT", site)
    monkeypatch.setattr(repro.checkout, "REPO_ROOT", site)  # where in_checkout looks (repro.checkout decides it)
    monkeypatch.chdir(tmp_path)
    assert not R.in_checkout() and R.results_dir() == tmp_path / "results"
    monkeypatch.setenv(R.RESULTS_ENV, str(tmp_path / "elsewhere"))
    assert R.results_dir() == tmp_path / "elsewhere"
