"""A shard that fails its check on one rank fails the load on every rank, quickly, naming that rank's file: the
ranks agree (one all-reduce) before any parameter all-gather, instead of the healthy ranks waiting in a
collective until the process-group timeout."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.dist.spawn import free_port
from repro.models import GPTModel
from repro.zero import ZeroConfig, build_zero_optimizer
from repro.zero.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from zero_cases import LR, TINY, local_batch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _optimizer(groups, stage: int):
    torch.manual_seed(0)
    model = GPTModel(TINY)
    return model, build_zero_optimizer(model, ZeroConfig(stage=stage), dp_group=groups.dp, lr=LR)


def _save(rank, world_size, root):
    groups = init_parallel()
    for stage in (1, 3):
        model, optimizer = _optimizer(groups, stage)
        ids, labels = local_batch(0, groups)
        optimizer.backward(model.loss(ids, labels).mean())
        optimizer.step()
        save_checkpoint(f"{root}/stage{stage}", optimizer, extra={"step": 1})
        optimizer.close()


def _corrupt(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _load_and_train(rank, world_size, root):
    groups = init_parallel()
    out = {}
    for stage in (1, 3):
        model, optimizer = _optimizer(groups, stage)
        start = time.monotonic()
        try:
            load_checkpoint(f"{root}/stage{stage}", optimizer)
            ids, labels = local_batch(1, groups)  # would be the first collective of a rank that loaded
            optimizer.backward(model.loss(ids, labels).mean())
            optimizer.step()
            out[stage] = ("loaded", time.monotonic() - start)
        except CheckpointError as err:
            out[stage] = (str(err), time.monotonic() - start)
        optimizer.close()
    return out


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory) -> Path:
    """Stage-1 and stage-3 checkpoints saved once by two ranks after one step, each with rank 1's shard corrupted
    (both tests only read them)."""
    root = tmp_path_factory.mktemp("corrupted")
    spawn(_save, 2, str(root), timeout_s=120)
    for stage in (1, 3):
        _corrupt(root / f"stage{stage}" / "rank00001.pt")
    return root


def test_corrupt_shard_on_one_rank_fails_every_rank(corrupted):
    start = time.monotonic()
    results = spawn(_load_and_train, 2, str(corrupted), timeout_s=60)
    assert time.monotonic() - start < 30
    for rank, out in enumerate(results):
        for stage, (message, elapsed) in out.items():
            assert message != "loaded", (rank, stage)
            assert f"failed on rank 1 ({corrupted / f'stage{stage}' / 'rank00001.pt'})" in message, message
            assert "does not match its sha256" in message, message  # the failing rank's own reason
            assert elapsed < 10, (rank, stage, elapsed)


_RANK_SCRIPT = textwrap.dedent("""
    import sys
    import time
    sys.path.insert(0, {tests!r})
    import torch
    from repro.dist import init_parallel
    from repro.dist.launch import init_distributed
    from repro.models import GPTModel
    from repro.zero import ZeroConfig, build_zero_optimizer
    from repro.zero.checkpoint import load_checkpoint
    from zero_cases import LR, TINY, local_batch

    init_distributed("gloo", timeout_s=60)
    groups = init_parallel()
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, ZeroConfig(stage=1), dp_group=groups.dp, lr=LR)
    print("LOAD_STARTS_AT", time.time(), file=sys.stderr, flush=True)
    load_checkpoint({directory!r}, optimizer)  # raises CheckpointError on every rank: the process exits 1
    ids, labels = local_batch(1, groups)
    optimizer.backward(model.loss(ids, labels).mean())
    optimizer.step()
    print("trained after loading")
""")


def test_corrupt_shard_makes_every_rank_process_exit_nonzero(corrupted, tmp_path):
    """Real processes, as torchrun starts them: both exit non-zero within 30 s of starting to load (start-up,
    importing torch included, is allowed more), and both name the file."""
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT.format(tests=str(HERE), directory=str(corrupted / "stage1")))
    port = free_port()
    procs = []
    start = time.monotonic()
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, 120 - (time.monotonic() - start))))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    exited_at = time.time()
    load_started = [float(line.split()[1]) for _, stderr in outputs for line in stderr.splitlines()
                    if line.startswith("LOAD_STARTS_AT")]
    assert len(load_started) == 2, [stderr[-2000:] for _, stderr in outputs]
    assert exited_at - min(load_started) < 30
    for rank, (proc, (stdout, stderr)) in enumerate(zip(procs, outputs)):
        assert proc.returncode not in (0, None), (rank, stdout, stderr)
        assert "CheckpointError" in stderr and "rank00001.pt" in stderr, (rank, stderr[-2000:])
        assert "trained after loading" not in stdout
