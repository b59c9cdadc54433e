"""Stage 3's CPU pool of gathered-parameter buffers: a released buffer is reused by the next gather of its size
only when nothing can still see it, and training is unchanged by it (against the same run without the pool)."""

import pytest
import torch

from repro.dist.comm import CommGroup
from repro.models import GPTModel
from repro.zero import ZeroConfig, build_zero_optimizer
from repro.zero.gather_buffers import GatherBufferPool, only_reference
from zero_cases import LR, TINY, batch


def test_only_reference_sees_views():
    buffer = torch.zeros(16)
    assert only_reference(buffer)
    view = buffer[4:8]
    assert not only_reference(buffer)
    del view
    assert only_reference(buffer)


def test_pool_reuses_a_free_buffer_of_the_same_size_and_never_one_still_viewed():
    pool = GatherBufferPool(dtype=torch.float32, device=torch.device("cpu"), max_per_size=2)
    first = pool.take(100)
    pool.give(first)
    again = pool.take(100)
    assert again.data_ptr() == first.data_ptr() and pool.reused == 1
    assert pool.take(50).numel() == 50 and pool.reused == 1  # another size: a new buffer
    kept_view = again[10:20]  # e.g. a parameter still pointing into the buffer
    pool.give(again)  # refused: the view would see the next gather's values
    pool.take(100)
    assert pool.reused == 1 and kept_view.untyped_storage().data_ptr() == again.data_ptr()
    for buffer in [torch.empty(100) for _ in range(3)]:
        pool.give(buffer)
    assert pool.held_bytes() == 2 * 100 * 4  # at most max_per_size of a size
    pool.clear()
    assert pool.held_bytes() == 0


def _train(use_pool: bool, steps: int = 4):
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, ZeroConfig(stage=3), dp_group=CommGroup.single("dp"), lr=LR,
                                     weight_decay=0.1)
    if not use_pool:
        optimizer.gatherer.pool = None  # the obvious reference: a fresh buffer for every gather
    losses = []
    for step in range(steps):
        ids, labels = batch(step)
        loss = model.loss(ids, labels).mean()
        optimizer.backward(loss)
        if use_pool:
            assert optimizer.gatherer.pool.reused > 0  # backward re-gathered into buffers forward released
        optimizer.step()
        optimizer.zero_grad()
        if use_pool:
            assert optimizer.gatherer.pool.held_bytes() == 0  # nothing held between steps
        losses.append(loss.item())
    optimizer.close()
    return losses


def test_stage3_with_the_pool_trains_exactly_as_without():
    assert _train(True) == _train(False)  # bit for bit: every step's loss depends on every earlier update


def _train_gradients(stage: int, use_pool: bool, steps: int = 4, micro: int = 2):
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, ZeroConfig(stage=stage, bucket_numel=2000),
                                     dp_group=CommGroup.single("dp"), lr=LR, weight_decay=0.1)
    if not use_pool:  # the obvious reference: a fresh gradient buffer every time
        optimizer._grad_buffer = lambda numel, dtype, device: torch.empty(numel, dtype=dtype, device=device)
    losses = []
    for step in range(steps):
        ids, labels = batch(step)
        for part in torch.arange(ids.shape[0]).chunk(micro):  # accumulation: shards added to earlier ones
            loss = model.loss(ids[part], labels[part]).mean() / micro
            optimizer.backward(loss)
            losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    reused = optimizer.grad_pool.reused if use_pool else 0
    optimizer.close()
    return losses, reused


@pytest.mark.parametrize("stage", [2, 3])
def test_reused_gradient_buffers_train_exactly_as_fresh_ones(stage):
    """Stage 2's flat gradients and reduce-scatter shards come from a pool on the CPU (zeroed where they must be)."""
    pooled, reused = _train_gradients(stage, True)
    fresh, _ = _train_gradients(stage, False)
    assert reused > 0 and pooled == fresh
