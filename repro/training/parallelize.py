"""The trainer's model, built one named step at a time (torchtitan's habit: ``apply_tp``, ``apply_ac``,
``apply_compile``, ``apply_fsdp``), so that each technique reads on its own and the trainer's constructor is the
list of steps:

1. :func:`check_layout`: the layout and the sizes fit (pp divides the layers, enough micro-batches, ZeRO 2/3 only
   without pp);
2. :func:`seed_ranks`: Megatron's seeding (Shoeybi et al. 2019, sec. 3, "model parallel random number generation"):
   the default generator per pipeline stage, a tracked generator per tensor-parallel rank for dropout in tp regions;
3. :func:`build_stage`: this rank's pipeline stage (Narayanan et al. 2021; MT-NLG sec. 2.4) of tensor-parallel
   layers (Megatron sec. 3), from the seed or from a consolidated state;
4. :func:`apply_activation_checkpointing`: each layer recomputed in backward (Megatron sec. 5; Korthikanti et al.
   2022's "full" recomputation);
5. :func:`apply_compile`: each layer, and the embedding and the loss as regions of their own, compiled;
6. :func:`apply_data_parallel`: the optimizer that makes the ranks of a dp group one model: DDP-style averaging, or
   ZeRO stage 1-3 (Rajbhandari et al. 2020) sharding its states.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from repro.dist.groups import ParallelGroups
from repro.models.config import GPTConfig
from repro.optional import require_torch
from repro.pipeline.partition import check_micro_batches, layers_per_stage
from repro.pipeline.stage import GPTStage
from repro.tensor_parallel import RNGTracker
from repro.tensor_parallel.random import COMPILED_LAYERS_TORCH
from repro.training.optim import build_optimizer
from repro.training.recompute import CompiledCheckpointed, Checkpointed
from repro.training.reference_steps import PerParameterOptimizer
from repro.training.rules import check_zero_pipeline
from repro.training.settings import TrainSettings
from repro.training.weight_casts import WeightCasts, attach_grad_sink


def check_layout(config: GPTConfig, groups: ParallelGroups, settings: TrainSettings) -> None:
    """ValueError naming the rule a layout or size breaks."""
    layers_per_stage(config.num_layers, groups.pp_size)  # raises when pp does not divide the layers
    check_micro_batches(settings.micro_batches, groups.pp_size)
    if settings.seq_len > config.max_position_embeddings:
        raise ValueError(f"seq_len={settings.seq_len} exceeds max_position_embeddings={config.max_position_embeddings}")
    check_zero_pipeline(settings.zero_stage, groups.pp_size)


def seed_ranks(settings: TrainSettings, groups: ParallelGroups, device: torch.device) -> RNGTracker:
    """Replicated dropout equal across tp and different per stage (the default generators, seeded per pp rank);
    dropout inside tp regions different per tp rank (the returned tracker)."""
    torch.manual_seed(settings.seed + 100 * groups.pp_rank)
    if device.type == "cuda":
        torch.cuda.manual_seed(settings.seed + 100 * groups.pp_rank)
    return RNGTracker(seed=settings.seed + 100 * groups.pp_rank, tp_rank=groups.tp_rank, device=device.type)


def build_stage(config: GPTConfig, groups: ParallelGroups, settings: TrainSettings, rng_tracker: RNGTracker,
                device: torch.device, initial_state: Mapping[str, torch.Tensor] | None = None) -> GPTStage:
    """This rank's stage: its share of the layers (pp), each split over the tp group, on ``device``."""
    stage = GPTStage(config, pp_rank=groups.pp_rank, pp_size=groups.pp_size, tp_group=groups.tp,
                     seed=settings.seed, rng_tracker=rng_tracker)
    if stage.embedding is not None:
        stage.embedding.check_ids = False  # the trainer checks the ids on the host batch instead (no device sync)
    if initial_state is not None:
        stage.load_consolidated(initial_state)
    return stage.to(device)


def apply_activation_checkpointing(stage: GPTStage, rng_tracker: RNGTracker, *, compiled: bool,
                                   cast_dtype: torch.dtype | None = None) -> None:
    """Wrap each layer so that backward recomputes its activations instead of keeping them; a layer to be
    compiled gets its checkpoint inside the compiled region (:class:`CompiledCheckpointed`). With ``cast_dtype``
    the layer's matmul weights are cast to it once, before the checkpoint, which keeps the casts for the
    recomputation (:mod:`repro.training.weight_casts`)."""
    for index, layer in enumerate(stage.layers):
        casts = WeightCasts(layer, cast_dtype) if cast_dtype is not None else None
        stage.layers[index] = (CompiledCheckpointed(layer, casts=casts) if compiled
                               else Checkpointed(layer, rng_tracker, casts=casts))


def apply_compile(stage: GPTStage, *, with_loss: bool, norm_in_loss: bool = True) -> Callable[..., torch.Tensor]:
    """Compile each layer with ``torch.compile`` (the role of Megatron's fused bias-GeLU, bias-dropout-add and
    layer-norm kernels); with ``with_loss`` (not under ZeRO-3, whose loss runs in a module of its own) the last
    stage's final layer norm, output layer and cross-entropy and the first stage's embedding become compiled regions
    too, so the glue between the layers fuses. Returns the loss function the steps call (evaluation runs the eager
    one, which applies the final layer norm the same way)."""
    # torch 2.4 compiles a layer only with graph breaks around the RNG swap, and not at all inside an activation
    # checkpoint (AOTAutograd meets the generator state outside its fake mode)
    require_torch(COMPILED_LAYERS_TORCH, "compiled transformer layers (compile_layers)")
    for layer in stage.layers:
        layer.compile()
    loss = stage.loss
    if with_loss:
        if stage.is_last:
            stage.norm_in_loss = norm_in_loss  # the final layer norm joins the loss's region (GPTStage's docstring)
            loss = torch.compile(stage.loss, fullgraph=True)
        if stage.is_first:
            stage.embedding.compile(fullgraph=True)
    return loss


def apply_data_parallel(stage: GPTStage, settings: TrainSettings, groups: ParallelGroups, *,
                        loss_module: torch.nn.Module | None = None):
    """The optimizer over the dp group: DDP-style gradient averaging (``zero_stage=0``) or ZeRO stage 1-3;
    ``loss_module`` is the module whose forward computes the loss under ZeRO-3. Where the optimizer keeps the
    gradients in flat buffers, the layers' weight casts write their gradients there."""
    if settings.zero_stage == 0 and not settings.flat_buffers:  # the reference the flat buffers replaced
        optimizer = PerParameterOptimizer(stage, settings, groups)
    else:
        optimizer = build_optimizer(stage, settings, groups, module=loss_module)
    attach_grad_sink(stage.layers, getattr(optimizer, "flat", None))
    return optimizer
