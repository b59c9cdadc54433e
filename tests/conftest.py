"""Fixtures every test folder may use: the verified data directory (skip, not fail, where it is absent).

A test whose code reaches an optional package that is not installed (:class:`repro.optional.MissingPackage`, in
the test or in a fixture) skips with that package's one-line message instead of failing; tests that need one in a
subprocess say so with :func:`repro.testing.needs`. A package that is installed but broken
(:class:`repro.optional.BrokenPackage`) fails the test with its one line: a broken environment is not a machine
without the package. Tests that need the evaluation data skip without it, and the run ends with one line saying how
to get it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# One intra-op thread for the tests and every process they start (commands, torchrun jobs; a value already set is
# kept). The tests' models are tiny: a second OpenMP thread adds nothing but spin-waits, and with one test process
# per core (the README's `-n auto`) each process's threads wait on the other's core. Two test files side by side on
# this project's 2-core machine: 72 -> 13 s of CPU each (tests/training/test_flat_optimizer.py). Tests that measure
# threads or time set their own count (tests/zero/test_zero_gpu_experiment.py, the GNA kernels' threads points).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # torch read the variable at its import
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from repro.text.data_files import DataError, default_data_dir, fetch_command, resolve_data_dir
from repro.optional import BrokenPackage, MissingPackage


#: the start of every skip for want of the evaluation data (counted in the run's last lines)
NO_DATA = "evaluation data not available"


@pytest.fixture(scope="session")
def data_dir():
    try:
        return resolve_data_dir()
    except DataError as err:  # the evaluation data is not part of the repository
        pytest.skip(f"{NO_DATA}: {err}")


def pytest_terminal_summary(terminalreporter):
    """One line for all the tests that skipped for want of the evaluation data: how many, and how to get it."""
    skipped = [r for r in terminalreporter.stats.get("skipped", ())
               if NO_DATA in str(getattr(r, "longrepr", "") or "")]
    if skipped:
        where = default_data_dir()[0]
        terminalreporter.write_line(f"{len(skipped)} test(s) skipped for want of the evaluation data in {where}: get "
                                    f"it with `{fetch_command(None)}` (or point $REPRO_DATA at a copy), then run "
                                    "them again")


def _skip_or_fail(err: MissingPackage):
    """A package that is not installed: skip, naming it; one installed but broken: fail, in one line."""
    if isinstance(err, BrokenPackage):
        pytest.fail(str(err), pytrace=False)
    pytest.skip(str(err))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    except MissingPackage as err:
        _skip_or_fail(err)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except MissingPackage as err:
        _skip_or_fail(err)


def _exercises_cuda(item) -> bool:
    """A test that runs on a GPU: parametrized with the device "cuda", or skipped where there is no CUDA GPU."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    if any(isinstance(value, str) and value == "cuda" for value in params):
        return True
    return any("CUDA" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))


#: Tests that share one resource of this machine run in one pytest-xdist worker, one after another, by the marker
#: that says they need it: the local Slurm cluster (``slurm``: two emulated nodes; two tests' jobs at once would queue
#: behind each other past their time limits). The tests/slurm files that run no job (stand-ins) are not marked.
SERIAL_GROUPS = {"slurm": "local-slurm"}


#: fixture scopes that outlive one test inside a file: a test that uses one runs in its file's group
SHARED_SCOPES = ("class", "module", "package")


