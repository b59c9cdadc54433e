"""The README's test command (``pytest -n auto --dist loadgroup``) keeps a file's tests that share a fixture, and the
local-Slurm tests, in one worker (tests/conftest.py), runs every other test as a unit of its own, and stops with one
line where the installed pytest makes pytest-xdist drop the groups (pytest 9.2: pytest-xdist issue 1386)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import conftest


def _node(dist: str):
    return SimpleNamespace(config=SimpleNamespace(getvalue=lambda name: dist if name == "dist" else None))


def test_grouped_ids_pass_and_ungrouped_ones_stop_the_run():
    grouped = ["tests/a/test_x.py::test_one@tests/a/test_x.py", "tests/a/test_x.py::test_two[p@q]@local-slurm"]
    assert conftest.pytest_xdist_node_collection_finished(_node("loadgroup"), grouped) is None
    with pytest.raises(pytest.exit.Exception, match=r"does not group the tests .* install \"pytest>=8,<9\.2\"") as got:
        conftest.pytest_xdist_node_collection_finished(_node("loadgroup"), ["tests/a/test_x.py::test_two[p@q]"])
    assert got.value.returncode == 4
    # other distributions, and a worker that collected nothing, are not checked
    assert conftest.pytest_xdist_node_collection_finished(_node("load"), ["tests/a/test_x.py::test_one"]) is None
    assert conftest.pytest_xdist_node_collection_finished(_node("loadgroup"), []) is None


def _under_loadgroup(config) -> bool:
    return hasattr(config, "workerinput") and bool(config.getvalue("loadgroup"))


@pytest.fixture(scope="module")
def built_once():
    return object()


def test_a_test_with_a_module_fixture_runs_in_its_files_group(request, built_once):
    """Under the README's command this test's id carries its file's group (the mark pytest-xdist reads)."""
    if not _under_loadgroup(request.config):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/foundation/test_xdist_groups.py"), request.node.nodeid


def test_a_test_without_one_is_a_unit_of_its_own(request):
    assert not conftest._shares_fixtures(request.node)
    if _under_loadgroup(request.config):
        assert "@" not in request.node.nodeid, request.node.nodeid
