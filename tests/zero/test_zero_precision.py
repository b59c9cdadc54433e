"""Mixed precision (ZeRO sec. 3.1): 16-bit parameters and gradients, fp32 master weights and moments, dynamic
loss scaling with overflow skip for fp16; global-norm clipping; clear errors for bad optimizer input.
Single-process (a data-parallel group of one), so the stage logic is exercised without spawning."""

import pytest
import torch

from repro.dist.comm import CommGroup
from repro.models import GPTModel
from repro.zero import LossScaleConfig, ZeroConfig, ZeroStage1, ZeroStage3, build_zero_optimizer
from repro.zero.precision import DynamicLossScaler
from zero_cases import LR, MAX_NORM, TINY, batch, reference_losses


def _train(config: ZeroConfig, steps: int = 30) -> tuple[list[float], object]:
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, config, dp_group=CommGroup.single("dp"), lr=LR, weight_decay=0.1)
    losses = []
    for step in range(steps):
        ids, labels = batch(step)
        loss = model.loss(ids, labels).float().mean()
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, optimizer


@pytest.mark.parametrize("dtype,stage", [("bf16", 1), ("bf16", 3), ("fp16", 2)])
def test_16bit_training_tracks_fp32(dtype, stage):
    torch.set_num_threads(1)
    reference = reference_losses()
    losses, optimizer = _train(ZeroConfig(stage=stage, dtype=dtype, max_grad_norm=MAX_NORM))
    assert losses[-1] < 0.6 * losses[0]
    assert max(abs(a - b) / b for a, b in zip(losses, reference)) < 0.05
    ledger = optimizer.memory_ledger()
    psi = optimizer.num_parameters
    assert ledger.total("master") == 4 * psi and ledger.total("optimizer_states") == 8 * psi
    assert ledger.total("params") == 2 * psi


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    torch.manual_seed(0)
    model = GPTModel(TINY)
    config = ZeroConfig(stage=2, dtype="fp16", loss_scale=LossScaleConfig(initial_scale_power=10, hysteresis=1))
    optimizer = build_zero_optimizer(model, config, dp_group=CommGroup.single("dp"), lr=LR)
    before = [p.detach().clone() for p in model.parameters()]
    ids, labels = batch(0)
    optimizer.backward(model.loss(ids, labels).float().mean() * float("inf"))
    optimizer.step()
    optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert optimizer.precision.loss_scale == 2.0 ** 9 and optimizer.precision.scaler.skipped_steps == 1
    optimizer.backward(model.loss(ids, labels).float().mean())
    optimizer.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_loss_scaler_growth_and_hysteresis():
    scaler = DynamicLossScaler(LossScaleConfig(initial_scale_power=4, growth_interval=2, hysteresis=2))
    assert scaler.update(False) is False and scaler.scale == 16
    assert scaler.update(False) is False and scaler.scale == 32
    assert scaler.update(True) is True and scaler.scale == 32  # first overflow absorbed by hysteresis
    assert scaler.update(True) is True and scaler.scale == 16


def test_global_norm_matches_torch():
    torch.manual_seed(0)
    model = GPTModel(TINY)
    reference = GPTModel(TINY)
    reference.load_state_dict(model.state_dict())
    optimizer = ZeroStage1(model.parameters(), dp_group=CommGroup.single("dp"), max_grad_norm=MAX_NORM, lr=LR,
                           bucket_numel=5000)
    ids, labels = batch(0)
    optimizer.backward(model.loss(ids, labels).mean())
    reference.loss(ids, labels).mean().backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    optimizer.step()
    assert expected > MAX_NORM  # clipping is active
    assert abs(optimizer.last_grad_norm - expected.item()) <= 1e-5 * expected.item()


def test_bad_optimizer_input():
    model = GPTModel(TINY)
    with pytest.raises(ValueError, match="no parameters that require gradients"):
        ZeroStage1([torch.zeros(3)], dp_group=CommGroup.single("dp"))
    mixed = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    with pytest.raises(ValueError, match="one dtype"):
        ZeroStage1(mixed, dp_group=CommGroup.single("dp"))
    with pytest.raises(ValueError, match="not in it"):
        ZeroStage3(model, [torch.nn.Parameter(torch.zeros(3))], dp_group=CommGroup.single("dp"))
    with pytest.raises(ValueError, match="max_grad_norm"):
        ZeroStage1(model.parameters(), dp_group=CommGroup.single("dp"), max_grad_norm=0.0)
