"""GNA tests run single-threaded: their tensors are tiny, and on a shared, oversubscribed CPU every OpenMP parallel
region of a tiny op can wait a whole time slice for its second thread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # gna_cases


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
