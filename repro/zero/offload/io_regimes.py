"""Split a drive's busy time into reads alone, writes alone, and both at once, and credit bytes to each.

ZeRO-Infinity (sec. 6.3) judges its offload engine by the bandwidth it achieves against the drive's peak. A drive
that serves reads and writes at the same time does not give each direction its one-direction peak: on this
machine's virtual disk, O_DIRECT writes reach ~2.6 GB/s alone but ~0.8-1.6 GB/s while four readers run (reads
keep ~1.0 GB/s), so "bytes written / time any write was in flight" mixes two regimes. Here the time during which
at least one request of either direction was in flight, on any rank sharing the drive, is cut at every request's
start and end into three regimes:

* ``read``: reads in flight, no writes;
* ``write``: writes in flight, no reads;
* ``both``: reads and writes in flight together.

Each request's bytes are spread evenly over its own duration (a 1 MiB ``pread`` has no finer timing), so a
regime's bytes of a direction are the integral of that direction's rate over the regime's time. Achieved bandwidth
per regime is then compared with the raw drive measured in the same regime
(:func:`repro.zero.offload.bandwidth.raw_disk_bandwidth`: read alone, write alone, and reads and writes together).
"""

from __future__ import annotations

from typing import Iterable

Block = tuple[float, float, int]  # (start, end, nbytes) of one request
REGIMES = ("read", "write", "both")


def split_regimes(reads: Iterable[Block], writes: Iterable[Block]) -> dict[str, dict[str, float]]:
    """Seconds and bytes of each regime: ``{regime: {"seconds", "read_bytes", "write_bytes"}}``.

    A sweep over the requests' start and end points: between two consecutive points the set of requests in
    flight is fixed, so the regime and each direction's rate (sum of ``nbytes / duration`` of its requests in
    flight) are constant. A request the clock saw take no time is given one nanosecond."""
    events: list[tuple[float, int, str, float, int]] = []  # (time, order, direction, rate change, count change)
    for direction, blocks in (("read", reads), ("write", writes)):
        for start, end, nbytes in blocks:
            if end < start:
                raise ValueError(f"a {direction} request ends ({end}) before it starts ({start})")
            end = max(end, start + 1e-9)
            rate = nbytes / (end - start)
            events.append((start, 1, direction, rate, 1))
            events.append((end, 0, direction, -rate, -1))  # ends sort before starts at the same time
    events.sort()
    out = {regime: {"seconds": 0.0, "read_bytes": 0.0, "write_bytes": 0.0} for regime in REGIMES}
    rate = {"read": 0.0, "write": 0.0}
    count = {"read": 0, "write": 0}
    previous = None
    for time, _, direction, rate_change, count_change in events:
        if previous is not None and time > previous:
            regime = _regime(count)
            if regime is not None:
                span = time - previous
                out[regime]["seconds"] += span
                out[regime]["read_bytes"] += rate["read"] * span
                out[regime]["write_bytes"] += rate["write"] * span
        count[direction] += count_change
        rate[direction] = rate[direction] + rate_change if count[direction] else 0.0  # no rounding residue
        previous = time
    return out


def _regime(count: dict[str, int]) -> str | None:
    if count["read"] and count["write"]:
        return "both"
    if count["read"]:
        return "read"
    if count["write"]:
        return "write"
    return None


def regime_bandwidths(split: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """GB/s of each direction in each regime where it moved data: ``read_alone_gbs``, ``write_alone_gbs``,
    ``read_both_gbs``, ``write_both_gbs`` (None when the regime never occurred), and each regime's seconds."""
    def gbs(nbytes: float, seconds: float) -> float | None:
        return nbytes / seconds / 1e9 if seconds > 0 else None

    return {
        "read_alone_gbs": gbs(split["read"]["read_bytes"], split["read"]["seconds"]),
        "write_alone_gbs": gbs(split["write"]["write_bytes"], split["write"]["seconds"]),
        "read_both_gbs": gbs(split["both"]["read_bytes"], split["both"]["seconds"]),
        "write_both_gbs": gbs(split["both"]["write_bytes"], split["both"]["seconds"]),
        **{f"{regime}_s": split[regime]["seconds"] for regime in REGIMES},
        **{f"{regime}_{d}_bytes": split[regime][f"{d}_bytes"] for regime in REGIMES for d in ("read", "write")},
    }
