"""Fixtures of the spine's tests: the fake experiments registered through REPRO_EXTRA_EXPERIMENTS, a throw-away
results folder, and the claims report of the committed rows (built once per test session, read by several files)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from repro import claims as C
from repro.experiments import registry
from repro.results import REPO_ROOT

FAKE = Path(__file__).with_name("fake_experiments.py")


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Register the fake experiments and send results to a temporary folder; returns that folder."""
    results = tmp_path / "results"
    monkeypatch.setenv("REPRO_EXTRA_EXPERIMENTS", str(FAKE))
    monkeypatch.setenv("REPRO_RESULTS_DIR", str(results))
    registry(refresh=True)
    return results


@pytest.fixture
def fake_registry(fake_env: Path):
    return registry()


@pytest.fixture(scope="session")
def committed_ci_checks() -> C.CheckSet:
    """Every experiment's claim checks on the committed rows, as ``repro claims`` collects them after ``repro
    reproduce --scale ci`` (the ci rows, smoke where an experiment has none). Collected once per test session (per
    xdist worker): test_evidence.py, test_evidence_layout.py and test_claims_scope.py each read it, and each
    collection of every experiment's claims takes seconds. Read it, never change it."""
    from repro.harness.reproduce import _check_scale, _rows

    return C.collect_checks(registry(), _rows(REPO_ROOT / "results", "ci"), scale=_check_scale("ci"))


@pytest.fixture(scope="session")
def _committed_ci_report(committed_ci_checks: C.CheckSet) -> pd.DataFrame:
    return C.build_report(committed_ci_checks)


@pytest.fixture
def committed_ci_report(_committed_ci_report: pd.DataFrame) -> pd.DataFrame:
    """The claims report built from :func:`committed_ci_checks` (a copy per test: a test may change it)."""
    return _committed_ci_report.copy()
