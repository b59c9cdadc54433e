"""Fixtures every test folder may use: the verified data directory (skip, not fail, where it is absent).

A test whose code reaches an optional package that is not installed (:class:`repro.optional.MissingPackage`, in
the test or in a fixture) skips with that package's one-line message instead of failing; tests that need one in a
subprocess say so with :func:`repro.testing.needs`.
"""

from __future__ import annotations

import pytest

from repro.text.data_files import DataError, resolve_data_dir
from repro.optional import MissingPackage


@pytest.fixture(scope="session")
def data_dir():
    try:
        return resolve_data_dir()
    except DataError as err:  # the evaluation data is not part of the repository
        pytest.skip(f"evaluation data not available: {err}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    except MissingPackage as err:
        pytest.skip(str(err))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except MissingPackage as err:
        pytest.skip(str(err))


def _exercises_cuda(item) -> bool:
    """A test that runs on a GPU: parametrized with the device "cuda", or skipped where there is no CUDA GPU."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    if any(isinstance(value, str) and value == "cuda" for value in params):
        return True
    return any("CUDA" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    """Mark every test that exercises a GPU ``cuda``, so that ``pytest -m cuda`` (the 9-minute GPU command's tests
    part, ``python -m repro.gpu_session``) runs exactly those."""
    for item in items:
        if _exercises_cuda(item):
            item.add_marker(pytest.mark.cuda)
