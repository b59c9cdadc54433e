"""How a GEMM is cut into chunks for fine-grained overlap (T3 sec. 3: the producer GEMM is split into stages whose
outputs are handed to the collective one by one while the next stage computes).

Two cuttings are used:

* token chunks (:func:`row_chunks`): the flattened ``[tokens, features]`` activation is cut into contiguous row
  blocks. A row block of the GEMM output is a contiguous buffer, so its all-reduce can start as soon as it exists.
* sequence chunks for sequence parallelism (:func:`sequence_chunk_shape`): a reduce-scatter must hand every rank
  its *own* sequence shard, so chunk ``c`` holds piece ``c`` of every rank's shard. The sequence (length ``s``) is
  viewed as ``[tp, n, L]`` with ``L = s / (tp * n)``: rank ``r``'s shard is ``[r, :, :]``, chunk ``c`` is
  ``[:, c, :]``.

Pure functions, no processes: tested on their own.
"""

from __future__ import annotations


def check_num_chunks(num_chunks: int) -> int:
    """``num_chunks`` must be a positive integer (1 = no pipelining, the sequential schedule)."""
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks={num_chunks!r} must be a positive integer")
    return num_chunks


def row_chunks(num_rows: int, num_chunks: int) -> list[slice]:
    """Cut ``num_rows`` rows into ``min(num_chunks, num_rows)`` contiguous, nearly equal blocks (the first
    ``num_rows % k`` blocks one row longer), covering every row once, in order."""
    check_num_chunks(num_chunks)
    if num_rows < 0:
        raise ValueError(f"num_rows={num_rows} must be >= 0")
    count = max(1, min(num_chunks, num_rows))
    base, extra = divmod(num_rows, count)
    slices, start = [], 0
    for index in range(count):
        stop = start + base + (1 if index < extra else 0)
        slices.append(slice(start, stop))
        start = stop
    return slices


def sequence_chunk_shape(seq_len: int, tp_size: int, num_chunks: int) -> tuple[int, int, int]:
    """``(tp, n, L)`` such that the sequence is viewed as ``[tp, n, L]`` (sequence-parallel chunking).

    The sequence must split into ``tp * num_chunks`` equal pieces: every rank owns ``s / tp`` positions (Megatron
    sequence parallelism) and each of the ``n`` chunks takes ``L`` of them from every rank.
    """
    check_num_chunks(num_chunks)
    if tp_size < 1:
        raise ValueError(f"tp_size={tp_size} must be >= 1")
    if seq_len % (tp_size * num_chunks) != 0:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by tp_size x num_chunks = {tp_size} x {num_chunks}: "
            "sequence-parallel overlap gives every rank an equal piece of every chunk"
        )
    return tp_size, num_chunks, seq_len // (tp_size * num_chunks)
