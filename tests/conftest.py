"""Fixtures every test folder may use: the verified data directory (skip, not fail, where it is absent)."""

from __future__ import annotations

import pytest

from evals.data_files import DataError, resolve_data_dir


@pytest.fixture(scope="session")
def data_dir():
    try:
        return resolve_data_dir()
    except DataError as err:  # the evaluation data is not part of the repository
        pytest.skip(f"evaluation data not available: {err}")
