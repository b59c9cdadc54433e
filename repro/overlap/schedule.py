"""The chunked GEMM -> collective pipeline as a two-resource schedule (the "overlap schedule toy" of T3 sec. 3).

A sublayer is a GEMM of ``G`` seconds feeding a collective of ``C`` seconds. Sequentially it takes ``G + C``.
T3's ideal (its "Ideal-GEMM-RS-Overlap") hides the shorter one completely: ``max(G, C)``. Cutting the GEMM into
``n`` stages gets close to that when compute and link are independent resources: stage ``i``'s collective starts
when both the stage is computed and the link has finished stage ``i-1``:

    compute_end_i = compute_end_{i-1} + g_i
    link_end_i    = max(link_end_{i-1}, compute_end_i) + c_i
    T             = max(link_end_n, compute_end_n + trailing)

``trailing`` is compute that needs no communication and can hide the last collectives (the weight-gradient GEMM
of the backward FC-1 / IP sublayers). With equal stages and independent resources,
``T = max(G + C/n, G/n + C)``. When compute and communication share one resource (CPU cores here; the CUs and
memory bandwidth of a GPU in T3 sec. 2.3) the saving shrinks towards zero; the measured time sits between.
"""

from __future__ import annotations

from typing import Sequence


def pipelined_time(gemm_chunks: Sequence[float], comm_chunks: Sequence[float], trailing: float = 0.0) -> float:
    """Finish time of the chunked schedule on independent compute and link resources (seconds)."""
    if len(gemm_chunks) != len(comm_chunks) or not gemm_chunks:
        raise ValueError(
            f"need one collective per GEMM chunk and at least one chunk; got {len(gemm_chunks)} GEMM chunks and "
            f"{len(comm_chunks)} collectives"
        )
    if min(*gemm_chunks, *comm_chunks, trailing) < 0:
        raise ValueError("chunk times and trailing compute must be >= 0")
    compute_end = link_end = 0.0
    for gemm, comm in zip(gemm_chunks, comm_chunks):
        compute_end += gemm
        link_end = max(link_end, compute_end) + comm
    return max(link_end, compute_end + trailing)


def equal_chunks_time(gemm: float, comm: float, num_chunks: int, trailing: float = 0.0) -> float:
    """:func:`pipelined_time` with the GEMM and the collective cut into ``num_chunks`` equal pieces."""
    if num_chunks < 1:
        raise ValueError(f"num_chunks={num_chunks} must be >= 1")
    return pipelined_time([gemm / num_chunks] * num_chunks, [comm / num_chunks] * num_chunks, trailing)


def ideal_overlap_time(gemm: float, comm: float) -> float:
    """T3's Ideal-GEMM-RS-Overlap: the shorter of GEMM and collective is completely hidden."""
    return max(gemm, comm)


def speedup_percent(baseline: float, improved: float) -> float:
    """``(baseline / improved - 1) x 100``: how T3 states sublayer speedups (e.g. "30% faster")."""
    if improved <= 0:
        raise ValueError(f"improved time {improved} must be > 0")
    return (baseline / improved - 1.0) * 100.0


def share_of_ideal_saving(sequential: float, overlapped: float, ideal: float) -> float:
    """Which fraction of the saving the ideal overlap would give was realised (1 = ideal, 0 = none, < 0 slower)."""
    possible = sequential - ideal
    if possible <= 0:
        raise ValueError(f"no saving is possible: sequential {sequential} <= ideal {ideal}")
    return (sequential - overlapped) / possible
