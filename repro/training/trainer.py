"""A small trainer for GPT under any (tp x pp x dp) layout: the loop the tp/pp/dp experiments share.

One step (Megatron / MT-NLG sec. 2.4): cut the global batch into this dp rank's ``m`` micro-batches, run them
through the pipeline with 1F1B (:mod:`repro.pipeline.engine`), sum the tied-embedding gradient of the first and
last stage, average gradients over dp (or let ZeRO-1 reduce them), clip by the global norm, step the optimizer.
The loss each step reports is the mean per-token loss of the whole global batch, the same on every rank.

The same loop runs on CPU ranks (gloo) and GPU ranks (nccl, one GPU per rank): ``device`` places the stage and the
batches, ``precision`` runs forward and loss under bf16 or fp16 autocast with the fp32 parameters as masters (fp16 with
dynamic loss scaling, a skipped step on overflow agreed by every rank), ``activation_checkpointing`` recomputes each
layer in backward (Megatron sec. 5: checkpointing after every transformer layer), and ``compile_layers`` compiles
each transformer layer with ``torch.compile`` (the role of Megatron's fused bias-GeLU, bias-dropout-add and
layer-norm kernels), with its checkpoint inside the compiled region (:class:`~repro.training.recompute.
CompiledCheckpointed`), and the embedding and the output layer with the loss as regions of their own.

With ``zero_stage=0`` the parameters, gradients and AdamW states are flat buffers (:mod:`repro.training.flat_buffers`):
the all-reduce, the gradient norm, the clipping and the update are one operation per buffer; under bf16 with
checkpointing each layer's weights are cast once, before its checkpoint (:mod:`repro.training.weight_casts`).

Nothing in a bf16 or fp32 step waits for the GPU: the loss, the gradient norm and the clipping factor stay on the
device (:meth:`PipelineTrainer.step_lazy`); :meth:`PipelineTrainer.step` reads the loss, the one host sync.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Mapping

import torch

from repro.dist import comm
from repro.dist.groups import ParallelGroups, init_parallel
from repro.models.config import GPTConfig
from repro.models.embedding import check_token_ids
from repro.models.gpt import GPTModel
from repro.pipeline.engine import StepResult
from repro.pipeline.p2p import P2PChannel
from repro.pipeline.tied import allreduce_tied_embedding_grad
from repro.training.data import SyntheticSamples, local_micro_batches
from repro.training.parallelize import (
    apply_activation_checkpointing, apply_compile, apply_data_parallel, apply_pipeline, apply_tensor_parallel,
    check_layout, materialize, seed_ranks,
)
from repro.training.settings import PRECISIONS, TrainSettings


class PipelineTrainer:
    """This rank's stage of the model, its optimizer, and :meth:`step` on global batches ``[B, seq + 1]``.

    ``iteration`` and ``consumed_samples`` count the steps taken and the sequences they read (Megatron's
    ``iteration`` and ``consumed_train_samples``); a checkpoint (:mod:`repro.training.checkpoint`) saves and restores
    them with the model, the optimizer and every random generator."""

    def __init__(
        self, config: GPTConfig, groups: ParallelGroups, settings: TrainSettings, *,
        initial_state: Mapping[str, torch.Tensor] | None = None,
        on_action: Callable[[str, int], None] | None = None,
    ) -> None:
        check_layout(config, groups, settings)
        self.config, self.groups, self.settings, self.on_action = config, groups, settings, on_action
        self.schedule = settings.schedule()
        self.iteration = 0
        self.consumed_samples = 0
        #: the newest checkpoint (an iteration) known good: its weights gave a finite loss in the step after it
        #: (:func:`repro.training.loop.train_loop` keeps it; a checkpoint carries it to the run that resumes it)
        self.known_good_iteration: int | None = None
        self.device = torch.device(settings.device)
        self.rng_tracker = seed_ranks(settings, groups, self.device)
        # the steps of repro.training.parallelize, in order: the plain model, tp, pp, weights, checkpointing, compile, dp
        with torch.device("meta"):
            model = GPTModel(config)
        apply_tensor_parallel(model, groups.tp, self.rng_tracker)
        self.pipeline = apply_pipeline(model, groups, settings, self.device)
        self.stage = materialize(model, groups, settings, self.device, initial_state)
        if settings.activation_checkpointing:
            apply_activation_checkpointing(self.stage, self.rng_tracker, compiled=settings.compile_layers,
                                           cast_dtype=(PRECISIONS[settings.precision]
                                                       if settings.casts == "saved" else None))
        #: the loss the steps call: the stage's own, or its compiled region (evaluation runs the eager one)
        self._loss = (apply_compile(self.stage, with_loss=settings.zero_stage != 3,
                                    norm_in_loss=settings.final_norm_in_loss)
                      if settings.compile_layers else self.stage.output_loss)
        self.autocast_dtype = PRECISIONS[settings.precision]
        #: under ZeRO-3 the module whose forward computes the loss (repro.training.parallelize.StageLoss), else None
        self.optimizer, self.stage_loss = apply_data_parallel(self.stage, settings, groups)
        self.last_result: StepResult | None = None

    @property
    def global_batch_size(self) -> int:
        s = self.settings
        return s.micro_batch_size * s.micro_batches * self.groups.dp_size

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.schedule.lr(self.iteration)

    def _micro_batches(self, batch: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s, groups = self.settings, self.groups
        if tuple(batch.shape) != (self.global_batch_size, s.seq_len + 1):
            raise ValueError(
                f"batch of shape {tuple(batch.shape)} expected ({self.global_batch_size}, {s.seq_len + 1}) = "
                f"(micro_batch_size {s.micro_batch_size} x micro_batches {s.micro_batches} x dp "
                f"{groups.dp_size}, seq_len + 1)"
            )
        check_token_ids(batch, self.config.vocab_size)  # on the host batch: no sync (the embedding's check is off)
        micro = local_micro_batches(batch, dp_rank=groups.dp_rank, dp_size=groups.dp_size,
                                    num_micro_batches=s.micro_batches)
        return [(ids.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True))
                for ids, labels in micro]

    def step(self, batch: torch.Tensor) -> float:
        """One optimizer step on the global batch ``[B, seq + 1]``; returns its mean per-token loss. Reading that
        loss is the step's one host sync; :meth:`step_lazy` leaves it on the device."""
        return float(self.step_lazy(batch))

    def step_lazy(self, batch: torch.Tensor) -> torch.Tensor:
        """:meth:`step`, returning the loss as a 0-dim fp64 tensor on this rank's device (the same on every rank)
        without waiting for it: nothing in the step blocks the host in bf16 or fp32 (fp16's overflow check does)."""
        s, groups = self.settings, self.groups
        micro = self._micro_batches(batch)
        if not self.stage.training:  # one flag; train() walks every module (~500 at 1.2B) each call
            self.stage.train()
        self.optimizer.zero_grad(set_to_none=True)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        m = s.micro_batches
        scale = getattr(self.optimizer, "loss_scale", 1.0)  # fp16's dynamic loss scale; 1 otherwise

        def forward(x: torch.Tensor, i: int) -> torch.Tensor:
            with self._autocast():
                if self.stage_loss is not None:  # ZeRO-3, one stage: the loss inside a forward
                    return self.stage_loss(x, micro[i][1])
                return self.stage.hidden_states(x)

        def loss(output: torch.Tensor, i: int) -> torch.Tensor:
            with self._autocast():  # the cross-entropy itself runs in fp32 (vocab_parallel_cross_entropy)
                per_token = output if self.stage_loss is not None else self._loss(output, micro[i][1])
                value = per_token.mean() / m if m != 1 else per_token.mean()
            return value * scale if scale != 1.0 else value

        result = self.pipeline.step(forward, loss, [ids for ids, _ in micro] if self.stage.is_first else None,
                                    on_action=self.on_action)
        # in order, in fp64: the sum the host once took of the values it read (0 + the first is the first)
        local_sum = torch.zeros((), dtype=torch.float64, device=self.device) if not result.losses else None
        for value in result.losses:
            value = value.double() / scale if scale != 1.0 else value.double()
            local_sum = value if local_sum is None else local_sum.add_(value)
        allreduce_tied_embedding_grad(self.stage, groups.embedding)
        self.optimizer.step()  # reduces over dp (all-reduce or ZeRO), clips, updates
        self.last_result = result
        self.iteration += 1
        self.consumed_samples += self.global_batch_size
        return self._report_loss(local_sum)

    @torch.no_grad()
    def evaluate(self, batch: torch.Tensor) -> float:
        """Mean per-token loss of ``batch`` without training: forward only, stage to stage (no dropout)."""
        micro = self._micro_batches(batch)
        self.stage.eval()
        channel = P2PChannel(self.groups.pp)
        s, total = self.settings, 0.0
        shape = (s.micro_batch_size, s.seq_len, self.config.hidden_size)
        try:
            for ids, labels in micro:
                x = ids if self.stage.is_first else channel.recv_forward(shape, torch.float32, self.device)
                with self._autocast():
                    if self.stage_loss is not None:
                        total += float(self.stage_loss(x, labels).float().mean()) / s.micro_batches
                        continue
                    y = self.stage.hidden_states(x)
                    if self.stage.is_last:
                        total += float(self.stage.output_loss(y, labels).float().mean()) / s.micro_batches
                    else:
                        channel.send_forward(y.float())
            channel.wait_sends()
        finally:
            if hasattr(self.optimizer, "release_all"):  # ZeRO-3: gathered parameters go back to their shards
                self.optimizer.release_all()
        return float(self._report_loss(torch.tensor(total, dtype=torch.float64, device=self.device)))

    @property
    def grad_norm(self) -> float | None:
        """The global gradient norm of the last step (before clipping), when it was computed (a host sync)."""
        norm = self.grad_norm_lazy
        return None if norm is None else float(norm)

    @property
    def grad_norm_lazy(self) -> torch.Tensor | float | None:
        """:attr:`grad_norm` as the optimizer keeps it, unread: a 0-dim device tensor, or a float where the optimizer
        had to read it anyway (ZeRO under fp16, deciding a skip)."""
        return getattr(self.optimizer, "last_grad_norm", None)

    @property
    def loss_scale(self) -> float:
        return float(getattr(self.optimizer, "loss_scale", 1.0))

    @property
    def skipped_steps(self) -> int:
        return int(getattr(self.optimizer, "skipped_steps", 0))

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _report_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Mean loss of the global batch from this stage's fp64 ``loss`` (the sum over its micro-batches on the
        last stage, zero elsewhere), reduced in place: averaged over dp, sent to every stage. No host sync."""
        if self.stage.is_last and self.groups.dp_size > 1:
            comm.all_reduce(loss, self.groups.dp)
            loss /= self.groups.dp_size
        comm.broadcast(loss, self.groups.pp, src_group_rank=self.groups.pp_size - 1)
        return loss


def train_gpt(
    config: GPTConfig,
    groups: ParallelGroups | None,
    steps: int,
    micro_batches: int,
    *,
    data: torch.Tensor | Iterable[torch.Tensor] | None = None,
    initial_state: Mapping[str, torch.Tensor] | None = None,
    on_step: Callable[[int, float, PipelineTrainer], None] | None = None,
    on_action: Callable[[str, int], None] | None = None,
    **settings,
) -> list[float]:
    """Train ``steps`` steps and return the loss of each (every rank gets the same list).

    ``data``: ``[steps, B, seq + 1]`` tokens (or an iterable of ``[B, seq + 1]`` batches) with
    ``B = micro_batch_size x micro_batches x dp``; by default the synthetic learnable corpus
    (:class:`~repro.training.data.SyntheticSamples`) seeded by ``seed``, step ``k`` reading samples ``[k B, (k+1) B)``.
    ``settings`` are the other fields of :class:`TrainSettings` (``micro_batch_size``, ``seq_len``, ``lr``,
    ``optimizer``, ``clip_grad``, ``zero_stage``, ``seed`` ...). ``groups=None`` means a single process.
    ``on_step(i, loss, trainer)`` is called after each step, ``on_action(kind, micro_batch)`` before each pipeline
    action (a heartbeat).
    """
    groups = groups if groups is not None else init_parallel()
    trainer = PipelineTrainer(config, groups, TrainSettings(steps=steps, micro_batches=micro_batches, **settings),
                              initial_state=initial_state, on_action=on_action)
    s = trainer.settings
    if data is None:
        source = SyntheticSamples(vocab_size=config.vocab_size, seq_len=s.seq_len, seed=s.seed)
        data = (source.batch(k * trainer.global_batch_size, trainer.global_batch_size) for k in range(steps))
    losses: list[float] = []
    for index, batch in enumerate(data):
        if index == steps:
            break
        losses.append(trainer.step(batch))
        if on_step is not None:
            on_step(index, losses[-1], trainer)
    if len(losses) < steps:
        raise ValueError(f"data ran out after {len(losses)} batches; steps={steps} asked for more")
    return losses
