"""Fixtures of the spine's tests: the fake experiments registered through REPRO_EXTRA_EXPERIMENTS and a
throw-away results folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.experiments import registry

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
