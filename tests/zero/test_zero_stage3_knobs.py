"""DeepSpeed's two stage-3 sizes take effect: ``sub_group_size`` caps the optimizer-step sub-groups (the stage-3
buckets), ``stage3_prefetch_bucket_size`` caps the parameter elements prefetched ahead of use; neither changes
the losses."""

import torch

from repro.dist import init_parallel, spawn
from repro.dist.comm import CommGroup
from repro.models import GPTModel
from repro.zero import ZeroConfig, build_zero_optimizer
from zero_cases import LR, TINY, batch, max_rel_diff, train_steps

STEPS = 4


def _ds(**zero) -> ZeroConfig:
    return ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 3, **zero}})


def _train_single(config: ZeroConfig):
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, config, dp_group=CommGroup.single("dp"), lr=LR, weight_decay=0.1)
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step)
        loss = model.loss(ids, labels).mean()
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    optimizer.close()
    return optimizer, losses


def test_sub_group_size_sets_the_stage3_step_sub_groups():
    whole, whole_losses = _train_single(_ds(sub_group_size=1e9))
    cap = 1000
    small, small_losses = _train_single(_ds(sub_group_size=cap))
    assert len(whole.buckets) == len(whole.units)  # TINY's modules are far below 1e9: one sub-group each
    assert len(small.buckets) > len(whole.buckets)
    for bucket in small.buckets:  # at most `cap` elements, unless a single tensor is larger
        assert bucket.layout.numel <= cap or len(bucket.params) == 1, (bucket.names, bucket.layout.numels)
    assert any(len(unit.buckets) > 1 for unit in small.units)
    assert small_losses == whole_losses  # Adam is elementwise: how the elements are grouped changes nothing


def test_stage3_prefetch_bucket_size_bounds_the_prefetch_window():
    free, free_losses = _train_single(_ds())
    unit_sizes = sorted(unit.numel for unit in free.units)
    cap = unit_sizes[-1] + unit_sizes[0]  # room for one large unit, not two
    assert free.gatherer.peak_ahead_numel > cap  # without a cap two large units are ahead at once
    capped, capped_losses = _train_single(_ds(stage3_prefetch_bucket_size=cap))
    assert 0 < capped.gatherer.peak_ahead_numel <= cap
    none, none_losses = _train_single(_ds(stage3_prefetch_bucket_size=1))  # smaller than any unit
    assert none.gatherer.peak_ahead_numel == 0
    assert free_losses == capped_losses == none_losses


def _two_ranks(rank, world_size):
    groups = init_parallel()
    out = {}
    for name, config in (("whole", _ds(sub_group_size=1e9)), ("small", _ds(sub_group_size=500,
                                                                              stage3_prefetch_bucket_size=5000))):
        torch.manual_seed(0)
        model = GPTModel(TINY)
        optimizer = build_zero_optimizer(model, config.with_(max_grad_norm=1.0), dp_group=groups.dp, lr=LR)
        losses = train_steps(model, optimizer, groups, range(STEPS))
        out[name] = (losses, len(optimizer.buckets), optimizer.gatherer.peak_ahead_numel)
        optimizer.close()
    return out


def test_small_sub_groups_and_prefetch_cap_on_two_ranks():
    """Several buckets per module under a real reduce-scatter: a module is released only once all its buckets'
    gradients are on their way, so no parameter is freed while the backward still needs it."""
    out = spawn(_two_ranks, 2, timeout_s=120)[0]
    (whole, whole_buckets, _), (small, small_buckets, peak) = out["whole"], out["small"]
    assert small_buckets > whole_buckets and peak <= 5000
    assert max_rel_diff(small, whole) <= 1e-6
