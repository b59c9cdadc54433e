"""The NVMe tier: aligned asynchronous swap files, prefetch, read-after-write, and clear errors."""

import errno
import subprocess

import pytest
import torch

from repro.zero.offload import DiskFullError, NvmeTier, ResidentTier, build_tier
from repro.zero.offload import aio
from repro.zero.config import OffloadConfig


def test_roundtrip_prefetch_and_writeback(tmp_path):
    tier = NvmeTier(tmp_path, io_threads=3, io_block_bytes=8192)
    tensors = {f"t{i}": torch.randn(1000 + 777 * i) for i in range(4)}
    for key, value in tensors.items():
        tier.create(key, value)
    assert tier.direct  # ext4 under pytest's tmp_path supports O_DIRECT
    assert list(tmp_path.iterdir()) == []  # swap files are unlinked once open: a killed run leaves nothing
    for key in tensors:
        tier.prefetch(key)  # all reads in flight together
    for key, value in tensors.items():
        fetched = tier.fetch(key)
        assert torch.equal(fetched, value)
        fetched.mul_(3)  # update in place, write back, read again
        tier.writeback(key, fetched)
    for key, value in tensors.items():  # read-after-write must see the new bytes
        assert torch.equal(tier.fetch(key), value * 3)
        tier.release(key)
    other = torch.arange(1000, dtype=torch.float32)
    tier.writeback("t0", other)  # any tensor of the right size
    assert torch.equal(tier.fetch("t0"), other)
    tier.release("t0")
    usage = tier.resident_bytes()
    assert usage["nvme"] == sum(aio.round_up(v.numel() * 4) for v in tensors.values())
    tier.close()


def test_bf16_and_size_mismatch(tmp_path):
    tier = NvmeTier(tmp_path)
    value = torch.randn(333).to(torch.bfloat16)
    tier.create("p", value)
    assert torch.equal(tier.fetch("p"), value) and tier.stored("p") == (333, torch.bfloat16)
    with pytest.raises(ValueError, match="333"):
        tier.writeback("p", torch.zeros(10, dtype=torch.bfloat16))
    with pytest.raises(KeyError, match="no tensor 'q'"):
        tier.fetch("q")
    tier.close()


def test_bad_paths_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        NvmeTier(tmp_path / "missing")
    file_path = tmp_path / "a_file"
    file_path.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        NvmeTier(file_path)
    with pytest.raises(ValueError, match="not writable"):
        NvmeTier("/sys")  # sysfs refuses new files, even to root
    with pytest.raises(ValueError, match="does not exist"):
        build_tier(OffloadConfig("nvme", nvme_path=str(tmp_path / "nope")), device="cpu", role="optimizer")
    assert isinstance(build_tier(OffloadConfig("cpu"), device="cpu", role="optimizer"), ResidentTier)


def test_disk_full_while_swapping_is_a_clear_error(tmp_path, monkeypatch):
    tier = NvmeTier(tmp_path, io_block_bytes=4096)
    tier.create("a", torch.zeros(5000))
    tier.flush()

    def full(fd, view, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(aio, "_pwrite", full)
    tier.writeback("a", torch.ones(5000))
    with pytest.raises(DiskFullError, match="disk full while writing .*repro-zero-a-.*swp"):
        tier.flush()
    tier.close()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_real_full_disk_is_reported_at_reservation(tiny_tmpfs):
    tier = NvmeTier(tiny_tmpfs)
    try:
        tier.create("small", torch.zeros(1000))
        with pytest.raises(DiskFullError, match="disk full while reserving"):
            tier.create("big", torch.zeros(1 << 20))
        assert torch.equal(tier.fetch("small"), torch.zeros(1000))  # what was swapped before is intact
    finally:
        tier.close()


def test_raw_bandwidth_uses_the_tiers_io_shape(tmp_path):
    """The raw drive reference overwrites a written file with the tier's request size and thread count."""
    from repro.zero.offload.bandwidth import raw_disk_bandwidth

    tier = NvmeTier(tmp_path)
    got = raw_disk_bandwidth(str(tmp_path), 8 << 20)
    assert (got["block_bytes"], got["io_threads"]) == (tier.io.block_bytes, tier.io._pool._max_workers)
    assert got["bytes"] == 8 << 20 and got["read_gbs"] > 0 and got["write_gbs"] > 0
    assert got["mixed_read_gbs"] > 0 and got["mixed_write_gbs"] > 0  # both directions at once
    assert not list(tmp_path.iterdir())  # the raw files are removed
    tier.close()


def test_io_busy_counts_the_time_requests_are_in_flight(tmp_path):
    aio.IO_BUSY.reset(keep_blocks=True)
    tier = NvmeTier(tmp_path)
    tier.create("a", torch.randn(1 << 20))
    tier.flush()
    tier.fetch("a")
    tier.close()
    assert len(aio.IO_BUSY.intervals["write"]) >= 1 and len(aio.IO_BUSY.intervals["read"]) >= 1
    assert 0 < aio.IO_BUSY.busy_s("write") and 0 < aio.IO_BUSY.busy_s("read")
    # every request is kept with its bytes: the 4 MiB tensor went out and came back in 1 MiB requests
    for direction in ("write", "read"):
        blocks = aio.IO_BUSY.blocks[direction]
        assert sum(nbytes for _, _, nbytes in blocks) == 4 << 20 and len(blocks) == 4
        assert all(start <= end for start, end, _ in blocks)
    aio.IO_BUSY.reset()  # off by default: requests are timed but not kept
    tier = NvmeTier(tmp_path)
    tier.create("b", torch.randn(1 << 20))
    tier.close()
    assert aio.IO_BUSY.blocks["write"] == [] and aio.IO_BUSY.busy_s("write") > 0


def test_buffers_are_reused_in_a_steady_state(tmp_path, monkeypatch):
    """Once a fetch / update / writeback pass has run, the next passes map no new buffer."""
    made = []
    original = aio.AlignedBuffer.__init__

    def counting(self, nbytes):
        made.append(nbytes)
        original(self, nbytes)

    monkeypatch.setattr(aio.AlignedBuffer, "__init__", counting)
    tier = NvmeTier(tmp_path, io_block_bytes=1 << 16, max_inflight_writes=2)
    sizes = {"big": 8192, "mid": 6000, "small": 100}
    for key, numel in sizes.items():
        tier.create(key, torch.full((numel,), 1.0))
    for step in range(3):
        before = len(made)
        for key in sizes:
            tier.prefetch(key)
        for key in sizes:
            value = tier.fetch(key)
            value.add_(1.0)
            tier.writeback(key, value)
        tier.flush()
        if step > 0:
            assert len(made) == before, made[before:]
    for key, numel in sizes.items():  # every value went through every pass
        assert torch.equal(tier.fetch(key), torch.full((numel,), 4.0))
        tier.release(key)
    tier.close()


def test_a_request_takes_the_smallest_free_buffer_within_twice_its_size(tmp_path):
    """A 24 KB request reuses a free 32 KB buffer rather than a 64 KB one; a 4 KB request never pins a 32 KB buffer
    (it gets a new one), so small tensors cannot starve large ones of buffers."""
    tier = NvmeTier(tmp_path)
    for nbytes in (64 << 10, 32 << 10):
        tier._recycle(aio.AlignedBuffer(nbytes))
    assert tier._buffer(24 << 10).nbytes == 32 << 10
    assert tier._buffer(4 << 10).nbytes == 4 << 10
    assert [b.nbytes for b in tier._free] == [64 << 10]
    assert tier._buffer(40 << 10).nbytes == 64 << 10 and not tier._free
    tier.close()
