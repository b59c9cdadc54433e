"""The trainer's optimizer on flat buffers (repro.training.flat_buffers), proved on the CPU.

* what a GPU would launch: the optimizer step and the clipping dispatch the same operations at 4 and at 40 layers,
  each on a few tensors (one per buffer), where the per-parameter optimizer they replaced grows with the model;
* the numbers stay: losses equal the per-parameter optimizer's bit for bit where the arithmetic is the same (no
  clipping; 16-bit casts made before the checkpoint), within 1e-6 in fp32 where the norm is summed in another order,
  and the fused kernel's clipping (the GPU's path: the factor as the kernel's ``grad_scale``) agrees within 1e-6;
* Megatron's rule of what the norm counts holds under tensor and pipeline parallelism (the same norms as the
  per-parameter optimizer's);
* checkpoints of the per-parameter format load, and the run continues as if it had never stopped.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig
from repro.training.optim import DataParallelOptimizer
from repro.training.reference_steps import PerParameterOptimizer
from repro.training.settings import TrainSettings
from repro.training.trainer import PipelineTrainer, train_gpt

CONFIG = GPTConfig(vocab_size=128, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=8,
                   hidden_dropout=0.1, attention_dropout=0.1)
RUN = dict(micro_batch_size=2, seq_len=8, seed=3, weight_decay=0.01, lr=3e-3)


class _TensorsPerOp(TorchDispatchMode):
    """Every aten operation dispatched inside, with how many tensors it takes (lists flattened)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = sum(isinstance(leaf, torch.Tensor) for leaf in tree_leaves((args, kwargs or {})))
        self.ops.append((str(func.overloadpacket), tensors))
        return func(*args, **(kwargs or {}))


def _optimizer_ops(layers: int, optimizer_cls, fused: bool | None) -> tuple[list[tuple[str, int]], int]:
    """The operations of one clipped optimizer step on a ``layers``-layer GPT, and its parameter count."""
    config = GPTConfig(**{**CONFIG.__dict__, "num_layers": layers, "hidden_size": 8, "num_attention_heads": 2})
    settings = TrainSettings(steps=2, micro_batches=1, clip_grad=1e-3, **{**RUN, "seq_len": 4})
    trainer = PipelineTrainer(config, init_parallel(), settings)
    trainer.optimizer = optimizer = optimizer_cls(trainer.stage, settings, trainer.groups, fused=fused)
    batch = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    trainer.step(batch)  # states exist from here on
    step = optimizer.step
    counted = _TensorsPerOp()

    def observed() -> None:
        with counted:
            step()

    optimizer.step = observed
    trainer.step(batch)
    return counted.ops, len(optimizer.params)


@pytest.mark.parametrize("fused", [None, True], ids=["cpu_kernel", "fused_kernel_as_on_a_gpu"])
def test_the_step_and_clipping_are_a_few_operations_on_a_few_tensors_at_any_depth(fused):
    small, params_small = _optimizer_ops(4, DataParallelOptimizer, fused)
    large, params_large = _optimizer_ops(40, DataParallelOptimizer, fused)
    assert params_large > 8 * params_small  # ~10x the parameters ...
    assert large == small, f"4 layers: {Counter(small)}; 40 layers: {Counter(large)}"  # ... the same operations
    widest = max(n for _, n in large)
    assert widest <= 8, f"an operation takes {widest} tensors: {[op for op in large if op[1] == widest]}"
    assert len(large) <= 40, Counter(name for name, _ in large)
    # the proxy tells the difference: the per-parameter optimizer's operations take every parameter
    before, params = _optimizer_ops(40, PerParameterOptimizer, fused)
    assert max(n for _, n in before) >= params


def _losses(steps: int = 4, micro_batches: int = 2, **settings) -> list[float]:
    return train_gpt(CONFIG, None, steps, micro_batches, **{**RUN, **settings})


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_losses_equal_the_per_parameter_optimizer(precision):
    """Bit for bit without clipping (the update is the same elementwise arithmetic on a longer tensor) and with the
    16-bit casts made before the checkpoint (the same casts of the same weights, gradients written by the casts'
    backward); with clipping within 1e-6 in fp32 (bf16 rounds a weight differently once in a while)."""
    ckpt = dict(activation_checkpointing=True, precision=precision)
    assert _losses(flat_buffers=True, **ckpt) == _losses(flat_buffers=False, weight_casts="autocast", **ckpt)
    if precision == "fp32":
        flat, ours = _losses(flat_buffers=True, clip_grad=1e-2), _losses(flat_buffers=False, clip_grad=1e-2)
        assert max(abs(a - b) / abs(b) for a, b in zip(flat, ours)) <= 1e-6


