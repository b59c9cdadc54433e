"""The trainer's model: the one GPT (:class:`~repro.models.gpt.GPTModel`), built plain, then given the parallelisms
one named step at a time, in the order torchtitan's ``parallelize_llama`` applies them, each a function a reader can
find and test alone (:class:`~repro.training.trainer.PipelineTrainer`'s constructor is the list):

0. :func:`check_layout` and :func:`seed_ranks`: the layout fits the model; Megatron's seeding (Shoeybi et al. 2019,
   sec. 3): the default generator per pipeline stage, a tracked generator per tensor-parallel rank;
1. ``GPTModel(config)`` on the meta device: the whole model, plain (no storage, no random numbers drawn);
2. :func:`apply_tensor_parallel` (Megatron sec. 3; in :mod:`repro.models.tensor_parallel_plan`, beside its table of
   which submodule splits by column, row or vocabulary, because the models' own constructors use it too);
3. :func:`apply_pipeline` (MT-NLG sec. 2.4; Narayanan et al. 2021 sec. 2.2): this rank's stage of the layers, and
   the 1F1B schedule that runs it;
4. :func:`materialize`: the weights of what this rank holds drawn (each block from its own seed), or loaded;
5. :func:`apply_activation_checkpointing` (Megatron sec. 5; Korthikanti et al. 2022's "full" recomputation);
6. :func:`apply_compile`: each layer, and the embedding and the loss as regions of their own, compiled;
7. :func:`apply_data_parallel`: DDP-style averaging over dp, or ZeRO stage 1-3 (Rajbhandari et al. 2020).

With no parallel step (:func:`build_plain_gpt`) the same GPT is the 1-GPU speed reference of the GPU experiments, so
the ratio of the trainer's speed to it measures the parallel machinery alone.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from repro.dist.groups import ParallelGroups
from repro.models.config import GPTConfig
from repro.models.gpt import GPTModel
from repro.models.tensor_parallel_plan import apply_tensor_parallel
from repro.optional import require_torch
from repro.pipeline.engine import Schedule1F1B
from repro.pipeline.partition import check_micro_batches, layers_per_stage
from repro.pipeline.stage import cut_to_stage, stage_state_dict
from repro.tensor_parallel import RNGTracker
from repro.tensor_parallel.random import COMPILED_LAYERS_TORCH
from repro.training.optim import DataParallelOptimizer, build_zero
from repro.training.recompute import CompiledCheckpointed, Checkpointed
from repro.training.reference_steps import PerParameterOptimizer
from repro.training.rules import check_zero_pipeline
from repro.training.settings import TrainSettings
from repro.training.weight_casts import WeightCasts, attach_grad_sink

__all__ = ["StageLoss", "apply_activation_checkpointing", "apply_compile", "apply_data_parallel", "apply_pipeline",
           "apply_tensor_parallel", "build_plain_gpt", "check_layout", "materialize", "seed_ranks"]


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


def apply_pipeline(model: GPTModel, groups: ParallelGroups, settings: TrainSettings,
                   device: torch.device) -> Schedule1F1B:
    """Pipeline parallelism (MT-NLG sec. 2.4): cut ``model`` (on the meta device) to this rank's stage, layers
    ``[r L/p, (r+1) L/p)`` with the embedding on the first stage and the output layer on the last
    (:func:`repro.pipeline.stage.cut_to_stage`); return the 1F1B schedule (PipeDream-flush, Narayanan et al. 2021
    sec. 2.2.1) that runs ``settings.micro_batches`` micro-batches through it per step."""
    cut_to_stage(model, pp_rank=groups.pp_rank, pp_size=groups.pp_size)
    return Schedule1F1B(num_micro_batches=settings.micro_batches,
                        activation_shape=(settings.micro_batch_size, settings.seq_len, model.config.hidden_size),
                        pp_group=groups.pp, device=device)


def materialize(model: GPTModel, groups: ParallelGroups, settings: TrainSettings, device: torch.device,
                initial_state: Mapping[str, torch.Tensor] | None = None) -> GPTModel:
    """Give the meta ``model`` storage and its weights, on ``device``: each block drawn from its own seed
    (:meth:`GPTModel.init_weights`, on the CPU, so that every device gets the same numbers), or this rank's
    slice of the consolidated ``initial_state``. The trainer checks the token ids on the host batch, so the
    embedding's own check (a device sync) is turned off."""
    model.to_empty(device="cpu")
    model.init_weights(settings.seed)
    if initial_state is not None:
        model.load_state_dict(stage_state_dict(initial_state, model.config, pp_rank=groups.pp_rank,
                                               pp_size=groups.pp_size, tp_rank=groups.tp_rank,
                                               tp_size=groups.tp_size))
    if model.embedding is not None:
        model.embedding.check_ids = False
    return model.to(device)


