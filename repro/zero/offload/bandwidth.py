"""NVMe bandwidth: the tier's own against the raw drive's, measured in the same run (ZeRO-Infinity sec. 6.3 aims
at near-peak drive bandwidth for the offload engine).

``raw_disk_bandwidth`` is the drive's reference with the tier's I/O shape and nothing else: one sequential file
under the same directory, opened with ``O_DIRECT`` (no page cache), written once untimed (a warm-up pass, so that
the timed pass *overwrites* allocated, already-written blocks, as the tier's timed pass overwrites its
preallocated swap files), then overwritten and read back, each timed, by ``io_threads`` threads (4, the tier's
default) issuing ``block_bytes`` requests (1 MiB, the tier's default), every thread keeping one request in flight
over its share of the blocks, and no ``fsync`` in the timed write (the tier's timed pass has none either; with
``O_DIRECT`` a completed ``pwrite`` has left the host). Until 2026-11-24 it wrote a *new* file from one thread in
8 MiB requests and timed an ``fsync``, so the tier, overwriting written files with four threads, appeared to
out-write the raw drive. A third timed pass runs both directions at once (readers of that file, writers of a
second one): the tier's optimizer reads the next shards while it writes the updated ones, and a drive shared by
both directions gives each less than its one-direction peak (:mod:`repro.zero.offload.io_regimes`).
``tier_bandwidth`` moves the same number of bytes through :class:`NvmeTier` as the optimizer does: many swap
files of ``tensor_bytes`` each, all writes issued then flushed, all reads prefetched then fetched.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch

from repro.zero.offload.aio import AlignedBuffer, round_up
from repro.zero.offload.nvme import NvmeTier, check_nvme_path


def raw_disk_bandwidth(path: str, nbytes: int = 256 << 20, block_bytes: int = 1 << 20,
                       io_threads: int = 4) -> dict[str, float]:
    """O_DIRECT overwrite then read of one ``nbytes`` file under ``path`` by ``io_threads`` threads of
    ``block_bytes`` requests, after an untimed warm-up write; then both directions at once, as the tier runs them
    (:mod:`repro.zero.offload.io_regimes`): ``io_threads`` readers of that file and ``io_threads`` writers
    overwriting a second warmed file of the same size, each direction timed from the first request to its own last.
    Returns {"write_gbs", "read_gbs", "mixed_read_gbs", "mixed_write_gbs", "direct", "bytes", "block_bytes",
    "io_threads"}."""
    from concurrent.futures import ThreadPoolExecutor

    check_nvme_path(path)
    nbytes = round_up(nbytes, block_bytes * io_threads)
    buffers = [AlignedBuffer(block_bytes) for _ in range(2 * io_threads)]
    for buffer in buffers:
        buffer.bytes.copy_(torch.randint(0, 255, (block_bytes,), dtype=torch.uint8))
    views = [buffer.memoryview(0, block_bytes) for buffer in buffers]
    offsets = range(0, nbytes, block_bytes)
    direct = hasattr(os, "O_DIRECT")
    names, fds = [], []
    try:
        for _ in range(2):
            fd, name = tempfile.mkstemp(prefix=".repro-raw-", dir=path)
            os.close(fd)
            names.append(name)
            try:
                fds.append(os.open(name, os.O_RDWR | (os.O_DIRECT if direct else 0)))
            except OSError:
                direct = False
                fds.append(os.open(name, os.O_RDWR))

        def worker(index: int, op, fd: int, view: memoryview) -> float:
            """Thread ``index`` takes every io_threads-th block, in order; returns when it finished."""
            for offset in offsets[index::io_threads]:
                op(fd, [view], offset)
            return time.perf_counter()

        with ThreadPoolExecutor(max_workers=2 * io_threads) as pool:
            def timed(*jobs) -> list[float]:
                """Run every (op, fd, first buffer) job's io_threads workers at once; each job's seconds."""
                start = time.perf_counter()
                futures = [[pool.submit(worker, i, op, fd, views[first + i]) for i in range(io_threads)]
                           for op, fd, first in jobs]
                return [max(f.result() for f in job) - start for job in futures]

            timed((os.pwritev, fds[0], 0), (os.pwritev, fds[1], io_threads))  # warm-up: allocate, write once
            for fd in fds:
                os.fsync(fd)
            write_s, = timed((os.pwritev, fds[0], 0))
            read_s, = timed((os.preadv, fds[0], 0))
            mixed_read_s, mixed_write_s = timed((os.preadv, fds[0], 0), (os.pwritev, fds[1], io_threads))
    finally:
        for fd in fds:
            os.close(fd)
        for name in names:
            os.remove(name)
    return {"write_gbs": nbytes / write_s / 1e9, "read_gbs": nbytes / read_s / 1e9,
            "mixed_read_gbs": nbytes / mixed_read_s / 1e9, "mixed_write_gbs": nbytes / mixed_write_s / 1e9,
            "direct": direct, "bytes": nbytes, "block_bytes": block_bytes, "io_threads": io_threads}


def tier_bandwidth(
    path: str, nbytes: int = 256 << 20, tensor_bytes: int = 16 << 20, io_threads: int = 4,
    io_block_bytes: int = 1 << 20, depth: int = 4,
) -> dict[str, float]:
    """Swap ``nbytes`` of fp32 tensors of ``tensor_bytes`` in and out of an :class:`NvmeTier` the way the optimizer
    loop does: reads prefetched ``depth`` tensors ahead, updated buffers written back in place. A first pass warms
    the tier's buffer pool (as the first training step does), the second is timed."""
    count = max(1, nbytes // tensor_bytes)
    numel = tensor_bytes // 4
    tier = NvmeTier(path, prefix="bandwidth", io_threads=io_threads, io_block_bytes=io_block_bytes,
                    buffer_cache_bytes=count * round_up(numel * 4) + (64 << 20))
    value = torch.randn(numel)
    try:
        for i in range(count):
            tier.create(f"t{i}", value)
        tier.flush()
        times = {}
        for _ in range(2):  # warm-up, then measured
            start = time.perf_counter()
            fetched = []
            for i in range(count):
                for ahead in range(i + 1, min(i + 1 + depth, count)):
                    tier.prefetch(f"t{ahead}")
                fetched.append(tier.fetch(f"t{i}"))
            times["read"] = time.perf_counter() - start
            start = time.perf_counter()
            for i, buffer in enumerate(fetched):
                tier.writeback(f"t{i}", buffer)
            tier.flush()
            times["write"] = time.perf_counter() - start
        moved = count * round_up(numel * 4)
        return {"write_gbs": moved / times["write"] / 1e9, "read_gbs": moved / times["read"] / 1e9,
                "direct": tier.direct, "bytes": moved}
    finally:
        tier.close()
