"""The NVMe tier: model states swapped to files in a directory (ZeRO-Infinity sec. 5 and 6.3).

Each key is one page-padded swap file in ``nvme_path``, unlinked as soon as it is open (nothing is left behind,
even when the process is killed). ``fetch`` reads it
into a page-aligned host buffer, ``writeback`` writes the buffer back asynchronously, ``prefetch`` starts the read
early so that it overlaps with compute (ZeRO-Infinity's overlap-centric design, sec. 6.2). Space is reserved with
``posix_fallocate`` when a key is created, so a full disk is reported at set-up with the path and the free space,
not half-way through an optimizer step.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from repro.zero.offload.aio import AlignedBuffer, AsyncFileIO, IORequest, round_up


@dataclass
class _Entry:
    path: str
    numel: int
    dtype: torch.dtype
    nbytes: int = field(init=False)  # computed once: every read and write asks for it

    def __post_init__(self) -> None:
        self.nbytes = self.numel * self.dtype.itemsize


def check_nvme_path(path: str | os.PathLike) -> str:
    """The directory must exist and accept new files; raise ValueError naming the path and the rule otherwise."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"nvme_path {path!r} does not exist; create the directory or choose another nvme_path")
    if not os.path.isdir(path):
        raise ValueError(f"nvme_path {path!r} is not a directory; nvme_path must name a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".repro-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise ValueError(f"nvme_path {path!r} is not writable ({err.strerror}); choose a writable directory") from err
    return path


class NvmeTier:
    """Swap files under ``nvme_path``; compute happens on host buffers (``compute_device`` is the CPU)."""

    name = "nvme"

    def __init__(
        self, nvme_path: str | os.PathLike, *, prefix: str = "zero", io_threads: int = 4,
        io_block_bytes: int = 1 << 20, direct: bool = True, max_inflight_writes: int = 8,
        buffer_cache_bytes: int = 1 << 30,
    ) -> None:
        self.nvme_path = check_nvme_path(nvme_path)
        self.prefix = prefix
        self.compute_device = torch.device("cpu")
        self.io = AsyncFileIO(threads=io_threads, block_bytes=io_block_bytes, direct=direct)
        self.max_inflight_writes = max_inflight_writes
        self.buffer_cache_bytes = buffer_cache_bytes
        self._entries: dict[str, _Entry] = {}
        self._reads: dict[str, tuple[AlignedBuffer, IORequest]] = {}
        self._writes: "OrderedDict[str, tuple[AlignedBuffer, IORequest]]" = OrderedDict()
        self._free: list[AlignedBuffer] = []
        # bytes of the buffers in _reads and _writes, and in _free: kept with every change to those containers, so
        # that noting the peak costs nothing (a rescan on each read and write cost ~30 % of a small NVMe step)
        self._io_buffer_bytes = 0
        self._free_bytes = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.peak_buffer_bytes = 0  # the most host memory its I/O buffers ever held (bounded memory: tested)

    # -- buffers ---------------------------------------------------------------------------------------------
    def _buffer(self, nbytes: int) -> AlignedBuffer:
        """The smallest free buffer that holds ``nbytes`` without wasting more than half of itself, else a new one.

        A new buffer is mapped, zero-filled by the kernel and later unmapped: with 33 MB shards and buffers kept
        only on an exact size match, under a 64 MB cache, that cost ~1 s per rank and step at 0.30B (two ranks on
        two cores). Reusing a free buffer costs nothing; a buffer is only made when no free one fits, so once
        every step makes the same requests nothing is mapped, and the pool stays at the buffers in use at the
        busiest moment (which the stage bounds). The factor of two keeps a small tensor from holding a large
        buffer that a large tensor then lacks."""
        need = round_up(nbytes)
        best = None
        for i, buffer in enumerate(self._free):
            if need <= buffer.nbytes <= 2 * need and (best is None or buffer.nbytes < self._free[best].nbytes):
                best = i
        if best is None:
            return AlignedBuffer(need)
        buffer = self._free.pop(best)
        self._free_bytes -= buffer.nbytes
        return buffer

    def _note_peak(self) -> None:
        """The peak of ``resident_bytes()["nvme_buffers"]``, from the running sums instead of a rescan."""
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self._io_buffer_bytes + self._free_bytes)

    def _recycle(self, buffer: AlignedBuffer) -> None:
        if self._free_bytes + buffer.nbytes <= self.buffer_cache_bytes:
            self._free.append(buffer)
            self._free_bytes += buffer.nbytes

    def _entry(self, key: str) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"nvme tier holds no tensor {key!r}") from None

    def _finish_write(self, key: str) -> None:
        buffer, request = self._writes.pop(key)
        self._io_buffer_bytes -= buffer.nbytes
        request.wait()
        self._recycle(buffer)

    # -- the tier protocol ----------------------------------------------------------------------------------
    def create(self, key: str, tensor: torch.Tensor, *, alias: bool = False) -> None:
        safe = key.replace("/", "_")
        path = self.io.create_unlinked(self.nvme_path, f"repro-{self.prefix}-{safe}-")
        entry = _Entry(path, tensor.numel(), tensor.dtype)
        try:
            self.io.reserve(entry.path, entry.nbytes)
        except OSError:
            self.io.forget(entry.path)
            raise
        self._entries[key] = entry
        buffer = self._buffer(entry.nbytes)
        buffer.view(tensor.dtype, tensor.numel()).copy_(tensor.detach().reshape(-1))
        self._submit_write(key, entry, buffer)

    def _submit_write(self, key: str, entry: _Entry, buffer: AlignedBuffer) -> None:
        if key in self._writes:
            self._finish_write(key)
        self._writes[key] = (buffer, self.io.write(entry.path, buffer, entry.nbytes))
        self._io_buffer_bytes += buffer.nbytes
        self.bytes_written += round_up(entry.nbytes)
        self._note_peak()
        while len(self._writes) > self.max_inflight_writes:
            self._finish_write(next(iter(self._writes)))

    def prefetch(self, key: str) -> None:
        if key in self._reads:
            return
        entry = self._entry(key)
        if key in self._writes:  # read after write: the file must hold the new bytes first
            self._finish_write(key)
        buffer = self._buffer(entry.nbytes)
        self._reads[key] = (buffer, self.io.read(entry.path, buffer, entry.nbytes))
        self._io_buffer_bytes += buffer.nbytes
        self.bytes_read += round_up(entry.nbytes)
        self._note_peak()

    def fetch(self, key: str) -> torch.Tensor:
        self.prefetch(key)
        buffer, request = self._reads[key]
        request.wait()
        entry = self._entries[key]
        return buffer.view(entry.dtype, entry.numel)

    def writeback(self, key: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` (the fetched buffer, updated in place, or any tensor of the key's size) to disk."""
        entry = self._entry(key)
        if tensor.numel() != entry.numel:
            raise ValueError(f"writeback of {key!r}: {tensor.numel()} elements, the swap file holds {entry.numel}")
        read = self._pop_read(key)
        if read is not None and tensor.data_ptr() == read[0].bytes.data_ptr():
            buffer = read[0]
        else:
            if read is not None:
                read[1].wait()
                self._recycle(read[0])
            buffer = self._buffer(entry.nbytes)
            buffer.view(entry.dtype, entry.numel).copy_(tensor.detach().reshape(-1))
        self._submit_write(key, entry, buffer)

    def _pop_read(self, key: str) -> tuple[AlignedBuffer, IORequest] | None:
        read = self._reads.pop(key, None)
        if read is not None:
            self._io_buffer_bytes -= read[0].nbytes
        return read

    def release(self, key: str) -> None:
        read = self._pop_read(key)
        if read is not None:
            read[1].wait()
            self._recycle(read[0])

    def flush(self) -> None:
        while self._writes:
            self._finish_write(next(iter(self._writes)))

    def stored(self, key: str) -> tuple[int, torch.dtype]:
        entry = self._entry(key)
        return entry.numel, entry.dtype

    def keys(self) -> list[str]:
        return list(self._entries)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes on disk (page-padded swap files) and host bytes held in buffers right now."""
        on_disk = sum(round_up(e.nbytes) for e in self._entries.values())
        buffers = sum(b.nbytes for b, _ in self._reads.values()) + sum(b.nbytes for b, _ in self._writes.values())
        return {"nvme": on_disk, "nvme_buffers": buffers + sum(b.nbytes for b in self._free)}

    @property
    def direct(self) -> bool:
        return self.io.direct

    def close(self) -> None:
        """Wait for writes and close the swap files (which frees their disk space: they have no names)."""
        try:
            self.flush()
        finally:
            self._reads.clear()
            self._free.clear()
            self._io_buffer_bytes = sum(b.nbytes for b, _ in self._writes.values())
            self._free_bytes = 0
            self.io.close()