def shares_fixtures(item) -> bool:
    """Whether the test uses a fixture built once for several tests of its file (a module's trained model, its
    command run once); a test that cannot tell (no fixture information) is taken to."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    return any(defs and defs[-1].scope in SHARED_SCOPES for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """Mark every test that exercises a GPU ``cuda``, so that ``pytest -m cuda`` (the 9-minute GPU command's tests
    part, ``python -m repro.gpu_session``) runs exactly those.

    Under pytest-xdist (the README's test command, ``-n auto --dist loadgroup``) a test that uses a fixture built for
    several tests of its file (class, module or package scope) runs in its file's group, so that fixture is built
    once, in one worker; the tests with a :data:`SERIAL_GROUPS` marker share one; a file's own ``xdist_group`` mark
    names its group. Every other test is a unit of work of its own, so that the workers end together (with each
    file one unit, the last files ran alone on one core)."""
    for item in items:
        if _exercises_cuda(item):
            item.add_marker(pytest.mark.cuda)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = next((name for marker, name in SERIAL_GROUPS.items() if item.get_closest_marker(marker)), None)
        if group is None and shares_fixtures(item):
            group = item.nodeid.split("::")[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Path:
    """A venv (seeing this machine's torch and other dependencies) with only the wheel's repro in it, outside the
    checkout: built once per test session, for every test that runs the installed wheel."""
    import subprocess
    import sys
    import venv

    from repro.checkout import REPO_ROOT

    tmp = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO_ROOT), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp / "dist"), "-q"], capture_output=True, text=True, timeout=300)
    if built.returncode != 0 and "bdist_wheel" in built.stderr:
        pytest.skip("this Python cannot build wheels without network (setuptools lacks bdist_wheel)")
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp / "dist").glob("repro_llm_systems-*.whl"))
    # without pip of its own: ensurepip cost ~7 CPU-s; the venv's python runs this interpreter's pip (seen through
    # the system site-packages, or the .pth below), which installs into the venv (its sys.prefix)
    venv.create(tmp / "venv", system_site_packages=True, with_pip=False)
    python = tmp / "venv" / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # the tests run inside a venv (the torch-floor job, many users): system_site_packages would show the base
        # interpreter's packages, not this venv's (its torch, pandas); a .pth puts this venv's folders on the path,
        # plain folders whose own .pth files do not run (so an editable install of a checkout stays out)
        import site

        site_dir = next((tmp / "venv" / "lib").glob("python*/site-packages"))
        (site_dir / "outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --ignore-installed: the venv sees this machine's packages (torch is never installed twice), among them maybe
    # an editable install of a checkout, which pip would take for this wheel, already installed
    install = [str(python), "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "No module named pip" in done.stderr:  # no pip to see: the venv gets its own
        subprocess.run([str(python), "-m", "ensurepip", "-q"], capture_output=True, timeout=300, check=True)
        done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "venv"


@pytest.fixture(scope="session")
def readme_gpu_smoke(tmp_path_factory) -> tuple[list[str], object, Path]:
    """README.md's GPU commands, and the first of them (every smoke point of ``megatron_weak_scaling_gpu`` on CPU
    ranks) run once per test session into a results directory of its own: (the commands, its finished process,
    that directory). tests/experiments/test_readme_gpu_commands.py checks the command; the smoke-point test of
    tests/gpu_path/test_gpu_path_experiment.py checks each point's rows from it, the same run (~15 CPU-s of a
    compiled toy GPT each time it ran again). Both files are in one pytest-xdist group, so one worker runs it."""
    import shlex
    import subprocess

    from repro.checkout import REPO_ROOT
    from tests.readme_blocks import commands as readme_commands

    commands = readme_commands(section="## GPU experiments")
    argv = shlex.split(commands[0])
    assert argv[:3] == ["python3", "-m", "repro"], commands[0]
    results = tmp_path_factory.mktemp("readme_gpu_smoke")
    proc = subprocess.run([sys.executable, "-m", "repro", "--results-dir", str(results), *argv[3:]], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    return commands, proc, results


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``REPRO_TEST_CPU_LOG=FILE``, append one JSON line per test: its wall time and the CPU seconds of this
    process and of the child processes it waited for (ranks, commands; not Slurm jobs, which slurmd runs), the
    pytest-xdist worker that ran it and when it ended (a timeline of the run). CI time on 2 cores is CPU-bound, so
    this, not ``--durations``, says where it goes."""
    import os

    log = os.environ.get("REPRO_TEST_CPU_LOG")
    if not log:
        return (yield)
    import json
    import resource
    import time

    def cpu(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    start = (time.monotonic(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN))
    try:
        return (yield)
    finally:
        wall, own, children = (time.monotonic() - start[0], cpu(resource.RUSAGE_SELF) - start[1],
                               cpu(resource.RUSAGE_CHILDREN) - start[2])
        with open(log, "a") as out:
            out.write(json.dumps({"test": item.nodeid, "wall_s": round(wall, 2), "cpu_s": round(own, 2),
                                  "children_cpu_s": round(children, 2),
                                  "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                                  "end": round(time.time(), 2)}) + "\n")
