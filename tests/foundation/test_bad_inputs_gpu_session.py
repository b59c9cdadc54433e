"""``python -m repro.gpu_session`` refuses a bad option, ``$OUT`` or ``--provenance`` path before any part runs: exit
code 2 and one line that names the value (its argparse errors too, as every other command's), no traceback; the
valid neighbour of each goes on (to the part check, which a name no plan has stops before anything runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from repro.gpu_plans import REPO
from repro.gpu_session import main
from tests.foundation.bad_input_helpers import assert_refused, one_line, run_in_process

#: name: (argv with {tmp} and {file} filled in, $OUT or None, the text the one line must hold)
CASES = {
    "plan_unknown": (["--plan", "nope"], None, "invalid choice: 'nope'"),
    "deadline_not_a_number": (["--deadline-s", "abc"], None, "'abc' is not a number"),
    "deadline_inf": (["--deadline-s", "inf", "--part", "nope"], None, "'inf' must be a positive, finite number"),
    "deadline_nan": (["--deadline-s", "nan", "--part", "nope"], None, "'nan' must be a positive, finite number"),
    "deadline_zero": (["--deadline-s", "0", "--part", "nope"], None, "'0' must be a positive, finite number"),
    "deadline_negative": (["--deadline-s", "-5", "--part", "nope"], None, "'-5' must be a positive"),
    "out_empty": (["--out", "", "--part", "nope"], None, "--out '' is empty"),
    "out_blank": (["--out", " ", "--part", "nope"], None, "--out ' ' is empty"),
    "env_out_a_file": ([], "{file}", "OUT={file} (the folder when --out is not given) is a file"),
    "env_out_blank": ([], " ", "OUT=' ' (the folder when --out is not given) is empty"),
    "env_out_under_a_file": ([], "{file}/sub", "OUT={file}/sub (the folder when --out is not given) is under"),
    "provenance_under_a_file": (["--provenance", "{file}/p.json"], None, "--provenance {file}/p.json is under"),
    "provenance_a_directory": (["--provenance", "{tmp}"], None, "--provenance {tmp} is a directory"),
    "provenance_empty": (["--provenance", ""], None, "--provenance '' is empty"),
    "part_empty": (["--out", "{tmp}/out", "--part", ""], None, "unknown part(s) ''; the parts are provenance"),
    "part_unknown": (["--out", "{tmp}/out", "--part", "nope", "--part", "gna"], None, "unknown part(s) 'nope';"),
}

#: valid neighbours: each gets past its own check and is stopped by the unknown part, before any part runs
NEIGHBOURS = {
    "deadline_finite": (["--deadline-s", "0.5", "--out", "{tmp}/out", "--part", "nope"], None),
    "plan_perf": (["--plan", "perf", "--out", "{tmp}/out", "--part", "nope"], None),
    "env_out_a_new_folder": (["--part", "nope"], "{tmp}/new/out"),
    "out_beats_env_out": (["--out", "{tmp}/out", "--part", "nope"], "{file}"),
}


def _fill(values: list[str], tmp_path) -> list[str]:
    file = tmp_path / "afile"
    file.touch()
    return [value.format(tmp=tmp_path, file=file) for value in values]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, tmp_path, capsys, monkeypatch):
    argv, out_env, text = CASES[name]
    argv, (text,) = _fill(argv, tmp_path), _fill([text], tmp_path)
    if out_env is None:
        monkeypatch.delenv("OUT", raising=False)
    else:
        monkeypatch.setenv("OUT", _fill([out_env], tmp_path)[0])
    code, err = run_in_process(main, argv, capsys)
    assert_refused(argv, code, err, text)
    assert err.startswith("repro.gpu_session: error: "), err
    assert not (tmp_path / "out" / "logs").exists()  # no part started


@pytest.mark.parametrize("name", sorted(NEIGHBOURS))
def test_valid_neighbour_gets_to_the_part_check(name, tmp_path, capsys, monkeypatch):
    argv, out_env = NEIGHBOURS[name]
    argv = _fill(argv, tmp_path)
    if out_env is None:
        monkeypatch.delenv("OUT", raising=False)
    else:
        monkeypatch.setenv("OUT", _fill([out_env], tmp_path)[0])
    code, err = run_in_process(main, argv, capsys)
    assert code == 2 and "unknown part(s) 'nope'" in one_line(err), err


def test_provenance_to_a_new_file_still_writes_it(tmp_path, capsys):
    path = tmp_path / "new" / "provenance.json"
    assert main(["--provenance", str(path)]) == 0
    assert json.loads(path.read_text())["python"] == json.loads(capsys.readouterr().out)["python"]


def test_argparse_error_is_one_line_as_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "repro.gpu_session", "--plan", "nope", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc
    line = one_line(proc.stderr)
    assert line.startswith("repro.gpu_session: error: argument --plan: invalid choice: 'nope'"), line
    assert line.endswith("(see python -m repro.gpu_session --help)"), line


#: ``python -m repro.gpu_probe``: (argv with {tmp} and {file} filled in, the text its one line must hold); None: the
#: valid neighbour, which runs (a budget of one second: every section is skipped, saying so, and the command succeeds)
PROBE_CASES = {
    "budget_zero": (["--out", "{tmp}/p", "--budget-s", "0"], "'0' must be a positive, finite number"),
    "budget_text": (["--out", "{tmp}/p", "--budget-s", "soon"], "'soon' is not a number"),
    "out_a_file": (["--out", "{file}"], "--out {file} is a file"),
    "out_missing": (["--budget-s", "5"], "the following arguments are required: --out"),
    "budget_one_second": (["--out", "{tmp}/p", "--budget-s", "1", "--toy"], None),
}
#: the cases run as real processes (the refusal's exit status and stderr as a user sees them, and the neighbour,
#: which runs the probe's sections); the other refusals take the same path (the parser's one-line error) in this
#: process, which saves starting torch and repro for each (~3 s of CPU apiece)
PROBE_REAL_PROCESSES = ("budget_zero", "budget_one_second")


@pytest.mark.parametrize("name", sorted(PROBE_CASES))
def test_the_probe_refuses_a_bad_budget_or_folder_in_one_line(tmp_path, name, capsys, monkeypatch):
    argv, text = PROBE_CASES[name]
    file = tmp_path / "a_file"
    file.write_text("x")
    argv = [a.format(tmp=tmp_path, file=file) for a in argv]
    if name in PROBE_REAL_PROCESSES:
        proc = subprocess.run([sys.executable, "-m", "repro.gpu_probe", *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=300,
                              env={**__import__("os").environ, "REPRO_RESULTS_DIR": str(tmp_path / "r")})
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        from repro.gpu_probe import main as probe_main

        monkeypatch.setenv("REPRO_RESULTS_DIR", str(tmp_path / "r"))
        capsys.readouterr()
        try:
            code = probe_main(argv)
        except SystemExit as exit_:  # argparse's exit is the exit status
            code = exit_.code
        out, err = capsys.readouterr()
    if text is None:
        assert code == 0, err
        assert out.count("skipped") == 6  # every section, each saying how little time was left
        return
    assert code == 2 and not out
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert text.format(file=file) in line, line
    assert not (tmp_path / "r").exists()  # nothing written
