"""Discovery of experiments by walking the package, and validation of what modules declare."""

from __future__ import annotations

import pytest

from repro.experiments import Registry, discover, registry, validate_experiment
from repro.experiments.base import Experiment, Point


def _exp(**overrides) -> Experiment:
    fields = dict(name="x", paper="zero_2019", title="t",
                  points={"ci": (Point("a"),), "paper": (Point("b"),)}, run_point=lambda p, c: [])
    fields.update(overrides)
    return Experiment(**fields)


def test_shipped_modules_all_load_and_are_valid():
    reg = registry(refresh=True)
    assert reg.errors == {}, f"experiment modules failed to load: {reg.errors}"
    for exp in reg:
        assert validate_experiment(exp) == []
        assert exp.paper in {"megatron_lm_2019", "zero_2019", "zero_infinity_2021", "gna_2025", "mt_nlg_2022",
                             "t3_2024"}, exp.name


def test_ci_budgets_fit_in_twenty_minutes():
    """`repro reproduce --scale ci` runs ci, or smoke where an experiment has no ci: all of it in 20 minutes."""
    from repro.harness.reproduce import scale_to_run
    from repro.harness.runner import budget_for

    budgets = {exp.name: budget_for(exp, scale_to_run(exp, "ci"))[0] for exp in registry()}
    assert sum(budgets.values()) <= 20 * 60, budgets


def test_extra_modules_are_discovered(fake_registry: Registry):
    assert {"fake_sum", "fake_fail", "fake_gpu", "fake_huge"} <= set(fake_registry.names())
    assert fake_registry.get("fake_sum").budget_s["ci"] == 60.0


def test_unknown_experiment_names_the_known_ones_and_a_near_miss(fake_registry: Registry):
    with pytest.raises(ValueError, match=r"unknown experiment 'fake_sun'.*did you mean 'fake_sum'.*fake_fail"):
        fake_registry.get("fake_sun")


def test_unknown_scale_and_point_are_clear():
    exp = _exp()
    with pytest.raises(ValueError, match=r"no scale 'big'.*\['ci', 'paper'\]"):
        exp.points_for("big")
    with pytest.raises(ValueError, match=r"no point 'z'.*\['a'\]"):
        exp.point_named("ci", "z")


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"points": {"ci": (Point("a"),)}}, "scale 'paper' is missing"),
        ({"points": {"node": (Point("a"),), "paper": (Point("b"),)}}, "declares none of \\['ci', 'smoke'\\]"),
        ({"points": {"ci": (Point("a"),), "big": (Point("a"),), "paper": (Point("b"),)}}, "scales \\['big'\\]"),
        ({"points": {"ci": (Point("a"), Point("a")), "paper": (Point("b"),)}}, "used twice"),
        ({"points": {"ci": (Point("a", world_size=0),), "paper": (Point("b"),)}}, "world_size=0"),
        ({"points": {"ci": (Point("a", params={"f": object()}),), "paper": (Point("b"),)}}, "JSON"),
        ({"name": "has space"}, "identifier"),
        ({"budget_s": {"ci": 0}}, "budget_s"),
    ],
)
def test_invalid_declarations_are_named(overrides, problem):
    problems = validate_experiment(_exp(**overrides))
    assert any(__import__("re").search(problem, p) for p in problems), problems


def test_a_broken_module_is_reported_not_fatal(tmp_path):
    bad = tmp_path / "bad_mod.py"
    bad.write_text("raise ImportError('missing dependency xyz')\n")
    dup = tmp_path / "dup_mod.py"
    dup.write_text(
        "from repro.experiments.base import Experiment, Point\n"
        "E = Experiment(name='dup', paper='zero_2019', title='t', points={'ci': (Point('a'),), "
        "'paper': (Point('a'),)}, run_point=lambda p, c: [])\nEXPERIMENTS = (E, E)\n")
    reg = discover(extra=[str(bad), str(dup)])
    assert "missing dependency xyz" in reg.errors[str(bad)]
    assert "declared twice" in reg.errors[str(dup)]
    assert "dup" in reg  # the first declaration is kept


