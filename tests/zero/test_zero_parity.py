"""Loss parity (issue acceptance): 30 steps of a small GPT from one seed give the same fp32 losses (<= 1e-6
relative) for single-process AdamW, torch DDP, and stages 0-3 with no offload, CPU offload and NVMe offload, at
world sizes 2 and 4 and at tp=2 x dp=2. Every configuration of a grid runs inside one spawn."""

import pytest
import torch

from repro.dist import init_parallel, spawn
from zero_cases import configurations, ddp_losses, max_rel_diff, reference_losses, zero_losses

TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    losses = reference_losses()
    assert losses[-1] < 0.6 * losses[0], "the reference must learn, or parity would be vacuous"
    return losses


def _grid(rank, world_size, tp, nvme_path):
    groups = init_parallel(tp=tp)
    results = {name: zero_losses(groups, config) for name, config in configurations(nvme_path)}
    if tp == 1:
        results["ddp"] = ddp_losses(groups)
    return results


@pytest.mark.parametrize("world_size,tp", [(2, 1), (4, 1), (4, 2)], ids=["dp2", "dp4", "tp2xdp2"])
def test_loss_parity(world_size, tp, reference, tmp_path):
    results = spawn(_grid, world_size, tp, str(tmp_path), timeout_s=400)[0]
    assert len(results) == 10 + (tp == 1)
    errors = {name: max_rel_diff(losses, reference) for name, losses in results.items()}
    bad = {name: err for name, err in errors.items() if not err <= TOLERANCE}
    assert not bad, f"relative loss differences above {TOLERANCE}: {bad}"
    assert not list(tmp_path.iterdir()), "NVMe swap directories must be removed when the tiers close"
