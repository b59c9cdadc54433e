"""T3-style fine-grained overlap of tensor-parallel GEMMs with their collectives (Pati et al., ASPLOS'24).

Each overlapped layer is a separate class beside the plain Megatron layer it mirrors (same parameters, same
result, same bytes on the wire); :func:`overlap_sublayers` swaps a model's OP, FC-2, IP and FC-1 to them.

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (the experiments' declarations, which `repro list` and the Slurm planning step import) does not import torch
through this file."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> the module that defines it, imported at the name's first use
_HOMES = {
    **dict.fromkeys(("row_chunks", "sequence_chunk_shape"), "repro.overlap.chunking"),
    **dict.fromkeys(("OverlappedColumnParallelLinear",), "repro.overlap.column_parallel"),
    **dict.fromkeys(("OverlappedRowParallelLinear",), "repro.overlap.row_parallel"),
    **dict.fromkeys(("SequenceParallelColumnLinear", "SequenceParallelRowLinear"), "repro.overlap.sequence_parallel"),
    **dict.fromkeys(("T3_SUBLAYERS", "overlap_sublayers", "overlapped_twin"), "repro.overlap.swap"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from repro.overlap.chunking import row_chunks, sequence_chunk_shape
    from repro.overlap.column_parallel import OverlappedColumnParallelLinear
    from repro.overlap.row_parallel import OverlappedRowParallelLinear
    from repro.overlap.sequence_parallel import SequenceParallelColumnLinear, SequenceParallelRowLinear
    from repro.overlap.swap import T3_SUBLAYERS, overlap_sublayers, overlapped_twin


def __getattr__(name: str) -> Any:
    if name not in _HOMES:  # a submodule (``from repro.overlap import swap``) is left to the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
