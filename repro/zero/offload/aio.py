"""Asynchronous, aligned file I/O for the NVMe tier (ZeRO-Infinity sec. 6.3, "DeepNVMe").

ZeRO-Infinity reaches near-peak NVMe bandwidth by keeping many large requests in flight and by bypassing the page
cache. Here a thread pool issues ``pread``/``pwrite`` of ``block_bytes`` blocks in parallel (both release the
GIL), on files opened with ``O_DIRECT`` where the file system supports it. ``O_DIRECT`` needs the buffer address,
the file offset and the length to be multiples of the logical block size: buffers are anonymous ``mmap`` regions
(page aligned) and every file is padded to a whole number of pages. File systems without ``O_DIRECT`` (tmpfs)
fall back to buffered I/O; :attr:`AsyncFileIO.direct` says which one is in use.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

PAGE_BYTES = 4096


class DiskFullError(OSError):
    """The NVMe directory ran out of space while reserving or writing a swap file."""


def round_up(nbytes: int, quantum: int = PAGE_BYTES) -> int:
    return -(-nbytes // quantum) * quantum


class AlignedBuffer:
    """A page-aligned host buffer (anonymous mmap) with a uint8 tensor view; freed when the last view is gone."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = round_up(max(nbytes, 1))
        # MAP_POPULATE faults the pages in now, in one go, instead of one fault per page during the first I/O.
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        self._map = mmap.mmap(-1, self.nbytes, flags=flags)
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    def view(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        return self.bytes[: numel * dtype.itemsize].view(dtype)

    def memoryview(self, start: int, stop: int) -> memoryview:
        return memoryview(self._map)[start:stop]


def _raise_clear(err: OSError, path: str, what: str) -> None:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = None
        try:
            stat = os.statvfs(os.path.dirname(path))
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            pass
        raise DiskFullError(
            err.errno, f"disk full while {what} {path!r} (free space: {free} bytes); free space under the NVMe "
            "path or point nvme_path at a larger drive"
        ) from err
    raise err


class IORequest:
    """A read or write split into block futures; ``wait()`` re-raises the first error as a clear OSError."""

    def __init__(self, futures: list[Future], path: str, what: str) -> None:
        self._futures, self.path, self.what = futures, path, what

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def wait(self) -> None:
        for future in self._futures:
            err = future.exception()
            if err is not None:
                if isinstance(err, OSError):
                    _raise_clear(err, self.path, self.what)
                raise err


class IOBusy:
    """When this process's swap-file I/O is in flight, per direction: the intervals (``time.monotonic()``, one
    clock for every process on the machine) during which at least one ``pread``/``pwrite`` block of any
    :class:`AsyncFileIO` was executing. Bytes over the union of these intervals is the bandwidth the tier achieved
    while it was moving data, as opposed to bytes over the step time, which also counts the time it waited for
    compute. One per process (:data:`IO_BUSY`); ``reset()`` between measurements.

    After ``reset(keep_blocks=True)``, ``blocks`` keeps every request, per direction, as ``(start, end, nbytes)``:
    two directions in flight at once on one drive share it, so :mod:`repro.zero.offload.io_regimes` splits the busy
    time into reads alone, writes alone and both, and credits each request's bytes to the regimes its duration
    spans. Off by default: a training run that never resets would keep ~10^5 tuples per step at 4B."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self, *, keep_blocks: bool = False) -> None:
        with self._lock:
            self.keep_blocks = keep_blocks
            self._inflight = {"read": 0, "write": 0}
            self._since = {"read": 0.0, "write": 0.0}
            self.intervals: dict[str, list[tuple[float, float]]] = {"read": [], "write": []}
            self.blocks: dict[str, list[tuple[float, float, int]]] = {"read": [], "write": []}

    def begin(self, direction: str) -> float:
        """Note a request of ``direction`` starting; returns its start time, for :meth:`end`."""
        with self._lock:
            now = time.monotonic()
            if self._inflight[direction] == 0:
                self._since[direction] = now
            self._inflight[direction] += 1
            return now

    def end(self, direction: str, started: float | None = None, nbytes: int = 0) -> None:
        with self._lock:
            now = time.monotonic()
            self._inflight[direction] -= 1
            if self._inflight[direction] == 0:
                self.intervals[direction].append((self._since[direction], now))
            if self.keep_blocks and started is not None:
                self.blocks[direction].append((started, now, nbytes))

    def busy_s(self, direction: str) -> float:
        return union_seconds(self.intervals[direction])


def union_seconds(intervals) -> float:
    """Length of the union of ``(start, end)`` intervals (e.g. several ranks' busy intervals on one drive)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


#: this process's I/O busy intervals (every AsyncFileIO reports here)
IO_BUSY = IOBusy()


class AsyncFileIO:
    """Parallel block reads and writes of aligned buffers to page-padded files."""

    def __init__(self, *, threads: int = 4, block_bytes: int = 1 << 20, direct: bool = True) -> None:
        if block_bytes % PAGE_BYTES:
            raise ValueError(f"block_bytes={block_bytes} must be a multiple of {PAGE_BYTES}")
        self.block_bytes = block_bytes
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="repro-nvme")
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                flags = os.O_RDWR | os.O_CREAT
                if self.direct:
                    try:
                        fd = os.open(path, flags | os.O_DIRECT, 0o600)
                    except OSError as err:
                        if err.errno != errno.EINVAL:
                            raise
                        self.direct = False  # e.g. tmpfs: no O_DIRECT, use the page cache
                if fd is None:
                    fd = os.open(path, flags, 0o600)
                self._fds[path] = fd
            return fd

    def create_unlinked(self, directory: str, prefix: str) -> str:
        """Create a swap file in ``directory``, open it, and unlink its name at once: the file lives as long as
        this process holds it open and vanishes when the process ends, however it ends. Returns the name used
        as the file's key (and in error messages)."""
        handle, path = tempfile.mkstemp(prefix=prefix, suffix=".swp", dir=directory)
        try:
            self._fd(path)
        finally:
            os.close(handle)
            os.unlink(path)
        return path

    def reserve(self, path: str, nbytes: int) -> None:
        """Create ``path`` with ``round_up(nbytes)`` bytes allocated, so that a full disk shows up now, not in the
        middle of a training step."""
        fd = self._fd(path)
        try:
            os.posix_fallocate(fd, 0, round_up(nbytes))
        except OSError as err:
            if err.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                os.ftruncate(fd, round_up(nbytes))
            else:
                _raise_clear(err, path, "reserving")

    def _blocks(self, nbytes: int):
        total = round_up(nbytes)
        for start in range(0, total, self.block_bytes):
            yield start, min(start + self.block_bytes, total)

    def write(self, path: str, buffer: AlignedBuffer, nbytes: int) -> IORequest:
        fd = self._fd(path)

        def block(start: int, stop: int) -> None:
            view = buffer.memoryview(start, stop)
            done = 0
            started = IO_BUSY.begin("write")
            try:
                while done < stop - start:
                    done += _pwrite(fd, view[done:], start + done)
            finally:
                IO_BUSY.end("write", started, done)

        futures = [self._pool.submit(block, a, b) for a, b in self._blocks(nbytes)]
        return IORequest(futures, path, "writing")

    def read(self, path: str, buffer: AlignedBuffer, nbytes: int) -> IORequest:
        fd = self._fd(path)

        def block(start: int, stop: int) -> None:
            view = buffer.memoryview(start, stop)
            done = 0
            started = IO_BUSY.begin("read")
            try:
                while done < stop - start:
                    got = os.preadv(fd, [view[done:]], start + done)
                    if got == 0:
                        raise OSError(errno.EIO, f"unexpected end of swap file {path!r} at byte {start + done}")
                    done += got
            finally:
                IO_BUSY.end("read", started, done)

        futures = [self._pool.submit(block, a, b) for a, b in self._blocks(nbytes)]
        return IORequest(futures, path, "reading")

    def forget(self, path: str) -> None:
        with self._lock:
            fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _pwrite(fd: int, view: memoryview, offset: int) -> int:
    """One ``pwrite`` (a module-level function so that tests can inject ENOSPC)."""
    return os.pwritev(fd, [view], offset)
