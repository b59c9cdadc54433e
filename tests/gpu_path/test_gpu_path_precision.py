"""The trainer's GPU path on a tiny GPT: bf16/fp16 autocast against fp32, fp16 dynamic loss scaling and its skipped
steps, per-layer activation checkpointing, and the device the stage runs on.

Tolerances: autocast rounds matmul inputs to the 16-bit format; bf16 keeps 8 significant bits (unit roundoff
u = 2^-8 ~ 0.39 %), fp16 11 (u = 2^-11 ~ 0.05 %). Outputs that are sums of many rounded products have a relative error
of a few u at most (errors average rather than add), so losses and the whole gradient must agree with fp32 within
4u. Measured on CPU: bf16 losses ~2e-5 and gradient ~4e-3 (1u) off; fp16 ~1e-5 and ~5e-4 (1u).
"""

from __future__ import annotations

import math

import pytest
import torch

from repro.dist.groups import init_parallel
from repro.models import GPTConfig
from repro.training.data import synthetic_tokens
from repro.training.trainer import PipelineTrainer, TrainSettings

BF16_U, FP16_U = 2.0**-8, 2.0**-11
TOLERANCE = {"bf16": 4 * BF16_U, "fp16": 4 * FP16_U}
STEPS = 5
CONFIG = GPTConfig(vocab_size=256, hidden_size=64, num_layers=2, num_attention_heads=4, max_position_embeddings=32,
                   hidden_dropout=0.0, attention_dropout=0.0)
DROPOUT = GPTConfig(vocab_size=256, hidden_size=64, num_layers=2, num_attention_heads=4, max_position_embeddings=32,
                    hidden_dropout=0.1, attention_dropout=0.1)
DATA = synthetic_tokens(vocab_size=256, seq_len=32, batch_size=4, steps=STEPS, seed=3)


def _trainer(device="cpu", config=CONFIG, **settings) -> PipelineTrainer:
    options = dict(steps=STEPS, micro_batches=2, micro_batch_size=2, seq_len=32, lr=1e-3, seed=1, device=device)
    options.update(settings)
    return PipelineTrainer(config, init_parallel(), TrainSettings(**options))


def _run(device="cpu", steps=STEPS, config=CONFIG, **settings):
    trainer = _trainer(device, config, **settings)
    losses = []
    grads = None
    for i in range(steps):
        losses.append(trainer.step(DATA[i]))
        if i == 0:  # the first step's gradient (fp32 masters: unscaled, before any precision drift)
            grads = torch.cat([p.grad.detach().flatten().float().cpu() for p in trainer.stage.parameters()])
    return losses, grads, trainer


def _relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.fixture(scope="module")
def fp32_runs():
    """fp32 reference runs per device (computed once per device)."""
    cache = {}

    def get(device):
        if device not in cache:
            cache[device] = _run(device, precision="fp32")
        return cache[device]

    return get


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16bit_autocast_matches_fp32(device, precision, fp32_runs):
    ref_losses, ref_grads, _ = fp32_runs(device)
    losses, grads, trainer = _run(device, precision=precision)
    tol = TOLERANCE[precision]
    assert all(math.isfinite(x) for x in losses)
    assert _relative(losses[0], ref_losses[0]) <= tol, (losses[0], ref_losses[0])
    worst = max(_relative(a, b) for a, b in zip(losses, ref_losses))
    assert worst <= tol, f"{precision}: losses {losses} vs fp32 {ref_losses} (worst relative {worst:.2e})"
    grad_error = float((grads - ref_grads).norm() / ref_grads.norm())
    assert grad_error <= tol, f"{precision}: first-step gradient relative error {grad_error:.2e} > {tol:.2e}"
    # the 16-bit run is really a 16-bit run (not fp32 that happens to agree): its results are not bit-identical
    assert losses != ref_losses or not torch.equal(grads, ref_grads)
    # fp32 masters: parameters and optimizer state stay fp32 on the requested device
    for p in trainer.stage.parameters():
        assert p.dtype == torch.float32 and p.device.type == torch.device(device).type
    if precision == "fp16":
        assert trainer.optimizer.skipped_steps == 0 and trainer.optimizer.loss_scale == 2.0**16
    else:
        assert trainer.optimizer.loss_scale == 1.0


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_autocast_runs_the_matmuls_in_the_requested_dtype(device, precision, dtype):
    trainer = _trainer(device, precision=precision)
    seen = []
    hooks = [trainer.stage.layers[0].mlp.fc1.register_forward_hook(lambda m, i, out: seen.append(out.dtype)),
             trainer.stage.layers[1].attention.qkv.register_forward_hook(lambda m, i, out: seen.append(out.dtype))]
    loss = trainer.step(DATA[0])
    for hook in hooks:
        hook.remove()
    assert seen and set(seen) == {dtype}
    assert math.isfinite(loss)


