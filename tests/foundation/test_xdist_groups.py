"""The README's test command (``pytest -n auto --dist loadgroup``) keeps a file's tests that share a fixture, and the
local-Slurm tests, in one worker (tests/conftest.py), and runs every other test as a unit of its own. Under pytest
9.2 pytest-xdist's loadgroup drops every group (pytest-xdist issue 1386; pyproject's dev extra keeps pytest below
9.2): the first test here then fails, saying so."""

from __future__ import annotations

import pytest

from tests import conftest


def _under_loadgroup(config) -> bool:
    return hasattr(config, "workerinput") and bool(config.getvalue("loadgroup"))


@pytest.fixture(scope="module")
def built_once():
    return object()


def test_a_test_with_a_module_fixture_runs_in_its_files_group(request, built_once):
    """Under the README's command this test's id carries its file's group (the mark pytest-xdist reads)."""
    assert conftest.shares_fixtures(request.node)
    if not _under_loadgroup(request.config):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    import xdist

    assert request.node.nodeid.endswith("@tests/foundation/test_xdist_groups.py"), (
        f"{request.node.nodeid}: --dist loadgroup does not group the tests with pytest {pytest.__version__} and "
        f"pytest-xdist {xdist.__version__} (pytest-xdist issue 1386): install \"pytest>=8,<9.2\" (pip install -e "
        "'.[dev]' does)")


def test_a_test_without_one_is_a_unit_of_its_own(request):
    assert not conftest.shares_fixtures(request.node)
    if _under_loadgroup(request.config):
        assert "@" not in request.node.nodeid, request.node.nodeid