def test_the_fused_kernel_clips_by_its_grad_scale_as_a_multiplication_would():
    """The GPU's path on the CPU: fused AdamW, the clipping factor passed as the kernel's ``grad_scale`` (no pass of
    its own over the gradients), against the per-parameter optimizer's multiplication then step."""
    def run(optimizer_cls, fused):
        settings = TrainSettings(steps=4, micro_batches=2, clip_grad=1e-2, **RUN)
        trainer = PipelineTrainer(CONFIG, init_parallel(), settings)
        trainer.optimizer = optimizer_cls(trainer.stage, settings, trainer.groups, fused=fused)
        batches = torch.randint(0, CONFIG.vocab_size, (4, 4, 9), generator=torch.Generator().manual_seed(2))
        losses, norms = [], []
        for batch in batches:
            losses.append(trainer.step(batch))
            norms.append(trainer.grad_norm)
        return losses, norms, trainer.optimizer

    flat, flat_norms, optimizer = run(DataParallelOptimizer, True)
    assert optimizer.clip_in_step
    reference, reference_norms, _ = run(PerParameterOptimizer, True)
    assert max(abs(a - b) / abs(b) for a, b in zip(flat, reference)) <= 1e-6
    assert flat_norms[0] == pytest.approx(reference_norms[0], rel=1e-6)  # the same weights: the same norm
    assert min(flat_norms) > 1e-2  # clipping was active at every step


def _norms_rank(rank, world_size, layout):
    groups = init_parallel(**layout)
    out = {}
    for flat in (True, False):
        settings = TrainSettings(steps=3, micro_batches=2, clip_grad=1e-2, flat_buffers=flat, **RUN)
        trainer = PipelineTrainer(CONFIG, groups, settings)
        batches = torch.randint(0, CONFIG.vocab_size, (3, 4, 9), generator=torch.Generator().manual_seed(4))
        out[flat] = [(trainer.step(batch), trainer.grad_norm) for batch in batches]
    return out


@pytest.mark.parametrize("layout", [dict(tp=2), dict(pp=2)], ids=["tp2", "pp2"])
def test_megatrons_norm_rule_is_unchanged_under_tensor_and_pipeline_parallelism(layout):
    """tp: the replicated layer norms and row-parallel biases count once; pp: the last stage's copy of the tied
    embedding not at all. The flat buffers' norms equal the per-parameter optimizer's on every rank."""
    for result in spawn(_norms_rank, 2, layout, timeout_s=120):
        for (loss, norm), (ref_loss, ref_norm) in zip(result[True], result[False]):
            assert norm == pytest.approx(ref_norm, rel=1e-6)
            assert loss == pytest.approx(ref_loss, rel=1e-6)


def test_a_checkpoint_of_the_per_parameter_format_loads_into_flat_buffers(tmp_path):
    from repro.training.checkpoint import load_training_checkpoint, save_training_checkpoint

    settings = dict(steps=4, micro_batches=2, **RUN)
    batches = torch.randint(0, CONFIG.vocab_size, (4, 4, 9), generator=torch.Generator().manual_seed(6))
    straight = PipelineTrainer(CONFIG, init_parallel(), TrainSettings(flat_buffers=False, **settings))
    expected = [straight.step(batch) for batch in batches]
    old = PipelineTrainer(CONFIG, init_parallel(), TrainSettings(flat_buffers=False, **settings))
    first = [old.step(batch) for batch in batches[:2]]
    save_training_checkpoint(tmp_path, old)
    assert old.optimizer.state_dict()["format"] == "repro-train-dp-optimizer/1"  # the earlier format, as written
    resumed = PipelineTrainer(CONFIG, init_parallel(), TrainSettings(**settings))
    assert load_training_checkpoint(tmp_path, resumed) is not None
    assert isinstance(resumed.optimizer, DataParallelOptimizer)
    assert first + [resumed.step(batch) for batch in batches[2:]] == expected
    resumed.optimizer.load_state_dict(resumed.optimizer.state_dict())  # and its own format round-trips
    other = PipelineTrainer(GPTConfig(**{**CONFIG.__dict__, "num_layers": 1}), init_parallel(),
                            TrainSettings(**settings))
    with pytest.raises(ValueError, match="laid out for other parameters"):
        other.optimizer.load_state_dict(resumed.optimizer.state_dict())