def test_loss_falls_in_every_precision(device, fp32_runs):
    for precision in ("fp32", "bf16", "fp16"):
        losses = fp32_runs(device)[0] if precision == "fp32" else _run(device, precision=precision)[0]
        assert losses[-1] < losses[0], f"{precision}: {losses}"


def _params(trainer):
    return [p.detach().clone() for p in trainer.stage.parameters()]


def test_fp16_overflow_skips_the_step(device):
    trainer = _trainer(device, precision="fp16")
    optimizer = trainer.optimizer
    scale0 = optimizer.loss_scale
    before = _params(trainer)
    victim = trainer.stage.layers[0].mlp.fc1.weight
    hook = victim.register_hook(lambda grad: grad * float("inf"))  # an overflow in one gradient of the model
    loss = trainer.step(DATA[0])
    assert math.isfinite(loss)  # the forward was fine; only the gradients overflowed
    assert optimizer.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _params(trainer))), "a skipped step changed parameters"
    assert not optimizer.optimizer.state, "a skipped step created Adam state"
    assert optimizer.loss_scale == scale0  # hysteresis 2: the first overflow does not halve yet
    trainer.step(DATA[1])
    assert optimizer.skipped_steps == 2 and optimizer.loss_scale == scale0 / 2  # the second one does
    assert all(torch.equal(a, b) for a, b in zip(before, _params(trainer)))
    hook.remove()
    trainer.step(DATA[2])  # clean again: the step is taken
    assert optimizer.skipped_steps == 2 and optimizer.loss_scale == scale0 / 2
    assert not all(torch.equal(a, b) for a, b in zip(before, _params(trainer)))
    assert torch.isfinite(torch.cat([p.flatten() for p in _params(trainer)])).all()


def test_fp16_huge_initial_loss_scale_skips_steps(device):
    """A loss scale of 2^40 overflows the fp16 activation gradients (|dlogits| ~ 2^40 / 128 tokens > 65504) while the
    scaled loss itself (~6e12) still fits fp32: every step is skipped, parameters stay, the loss reported is the
    unscaled one, and the scale halves every second overflow (hysteresis 2)."""
    trainer = _trainer(device, precision="fp16")
    trainer.optimizer.scaler.scale = 2.0**40
    reference = _run(device, steps=1, precision="fp16")[0][0]
    before = _params(trainer)
    losses = [trainer.step(DATA[i]) for i in range(4)]
    assert trainer.optimizer.skipped_steps == 4
    assert trainer.optimizer.loss_scale == 2.0**40 / 2**2
    assert all(torch.equal(a, b) for a, b in zip(before, _params(trainer)))
    assert all(math.isfinite(x) for x in losses)
    assert _relative(losses[0], reference) <= TOLERANCE["fp16"]  # the same forward, reported unscaled


def test_fp16_with_zero1_or_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="fp16"):
        TrainSettings(steps=1, micro_batches=1, precision="fp16", zero_stage=1)
    with pytest.raises(ValueError, match="fp8"):
        TrainSettings(steps=1, micro_batches=1, precision="fp8")


