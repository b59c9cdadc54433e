"""tests/evals pass or skip, never fail, where ``datasets`` cannot be imported (the GPU image has none).

The whole folder runs in a subprocess whose ``sitecustomize`` stands in for such a machine with a bare folder named
``datasets`` on the path: ``import datasets`` then gives an empty namespace package, which must not count as the
package (:func:`repro.optional.available`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.optional import available
from repro.results import REPO_ROOT

#: datasets uninstalled, and a bare folder of that name on the path: found as a namespace package, with no code
HIDE = '''
import importlib.machinery, os, sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "datasets":
            return importlib.machinery.PathFinder.find_spec(name, [os.environ["BARE_DATASETS_PARENT"]])
        if name.startswith("datasets."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _Hide())
'''


def test_tests_evals_pass_or_skip_without_datasets(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    (tmp_path / "bare" / "datasets").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rs", "tests/evals",
         f"--ignore={Path(__file__).relative_to(REPO_ROOT)}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "BARE_DATASETS_PARENT": str(tmp_path / "bare")})
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0 and " failed" not in tail and " error" not in tail, tail
    assert "skipped" in tail and "datasets" in proc.stdout  # it did run without them: the reading tests skipped


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
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", test],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}"})
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert ("needs the package 'datasets', which is installed but cannot be imported (RuntimeError: pyarrow was "
            "built against another numpy); repair the install" in proc.stdout), proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
