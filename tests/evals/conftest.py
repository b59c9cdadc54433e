"""Shared fixtures for the evaluation tests: tokenizers and tiny models (``data_dir`` is in tests/conftest.py), and
the ``datasets_free`` mark: a test file marked so runs without ``datasets`` (tests/evals/hide_datasets.py), and is
therefore not run again by test_evals_without_datasets.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from evals.repro_lm import ReproCausalLM
from evals_test_models import tiny_gpt
from hide_datasets import BARE_PARENT, REACH_LOG, WATCHED, install, sitecustomize_source

#: the mark, on a whole file (``pytestmark = DATASETS_FREE``)
MARK = "datasets_free"


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARK}: a tests/evals file that never reaches datasets or lm_eval: run "
                                       "without datasets (failing where it reaches one), and not again without it")


def pytest_collection_modifyitems(items):
    for item in items:  # on the file, so that its module fixtures are built without datasets too
        if any(mark.name == MARK for mark in item.own_markers):
            raise pytest.UsageError(f"{item.nodeid}: mark the whole file {MARK} (pytestmark), not one test")


@pytest.fixture(scope="module", autouse=True)
def without_datasets_where_marked(request, tmp_path_factory):
    """For a file marked ``datasets_free``: the import hook in this process (the packages' modules set aside while
    it runs) and, by a ``sitecustomize`` first on ``PYTHONPATH``, in every Python process its tests start."""
    if request.node.get_closest_marker(MARK) is None:
        yield None
        return
    folder = tmp_path_factory.mktemp("no_datasets")
    (folder / "sitecustomize.py").write_text(sitecustomize_source())
    log = folder / "reaches.log"
    log.touch()
    set_aside = {name: sys.modules.pop(name) for name in list(sys.modules) if name.partition(".")[0] in WATCHED}
    hook = install(str(folder / "bare"), str(log))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
        patch.setenv(BARE_PARENT, str(folder / "bare"))
        patch.setenv(REACH_LOG, str(log))
        try:
            yield log
        finally:
            sys.meta_path.remove(hook)
            for name in [name for name in sys.modules if name.partition(".")[0] in WATCHED]:
                del sys.modules[name]  # the bare folder's stand-in, or a half-imported lm_eval
            sys.modules.update(set_aside)
    _fail_on_reaches(log, f"{request.node.nodeid} (its module fixtures)")


def _fail_on_reaches(log, where: str) -> None:
    reached = log.read_text()
    log.write_text("")
    if reached:
        pytest.fail(f"{where} is marked {MARK} but reached {', '.join(WATCHED)}:\n{reached}", pytrace=False)


@pytest.fixture(autouse=True)
def datasets_not_reached(without_datasets_where_marked, request):
    """A test of a ``datasets_free`` file fails where it (or a process it started) reached datasets or lm_eval."""
    yield
    if without_datasets_where_marked is not None:
        _fail_on_reaches(without_datasets_where_marked, request.node.nodeid)


@pytest.fixture(scope="session")
def gpt2_tok(data_dir):
    from repro.text.tokenization import gpt2_tokenizer

    return gpt2_tokenizer(data_dir)


@pytest.fixture(scope="session")
def bert_tok(data_dir):
    from repro.text.tokenization import bert_tokenizer

    return bert_tokenizer(data_dir)


@pytest.fixture(scope="session")
def tiny_lm():
    return ReproCausalLM(tiny_gpt())


@pytest.fixture(autouse=True)
def one_thread():
    """These tests use tiny models; one intra-op thread avoids oversubscription on a shared 2-core machine
    (6x faster here under load). The previous setting is restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