@pytest.mark.parametrize("bad", ["tpu", "gpu", "mps", "meta"])
def test_unknown_device_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match=bad):
        TrainSettings(steps=1, micro_batches=1, device=bad)


def test_defaults_are_cpu_fp32_eager_without_checkpointing():
    settings = TrainSettings(steps=1, micro_batches=1)
    assert settings.compile_layers is False and settings.activation_checkpointing is False
    assert settings.precision == "fp32" and settings.device == "cpu"


@pytest.mark.parametrize("config", [CONFIG, DROPOUT], ids=["dropout0", "dropout0.1"])
def test_activation_checkpointing_gives_the_same_training(device, config):
    """Recomputing each layer in backward changes memory, not numbers: the same losses and gradients, also with
    dropout (the recomputation must replay both the replicated and the tensor-parallel region's dropout masks)."""
    plain_losses, plain_grads, _ = _run(device, config=config, steps=3)
    ckpt_losses, ckpt_grads, trainer = _run(device, config=config, steps=3, activation_checkpointing=True)
    assert all(type(layer).__name__ == "Checkpointed" for layer in trainer.stage.layers)
    if device == "cpu":  # the same kernels in the same order: bit for bit
        assert ckpt_losses == plain_losses
        assert torch.equal(ckpt_grads, plain_grads)
    else:  # GPU backward kernels may accumulate in a different order from run to run
        assert max(_relative(a, b) for a, b in zip(ckpt_losses, plain_losses)) <= 1e-6
        assert float((ckpt_grads - plain_grads).norm() / plain_grads.norm()) <= 1e-5


def test_activation_checkpointing_with_bf16(device):
    plain = _run(device, steps=2, precision="bf16")[0]
    ckpt = _run(device, steps=2, precision="bf16", activation_checkpointing=True)[0]
    assert max(_relative(a, b) for a, b in zip(ckpt, plain)) <= 1e-6


def test_trainer_runs_on_the_device(device):
    trainer = _trainer(device, precision="bf16" if device == "cuda" else "fp32", activation_checkpointing=True)
    assert trainer.device.type == torch.device(device).type
    assert all(p.device.type == trainer.device.type for p in trainer.stage.parameters())
    losses = [trainer.step(DATA[i]) for i in range(3)]
    assert all(math.isfinite(x) for x in losses)
    assert all(p.grad.device.type == trainer.device.type for p in trainer.stage.parameters())
    fused = trainer.optimizer.optimizer.defaults.get("fused")
    assert bool(fused) == (trainer.device.type == "cuda")  # fused AdamW on CUDA only
    assert trainer.last_result is not None and len(trainer.last_result.losses) == trainer.settings.micro_batches


def _overflow_on_rank0(rank, world_size, layout):
    """fp16 step with an overflow planted in rank 0's gradients only; every rank must skip it."""
    from repro.dist import init_parallel as init

    trainer = PipelineTrainer(CONFIG, init(**layout), TrainSettings(steps=2, micro_batches=1, micro_batch_size=2,
                                                                   seq_len=32, precision="fp16", seed=1))
    before = _params(trainer)
    if rank == 0:
        trainer.stage.layers[1].mlp.fc2.weight.register_hook(lambda grad: grad * float("inf"))
    batch = DATA[0][: trainer.global_batch_size]
    loss = trainer.step(batch)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, _params(trainer)))
    return trainer.optimizer.skipped_steps, unchanged, math.isfinite(loss)


@pytest.mark.parametrize("layout", [dict(tp=2), dict(dp=2)], ids=["tp2", "dp2"])
def test_fp16_overflow_on_one_rank_is_skipped_by_every_rank(layout):
    from repro.dist import spawn

    results = spawn(_overflow_on_rank0, 2, layout)
    assert results == [(1, True, True), (1, True, True)], results
