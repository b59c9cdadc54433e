"""Bytes moved and time taken by ring collectives (alpha-beta model).

For a message of ``n`` bytes on ``p`` ranks arranged in a ring, each rank sends (and receives):

* all-reduce: ``2 (p - 1) / p * n`` bytes in ``2 (p - 1)`` steps (reduce-scatter then all-gather);
* reduce-scatter or all-gather: ``(p - 1) / p * n`` bytes in ``p - 1`` steps (``n`` is the full, unsharded size).

These are the volumes ZeRO sec 7.1 uses ("a standard all-reduce ... 2 Psi data movement") and the NCCL
"bus bandwidth" convention; time is ``steps * latency + bytes_sent / bandwidth``.
"""

from __future__ import annotations

from .hardware import Link


def _check(num_ranks: int, message_bytes: float) -> None:
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")


def allreduce_bytes_per_rank(num_ranks: int, message_bytes: float) -> float:
    """Bytes each rank sends in a ring all-reduce: ``2 (p-1)/p * n``."""
    _check(num_ranks, message_bytes)
    return 2.0 * (num_ranks - 1) / num_ranks * message_bytes


def reduce_scatter_bytes_per_rank(num_ranks: int, message_bytes: float) -> float:
    """Bytes each rank sends in a ring reduce-scatter of an ``n``-byte buffer: ``(p-1)/p * n``."""
    _check(num_ranks, message_bytes)
    return (num_ranks - 1) / num_ranks * message_bytes


def allgather_bytes_per_rank(num_ranks: int, message_bytes: float) -> float:
    """Bytes each rank sends in a ring all-gather producing an ``n``-byte buffer: ``(p-1)/p * n``."""
    return reduce_scatter_bytes_per_rank(num_ranks, message_bytes)


def ring_time(*, bytes_per_rank: float, steps: int, link: Link, link_efficiency: float = 1.0) -> float:
    """Alpha-beta time of a ring collective: ``steps * latency + bytes_per_rank / (efficiency * bandwidth)``."""
    if not 0 < link_efficiency <= 1:
        raise ValueError(f"link_efficiency must be in (0, 1], got {link_efficiency}")
    if steps == 0:
        return 0.0
    return steps * link.latency + bytes_per_rank / (link_efficiency * link.bandwidth)


def allreduce_time(*, num_ranks: int, message_bytes: float, link: Link, link_efficiency: float = 1.0) -> float:
    """Time of a ring all-reduce of ``message_bytes`` on ``num_ranks`` ranks over ``link``."""
    return ring_time(bytes_per_rank=allreduce_bytes_per_rank(num_ranks, message_bytes),
                     steps=2 * (num_ranks - 1), link=link, link_efficiency=link_efficiency)
