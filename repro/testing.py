"""Helpers for tests: relative errors, sharding of reference weights for one tensor-parallel rank, skipping
where an optional package is missing (:func:`needs`), and the paper claims tests read (:func:`paper_claims_file`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch

from repro.models.config import TransformerConfig
from repro.models.sharding import merge_state_dicts, shard_state_dict
from repro.optional import available, pip_name


def needs(*modules: str) -> Any:
    """A pytest mark skipping a test (or, as ``pytestmark``, a file) unless every module in ``modules`` can be
    found; the reason names the missing packages and the ``pip install`` that brings them (optional packages are
    described in :mod:`repro.optional`)."""
    import pytest

    missing = sorted({pip_name(m) for m in modules if not available(m)})
    reason = f"needs the optional package(s) {', '.join(missing)}: pip install {' '.join(missing)}"
    return pytest.mark.skipif(bool(missing), reason=reason)


def paper_claims_file() -> Path:
    """``$REPRO_SHARED/paper_claims.csv`` where that is set, else the copy committed in ``results/paper/``: a fresh
    clone without ``../shared`` tests against the same numbers (a test holds the copy equal to the shared table)."""
    if os.environ.get("REPRO_SHARED"):
        return Path(os.environ["REPRO_SHARED"]) / "paper_claims.csv"
    return Path(__file__).resolve().parents[1] / "results" / "paper" / "paper_claims.csv"


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (0 when both are zero)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    denom = expected.norm()
    diff = (actual - expected).norm()
    return float(diff / denom) if denom > 0 else float(diff)


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "tensor") -> None:
    err = rel_err(actual, expected)
    if not err <= tol:
        raise AssertionError(f"{what}: relative error {err:.3e} > {tol:.1e}")


def shard_prefixed(
    full: Mapping[str, torch.Tensor], prefix: str, config: TransformerConfig, tp_rank: int, tp_size: int
) -> dict[str, torch.Tensor]:
    """Shard the state dict of a sub-module whose names lack the model prefix (e.g. ``attention.``)."""
    shards = shard_state_dict({prefix + k: v for k, v in full.items()}, config, tp_rank, tp_size)
    return {k[len(prefix):]: v for k, v in shards.items()}


def merge_prefixed(
    shards: list[Mapping[str, torch.Tensor]], prefix: str, config: TransformerConfig
) -> dict[str, torch.Tensor]:
    merged = merge_state_dicts([{prefix + k: v for k, v in s.items()} for s in shards], config)
    return {k[len(prefix):]: v for k, v in merged.items()}