def test_one_experiment_is_found_without_importing_the_others():
    """``get_experiment`` (what a worker and ``repro run`` use) imports ``repro.experiments.NAME`` alone."""
    import os
    import subprocess
    import sys

    code = ("import sys; from repro.experiments import get_experiment; get_experiment('parameter_counts'); "
            "print(sorted(m for m in sys.modules if m.startswith('repro.experiments.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "REPRO_EXTRA_EXPERIMENTS"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['repro.experiments.base', 'repro.experiments.parameter_counts']"


#: In one fresh interpreter, in this order: the worker's plan (what slurm/launch.sh runs first in every Slurm job) of
#: a shipped experiment, of an unknown name (which loads every module to name the known ones) and of an extra one;
#: `repro --help`; `repro list` (every module). After each, which of torch and pandas are imported.
_PLAN_AND_LIST = """
import contextlib, io, json, os, sys
from repro.harness import worker
from repro import cli

def step(label, main, argv, extra=""):
    os.environ["REPRO_EXTRA_EXPERIMENTS"] = extra
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "pandas"})
    print(json.dumps([label, code, loaded, out.getvalue(), err.getvalue()]))

step("plan shipped", worker.main, ["zero_memory_tables", "--scale", "ci", "--plan"])
step("plan unknown", worker.main, ["nope", "--scale", "ci", "--plan"], sys.argv[1])
step("plan extra", worker.main, ["fake_sum", "--scale", "ci", "--plan"], sys.argv[1])
step("help", cli.main, ["--help"])
step("list", cli.main, ["list"], sys.argv[1])
"""


def test_planning_listing_and_refusing_import_no_torch(tmp_path):
    """The commands that only plan, list or refuse declare every experiment without torch (~2.5 s of CPU each): the
    worker's plan (once per Slurm job), its refusal of an unknown name, ``repro --help`` and ``repro list``; and only
    ``repro list``, which reads the rows for its "newest run" column, imports pandas."""
    import json
    import os
    import subprocess
    import sys

    from tests.experiments.conftest import FAKE

    env = {**os.environ, "REPRO_RESULTS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _PLAN_AND_LIST, str(FAKE)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = {label: (code, loaded, out, err)
             for label, code, loaded, out, err in map(json.loads, done.stdout.splitlines())}
    assert [(label, code) for label, (code, *_) in steps.items()] == [
        ("plan shipped", 0), ("plan unknown", 2), ("plan extra", 0), ("help", 0), ("list", 0)], steps
    assert "unknown experiment 'nope'" in steps["plan unknown"][3] and "fake_sum" in steps["plan unknown"][3]
    assert steps["plan extra"][2] == "n3\t1\t0\t0.5\nn4_ws2\t2\t0\t0.5\n"  # point, ranks, needs GPU, GiB
    assert "fake_sum" in steps["list"][2] and "zero_memory_tables" in steps["list"][2]
    assert {label: loaded for label, (_, loaded, *_) in steps.items()} == {
        "plan shipped": [], "plan unknown": [], "plan extra": [], "help": [], "list": ["pandas"]}

def test_an_experiment_outside_the_module_of_its_name_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "exp_pkg_outside"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("X = 1\n")  # a helper declares none: fine, nothing is skipped by name
    (package / "table_9.py").write_text(
        "from repro.experiments.base import Experiment, Point\n"
        "EXPERIMENT = Experiment(name='figure_9', paper='zero_2019', title='t', points={'ci': (Point('a'),), "
        "'paper': (Point('a'),)}, run_point=lambda p, c: [])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = discover(package="exp_pkg_outside", extra=[])
    assert "figure_9" not in reg and set(reg.errors) == {"exp_pkg_outside.table_9"}
    assert "it must live in exp_pkg_outside.figure_9" in reg.errors["exp_pkg_outside.table_9"]
