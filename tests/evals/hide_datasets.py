"""A machine without ``datasets`` (the GPU image has none), stood in for by an import hook: ``datasets`` uninstalled,
and a bare folder of that name on the path, found as a namespace package with no code, which must not count as the
package (:func:`repro.optional.available`). Used two ways (tests/evals/conftest.py, test_evals_without_datasets.py):

* the folder's tests that are not marked ``datasets_free`` run again in a subprocess with the hook installed by a
  ``sitecustomize`` (:func:`sitecustomize_source`): they must pass or skip there;
* the tests marked ``datasets_free`` run in the ordinary run with the hook installed, in the test's process and, by
  the same ``sitecustomize`` on ``PYTHONPATH``, in every Python process it starts; the hook also notes each reach of
  ``datasets`` or ``lm_eval`` (which imports it) in a log, and such a test fails where it reached one. So a test
  marked wrongly is reported, not silently run with the package, and a new unmarked test is rerun without it.

A probe by another package (transformers and accelerate ask ``importlib.util.find_spec("datasets")`` when they load)
is answered as on that machine but not counted; a probe by this repository's code, or any real import, is.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

#: where the bare folder named ``datasets`` lies (environment, for the subprocesses)
BARE_PARENT = "REPRO_TEST_BARE_DATASETS_PARENT"
#: a file each process appends the reaches it saw to, one line each (unset: nothing is noted)
REACH_LOG = "REPRO_TEST_DATASETS_REACHES"
#: the packages whose reach is noted: ``datasets`` and lm-eval, which cannot load without it
WATCHED = ("datasets", "lm_eval")
#: the code whose probes count: this repository's (repro/, evals/, tests/) and code given to ``python -c``
PROJECT = tuple(str(Path(__file__).resolve().parents[2] / top) + os.sep for top in ("repro", "evals", "tests"))


def _from_project(filename: str) -> bool:
    return filename.startswith(PROJECT) or filename == "<string>"


class HideDatasets:
    """A ``sys.meta_path`` finder: ``datasets`` is a bare namespace folder, ``datasets.*`` does not exist."""

    def __init__(self, bare_parent: str, log: str | None) -> None:
        self.bare_parent = bare_parent
        self.log = log

    def _note(self, name: str) -> None:
        """Note a reach of ``name`` unless it is another package's ``importlib.util.find_spec`` probe."""
        if self.log is None:
            return
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            frame = frame.f_back  # the import machinery
        caller = frame.f_code.co_filename if frame is not None else "?"
        if caller in ("<frozen importlib.util>", os.path.join(os.path.dirname(os.__file__), "importlib", "util.py")):
            # importlib.util.find_spec(): a probe; whose?
            asker = frame.f_back.f_code.co_filename if frame is not None and frame.f_back is not None else "?"
            if not _from_project(asker):
                return
            caller = asker
        with open(self.log, "a") as out:
            out.write(f"{name} (pid {os.getpid()}, from {caller})\n")

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in WATCHED:
            return None
        self._note(name)
        if name == "datasets":
            return importlib.machinery.PathFinder.find_spec(name, [self.bare_parent])
        if top == "datasets":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None  # lm_eval: the real one, which fails to import datasets


def install(bare_parent: str, log: str | None) -> HideDatasets:
    """Put the hook first on ``sys.meta_path`` (and the bare folder in place) and return it."""
    (Path(bare_parent) / "datasets").mkdir(parents=True, exist_ok=True)
    hook = HideDatasets(bare_parent, log)
    sys.meta_path.insert(0, hook)
    return hook


def sitecustomize_source() -> str:
    """This module's code and a call installing the hook from the environment: a ``sitecustomize.py``."""
    return (Path(__file__).read_text() + f"\n\nPROJECT = {PROJECT!r}  # this checkout's, not the copy's folder\n"
            "install(os.environ[BARE_PARENT], os.environ.get(REACH_LOG))\n")
