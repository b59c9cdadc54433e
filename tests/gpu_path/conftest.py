"""Fixtures of the GPU-path tests: every test that takes ``device`` runs on the CPU, and also on CUDA when this
machine has a GPU, so the same tests check the GPU path on a GPU machine and its CPU fallback everywhere."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """``"cpu"``, or ``"cuda"`` (the current GPU, ``cuda:0`` unless set otherwise)."""
    return request.param