def apply_activation_checkpointing(stage: GPTModel, rng_tracker: RNGTracker | None, *, compiled: bool,
                                   cast_dtype: torch.dtype | None = None) -> None:
    """Wrap each layer so that backward recomputes its activations instead of keeping them (Megatron sec. 5); a
    layer to be compiled gets its checkpoint inside the compiled region (:class:`CompiledCheckpointed`). With
    ``cast_dtype`` the layer's matmul weights are cast to it once, before the checkpoint, which keeps the casts for
    the recomputation (:mod:`repro.training.weight_casts`)."""
    for index, layer in enumerate(stage.layers):
        casts = WeightCasts(layer, cast_dtype) if cast_dtype is not None else None
        stage.layers[index] = (CompiledCheckpointed(layer, casts=casts) if compiled
                               else Checkpointed(layer, rng_tracker, casts=casts))


def apply_compile(stage: GPTModel, *, with_loss: bool, norm_in_loss: bool = True) -> Callable[..., torch.Tensor]:
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
    loss = stage.output_loss
    if with_loss:
        if stage.is_last:
            stage.norm_in_loss = norm_in_loss  # the final layer norm joins the loss's region (GPTModel's docstring)
            loss = torch.compile(stage.output_loss, fullgraph=True)
        if stage.is_first:
            stage.embedding.compile(fullgraph=True)
    return loss


class StageLoss(torch.nn.Module):
    """``forward(ids, labels) -> per-token loss``: a one-stage model whose output layer runs inside a forward.

    ZeRO-3 gathers a parameter around the forward of the module that owns it; the tied output layer uses the word
    embedding in :meth:`GPTModel.output_loss`, outside the embedding's forward, so under ZeRO-3 the loss is computed
    in this module's forward with the word embedding registered as its external parameter."""

    def __init__(self, stage: GPTModel) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.stage.output_loss(self.stage.hidden_states(ids), labels)


def apply_data_parallel(stage: GPTModel, settings: TrainSettings,
                        groups: ParallelGroups) -> tuple[Any, StageLoss | None]:
    """Data parallelism over ``groups.dp``: ``(optimizer, loss module)``. ``zero_stage`` 0 keeps a replica of
    everything per rank and averages the gradients with one all-reduce of a flat buffer per step (DDP); ZeRO
    (Rajbhandari et al. 2020, sec. 5) shards over dp the optimizer states (stage 1, P_os), also the gradients,
    reduce-scattered as backward makes them (2, P_os+g), also the parameters, gathered around each module's forward
    (3, P_os+g+p: the loss then runs in :class:`StageLoss`, the returned module, else None). Where the optimizer keeps
    the gradients in flat buffers, the layers' weight casts write their gradients there."""
    if settings.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={settings.zero_stage!r} must be an integer 0-3")
    loss_module = StageLoss(stage) if settings.zero_stage == 3 else None
    if settings.zero_stage > 0:
        optimizer = build_zero(stage, settings, groups, module=loss_module)
    elif settings.flat_buffers:
        optimizer = DataParallelOptimizer(stage, settings, groups)
    else:  # the reference the flat buffers replaced
        optimizer = PerParameterOptimizer(stage, settings, groups)
    attach_grad_sink(stage.layers, getattr(optimizer, "flat", None))
    return optimizer, loss_module


def build_plain_gpt(config: GPTConfig, *, activation_checkpointing: bool = False) -> GPTModel:
    """The GPT with no parallel step applied (one device; no tensor-parallel generator: dropout draws from the
    default one), optionally checkpointed per layer: the speed reference the GPU experiments compare the trainer
    with (:mod:`repro.experiments.megatron_one_gpu`). Its loss is ``model.loss(ids, labels).mean()``. As in the
    trainer, the caller checks the token ids on the host, so the embedding's check (a device sync) is off."""
    model = GPTModel(config)
    model.embedding.check_ids = False
    if activation_checkpointing:
        apply_activation_checkpointing(model, None, compiled=False)
    return model
