"""T3-style fine-grained overlap of tensor-parallel GEMMs with their collectives (Pati et al., ASPLOS'24).

Each overlapped layer is a separate class beside the plain Megatron layer it mirrors (same parameters, same
result, same bytes on the wire); :func:`overlap_sublayers` swaps a model's OP, FC-2, IP and FC-1 to them.
"""

from repro.overlap.chunking import row_chunks, sequence_chunk_shape
from repro.overlap.column_parallel import OverlappedColumnParallelLinear
from repro.overlap.row_parallel import OverlappedRowParallelLinear
from repro.overlap.sequence_parallel import SequenceParallelColumnLinear, SequenceParallelRowLinear
from repro.overlap.swap import T3_SUBLAYERS, overlap_sublayers, overlapped_twin

__all__ = [
    "OverlappedColumnParallelLinear", "OverlappedRowParallelLinear", "SequenceParallelColumnLinear",
    "SequenceParallelRowLinear", "T3_SUBLAYERS", "overlap_sublayers",
    "overlapped_twin", "row_chunks", "sequence_chunk_shape",
]
