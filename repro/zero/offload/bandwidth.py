"""NVMe bandwidth: the tier's own against the raw drive's, measured in the same run (ZeRO-Infinity sec. 6.3 aims
at near-peak drive bandwidth for the offload engine).

``raw_disk_bandwidth`` is the reference a storage engineer would take: one large sequential file, written then
read with ``O_DIRECT`` in 8 MiB requests from one thread (no page cache, no Python in the loop beyond the call).
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


def raw_disk_bandwidth(path: str, nbytes: int = 256 << 20, block_bytes: int = 8 << 20) -> dict[str, float]:
    """Sequential O_DIRECT write and read of ``nbytes`` under ``path``: {"write_gbs", "read_gbs", "direct"}."""
    check_nvme_path(path)
    nbytes = round_up(nbytes, block_bytes)
    buffer = AlignedBuffer(block_bytes)
    buffer.bytes.copy_(torch.randint(0, 255, (block_bytes,), dtype=torch.uint8))
    fd, name = tempfile.mkstemp(prefix=".repro-raw-", dir=path)
    os.close(fd)
    direct = hasattr(os, "O_DIRECT")
    try:
        try:
            fd = os.open(name, os.O_RDWR | (os.O_DIRECT if direct else 0))
        except OSError:
            direct, fd = False, os.open(name, os.O_RDWR)
        view = buffer.memoryview(0, block_bytes)
        start = time.perf_counter()
        for offset in range(0, nbytes, block_bytes):
            os.pwritev(fd, [view], offset)
        os.fsync(fd)
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        for offset in range(0, nbytes, block_bytes):
            os.preadv(fd, [view], offset)
        read_s = time.perf_counter() - start
        os.close(fd)
    finally:
        os.remove(name)
    return {"write_gbs": nbytes / write_s / 1e9, "read_gbs": nbytes / read_s / 1e9, "direct": direct,
            "bytes": nbytes}


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
