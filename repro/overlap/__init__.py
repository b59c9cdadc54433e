"""T3-style fine-grained overlap of tensor-parallel GEMMs with their collectives (Pati et al., ASPLOS'24).

Each overlapped layer is a separate class beside the plain Megatron layer it mirrors (same parameters, same
result, same bytes on the wire); :func:`overlap_sublayers` swaps a model's OP, FC-2, IP and FC-1 to them.

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (the experiments' declarations, which `repro list` and the Slurm planning step import) does not import torch
through this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.lazy import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
