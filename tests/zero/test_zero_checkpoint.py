"""Sharded checkpoints: resume gives identical losses, consolidation rebuilds the full model, corrupt / partial /
mismatched checkpoints are refused, and a save that runs out of disk publishes nothing."""

import subprocess

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.dist.comm import CommGroup
from repro.models import GPTModel
from repro.zero import OffloadConfig, ZeroConfig, build_zero_optimizer
from repro.zero.checkpoint import CheckpointError, consolidate_checkpoint, load_checkpoint, save_checkpoint, verify_checkpoint
from zero_cases import LR, TINY, train_steps

STEPS, SAVE_AT = 6, 3


def _train(groups, config, directory, *, resume: bool):
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, config, dp_group=groups.dp, lr=LR, weight_decay=0.1)
    if resume:
        losses = train_steps(model, optimizer, groups, range(load_checkpoint(directory, optimizer)["step"], STEPS))
    else:
        losses = train_steps(model, optimizer, groups, range(SAVE_AT))
        save_checkpoint(directory, optimizer, extra={"step": SAVE_AT})
        losses += train_steps(model, optimizer, groups, range(SAVE_AT, STEPS))
    optimizer.tier.close()
    if config.stage == 3:
        optimizer.close()
    return losses


def _resume(rank, world_size, root):
    groups = init_parallel()
    out = {}
    for stage, tier in ((1, "none"), (2, "cpu"), (3, "nvme")):
        offload = OffloadConfig(tier, nvme_path=root if tier == "nvme" else None)
        config = ZeroConfig(stage=stage, offload_optimizer=offload, offload_param=offload if stage == 3 else OffloadConfig())
        directory = f"{root}/ckpt-stage{stage}"
        straight = _train(groups, config, directory, resume=False)
        resumed = _train(groups, config, directory, resume=True)
        out[stage] = (straight, resumed, directory)
    return out


def test_resume_consolidate_and_corruption(tmp_path):
    results = spawn(_resume, 2, str(tmp_path), timeout_s=300)[0]
    for stage, (straight, resumed, _) in results.items():
        assert resumed == straight[SAVE_AT:], f"stage {stage}: resumed losses differ"
    full = {stage: consolidate_checkpoint(directory)[0] for stage, (_, _, directory) in results.items()}
    names = [name for name, _ in GPTModel(TINY).named_parameters()]
    for stage, state in full.items():
        assert sorted(state) == sorted(names)
        for name in names:
            assert torch.allclose(state[name], full[1][name], rtol=1e-5, atol=1e-6), (stage, name)

    directory = tmp_path / "ckpt-stage1"
    verify_checkpoint(directory)
    shard = directory / "rank00001.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        verify_checkpoint(directory)
    shard.write_bytes(bytes(data[:-100]))
    with pytest.raises(CheckpointError, match="truncated or partially written"):
        consolidate_checkpoint(directory)
    (directory / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        verify_checkpoint(directory)


def _single_process_optimizer(stage=1):
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, ZeroConfig(stage=stage), dp_group=CommGroup.single("dp"), lr=LR)
    ids = torch.randint(0, TINY.vocab_size, (2, 8))
    optimizer.backward(model.loss(ids, ids).mean())
    optimizer.step()
    return model, optimizer


def test_checkpoint_that_does_not_fit_this_optimizer(tmp_path):
    _, optimizer = _single_process_optimizer(stage=1)
    save_checkpoint(tmp_path / "c", optimizer)
    _, other = _single_process_optimizer(stage=2)
    with pytest.raises(ValueError, match="stage=1"):
        load_checkpoint(tmp_path / "c", other)


@pytest.fixture
def small_tmpfs(tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount_point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_disk_full_during_save_publishes_nothing(small_tmpfs):
    model, optimizer = _single_process_optimizer(stage=1)
    good = save_checkpoint(small_tmpfs / "ckpt", optimizer)  # ~330 kB: the first one fits
    before = verify_checkpoint(good)
    with pytest.raises(CheckpointError, match="disk full .* previous checkpoint .* is intact"):
        save_checkpoint(small_tmpfs / "ckpt", optimizer)  # a second copy does not
    assert verify_checkpoint(good) == before
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["ckpt"]  # no partial directory left behind
    with pytest.raises(CheckpointError, match="disk full"):
        save_checkpoint(small_tmpfs / "other", optimizer)
    assert not (small_tmpfs / "other").exists()