def test_gradients_stay_views_of_the_flat_buffer_and_are_repaired_when_replaced():
    config = GPTConfig(**{**CONFIG.__dict__, "hidden_dropout": 0.0, "attention_dropout": 0.0})  # no shared RNG
    trainer = PipelineTrainer(config, init_parallel(), TrainSettings(steps=2, micro_batches=1, **RUN))
    batch = torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    trainer.step(batch)
    flat = trainer.optimizer.flat
    for p in trainer.stage.parameters():
        assert p.grad is flat.grad_view(p)
        assert p.untyped_storage().data_ptr() == flat.groups[0].data.untyped_storage().data_ptr()
    trainer.stage.zero_grad(set_to_none=True)  # what a caller outside the trainer may do
    reference = PipelineTrainer(config, init_parallel(), TrainSettings(steps=2, micro_batches=1, flat_buffers=False,
                                                                       **RUN))
    reference.step(batch)
    assert trainer.step(batch) == reference.step(batch)


def test_a_per_parameter_state_that_no_flat_buffer_can_hold_is_refused_by_name():
    from repro.training.flat_state import flat_torch_state

    trainer = PipelineTrainer(CONFIG, init_parallel(), TrainSettings(steps=1, micro_batches=1, **RUN))
    flat = trainer.optimizer.flat
    params = flat.params

    def state(steps):
        return {"state": {i: {"step": torch.tensor(float(steps(i))), "exp_avg": torch.zeros_like(p),
                              "exp_avg_sq": torch.zeros_like(p)} for i, p in enumerate(params)},
                "param_groups": [{"lr": 1e-3, "params": list(range(len(params)))}]}

    merged = flat_torch_state(state(lambda i: 3), flat)  # the accepted neighbour: one step count for all
    assert float(merged["state"][0]["step"]) == 3.0 and merged["state"][0]["exp_avg"].numel() == flat.groups[0].numel
    with pytest.raises(ValueError, match="differs in 'step'"):
        flat_torch_state(state(lambda i: 3 + (i == 5)), flat)
    partial = state(lambda i: 3)
    del partial["state"][7]
    with pytest.raises(ValueError, match="states for some parameters of a buffer and not for others"):
        flat_torch_state(partial, flat)
    fewer = state(lambda i: 3)
    fewer["param_groups"][0]["params"].pop()
    with pytest.raises(ValueError, match=f"covers {len(params) - 1} parameters, this model has {len(params)}"):
        flat_torch_state(fewer, flat)


def test_a_state_saved_by_one_kernel_loads_into_the_other_and_the_kernel_stays_this_machines():
    """A checkpoint of a CPU run (AdamW's for-loop kernel) resumed where the fused kernel runs (a GPU's): the loaded
    state keeps the fused kernel (which the clipping's grad_scale needs) and the run goes on as on the CPU."""
    config = GPTConfig(**{**CONFIG.__dict__, "hidden_dropout": 0.0, "attention_dropout": 0.0})  # no shared RNG
    settings = TrainSettings(steps=4, micro_batches=1, clip_grad=1e-2, **RUN)
    batches = torch.randint(0, CONFIG.vocab_size, (4, 2, 9), generator=torch.Generator().manual_seed(8))
    cpu_kernel = PipelineTrainer(config, init_parallel(), settings)
    first = [cpu_kernel.step(batch) for batch in batches[:2]]
    fused = PipelineTrainer(config, init_parallel(), settings)
    fused.optimizer = DataParallelOptimizer(fused.stage, settings, fused.groups, fused=True)
    fused.stage.load_state_dict(cpu_kernel.stage.state_dict())
    fused.optimizer.load_state_dict(copy.deepcopy(cpu_kernel.optimizer.state_dict()))  # as read from a file
    assert fused.optimizer.optimizer.param_groups[0]["fused"] and fused.optimizer.clip_in_step
    rest = [fused.step(batch) for batch in batches[2:]]
    expected = [cpu_kernel.step(batch) for batch in batches[2:]]
    assert first and max(abs(a - b) / abs(b) for a, b in zip(rest, expected)) <= 1e-6
