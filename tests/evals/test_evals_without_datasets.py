"""tests/evals pass or skip, never fail, where ``datasets`` cannot be imported (the GPU image has none).

A machine without it is stood in for by an import hook (tests/evals/hide_datasets.py): ``datasets`` uninstalled and a
bare folder of that name on the path, whose empty namespace package must not count as the package
(:func:`repro.optional.available`). The folder's files marked ``datasets_free`` already ran so, in the ordinary run
(tests/evals/conftest.py), failing where they reached datasets or lm_eval; every other test of the folder runs again
here, in a subprocess whose ``sitecustomize`` installs the hook: a new file is rerun unless it is marked, and a
marked file that reaches the package fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hide_datasets import BARE_PARENT, REACH_LOG, install, sitecustomize_source
from repro.optional import MissingPackage, available, require
from repro.results import REPO_ROOT

HERE = Path(__file__).parent
#: what pyproject's addopts (dropped by ``-o addopts=``) also says: hypothesis' and anyio's plugins unloaded, ~2 CPU-s
#: of each inner pytest's start
NO_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio")


def _hidden_env(tmp_path: Path, log: Path | None = None) -> dict[str, str]:
    """The environment of a Python process on a machine without datasets (the reaches noted in ``log``)."""
    (tmp_path / "sitecustomize.py").write_text(sitecustomize_source())
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", BARE_PARENT: str(tmp_path / "bare")}
    env.pop(REACH_LOG, None)
    return env if log is None else {**env, REACH_LOG: str(log)}


def test_tests_evals_pass_or_skip_without_datasets(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *NO_PLUGINS, "-rs",
         "tests/evals", "-m", "not datasets_free", f"--ignore={Path(__file__).relative_to(REPO_ROOT)}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=_hidden_env(tmp_path))
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0 and " failed" not in tail and " error" not in tail, tail
    assert "skipped" in tail and "datasets" in proc.stdout  # it did run without them: the reading tests skipped
    assert " deselected" in tail  # the datasets_free files, which ran without datasets in the ordinary run


def test_the_hook_notes_what_reaches_datasets_and_not_another_packages_probe(tmp_path):
    """What a ``datasets_free`` file is held to: a probe or import by this repository's code, or any import, is
    noted (in this process and in one it starts) and behaves as on a machine without datasets; transformers'
    probe when it loads is answered the same way but not noted."""
    log = tmp_path / "reaches.log"
    log.touch()
    hook = install(str(tmp_path / "bare"), str(log))
    set_aside = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "datasets"}
    try:
        probe = compile("import importlib.util; found = importlib.util.find_spec('datasets')",
                        "/site-packages/transformers/utils/import_utils.py", "exec")
        scope: dict = {}
        exec(probe, scope)  # another package's probe: the bare folder, not noted
        assert scope["found"].origin in (None, "namespace") and log.read_text() == ""
        assert not available("datasets")  # this repository's probe: noted
        with pytest.raises(MissingPackage, match="needs the package 'datasets', which is not installed"):
            require("datasets", "testing")
    finally:
        sys.meta_path.remove(hook)
        for name in [name for name in sys.modules if name.split(".")[0] == "datasets"]:
            del sys.modules[name]
        sys.modules.update(set_aside)
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["datasets", "datasets"]
    log.write_text("")
    reach = "try:\n    import lm_eval\nexcept ImportError:\n    pass  # not installed\nimport datasets, datasets.load"
    done = subprocess.run([sys.executable, "-c", reach],
                          capture_output=True, text=True, timeout=120, env=_hidden_env(tmp_path, log))
    assert done.returncode == 1 and "No module named 'datasets.load'" in done.stderr, done.stderr
    assert {line.split()[0] for line in log.read_text().splitlines()} >= {"lm_eval", "datasets", "datasets.load"}


def test_a_file_marked_datasets_free_that_reaches_it_fails(tmp_path):
    """The mark cannot hide a test that reads through datasets: where it reaches the package it fails (not only
    skips, which would pass the run), and a test of the file that does not reach it passes."""
    shutil.copy(HERE.parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "evals").mkdir()
    for name in ("conftest.py", "hide_datasets.py", "evals_test_models.py"):
        shutil.copy(HERE / name, tmp_path / "evals" / name)
    (tmp_path / "evals" / "test_marked.py").write_text(
        "import pytest\nfrom repro.optional import require\n\npytestmark = pytest.mark.datasets_free\n\n\n"
        "def test_reads():\n    require('datasets', 'reading')\n\n\n"
        "def test_does_not_read():\n    assert 1 + 1 == 2\n")
    env = {k: v for k, v in os.environ.items() if k not in (REACH_LOG, BARE_PARENT)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           *NO_PLUGINS, "--rootdir", str(tmp_path), "evals"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1 and "1 passed" in summary and "1 error" in summary, done.stdout[-3000:]
    assert "evals/test_marked.py::test_reads is marked datasets_free but reached datasets" in done.stdout, \
        done.stdout[-3000:]


def test_a_bare_folder_of_that_name_is_not_the_package(tmp_path, monkeypatch):
    (tmp_path / "not_a_real_package").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not available("not_a_real_package")
    assert available("torch")


def test_requiring_a_bare_folder_names_it_in_one_line(tmp_path, monkeypatch):
    from repro.optional import MissingPackage, require

    (tmp_path / "not_a_real_package").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingPackage, match=r"testing needs the package 'not_a_real_package', which is not installed "
                                             r"\(the folder .*not_a_real_package has its name but no code\)"):
        require("not_a_real_package", "testing")


BROKEN = "raise RuntimeError('pyarrow was built against another numpy')\n"


def test_a_broken_datasets_fails_the_tests_in_one_line_an_absent_one_skips(tmp_path):
    """``datasets`` installed but raising on import is a broken environment: a test that reads data through it fails,
    naming the error in one line (not a skip, which would pass the run; not a traceback); the same test skips where
    ``datasets`` is absent (the folder's test above)."""
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "__init__.py").write_text(BROKEN)
    test = "tests/evals/test_evals_cli.py::test_lambada_rows_written_with_provenance"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           *NO_PLUGINS, test],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}"})
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert ("needs the package 'datasets', which is installed but cannot be imported (RuntimeError: pyarrow was "
            "built against another numpy); repair the install" in proc.stdout), proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
