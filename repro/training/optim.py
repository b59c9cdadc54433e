"""The optimizer side of a step: reduce gradients over data parallelism, clip by the global norm, update.

``zero_stage=0`` is plain data parallelism (every dp rank holds the full optimizer state and all-reduces
gradients, DDP-style). ``zero_stage=1`` shards the optimizer state over dp with :mod:`repro.zero` stage 1
(ZeRO sec. 5.1, P_os), which MT-NLG uses on top of tensor and pipeline parallelism (sec. 2.4).
"""

from __future__ import annotations

import torch
from torch import nn

from repro.dist.comm import CommGroup, new_comm_group
from repro.dist.groups import GridCoord, ParallelGroups
from repro.training.grads import counted_in_norm

from repro.training.settings import TrainSettings


def make_torch_optimizer(params, settings: TrainSettings, *, fused: bool | None = None) -> torch.optim.Optimizer:
    """AdamW (fused into a few kernels on CUDA, or where ``fused`` says so) or SGD over ``params``."""
    if settings.optimizer == "adam":
        if fused is None:
            fused = torch.device(settings.device).type == "cuda"
        return torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                                 weight_decay=settings.weight_decay, fused=fused or None)
    if settings.optimizer == "sgd":
        return torch.optim.SGD(params, lr=settings.lr, weight_decay=settings.weight_decay)
    raise ValueError(f"optimizer={settings.optimizer!r} must be 'adam' or 'sgd'")


class DataParallelOptimizer:
    """All-reduce (average) gradients over ``groups.dp``, clip by the global norm, then step: on flat buffers.

    The model's parameters and gradients are views of one flat buffer per dtype and parameter group
    (:class:`~repro.training.flat_buffers.FlatParameters`), and the torch optimizer steps those buffers, so each part
    of the step is one operation per buffer: one all-reduce over dp, one norm, one AdamW (fused on CUDA, with the
    clipping factor folded in as its ``grad_scale``: no separate pass over the gradients, no host sync; elsewhere a
    multiplication of the flat gradient by the factor, then the step). The arithmetic is the per-parameter
    optimizer's (:class:`repro.training.reference_steps.PerParameterOptimizer`); only the norm is summed in another
    order (within 1e-6; the factor is exactly 1 when the norm is below the threshold).

    With ``precision='fp16'`` the loss is scaled by a dynamic loss scale (:class:`repro.zero.precision.
    DynamicLossScaler`); gradients are unscaled after the all-reduce and a step whose gradients overflowed on any
    rank of the model (tp x pp, all dp ranks see the same reduced gradients) is skipped by every rank."""

    stage = 0
    FORMAT = "repro-train-dp-optimizer/2"
    #: the per-parameter format of earlier versions (a torch optimizer's state over the model's parameters): loaded
    FORMAT_PER_PARAMETER = "repro-train-dp-optimizer/1"

    def __init__(self, model: nn.Module, settings: TrainSettings, groups: ParallelGroups, *,
                 fused: bool | None = None) -> None:
        from repro.training.flat_buffers import FlatParameters
        from repro.zero.precision import DynamicLossScaler

        self.model, self.groups, self.clip_grad = model, groups, settings.clip_grad
        self.dp_group = groups.dp
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.flat = FlatParameters(named, counted=lambda name: counted_in_norm(name, groups.tp_rank))
        #: the model's trainable parameters in model order (a per-parameter optimizer's order)
        self.params = self.flat.params
        self.optimizer = make_torch_optimizer([group.data for group in self.flat.groups], settings, fused=fused)
        for group in self.flat.groups:
            group.data.grad = group.grad  # the torch optimizer reads the flat gradient
        #: the fused kernel unscales by a device tensor: the clipping factor travels there, no pass of its own
        self.clip_in_step = bool(self.optimizer.defaults.get("fused"))
        #: the last step's gradient norm before clipping: a 0-dim device tensor, read (a host sync) only when logged
        self.last_grad_norm: torch.Tensor | None = None
        self.scaler = DynamicLossScaler() if settings.precision == "fp16" else None
        self.skipped_steps = 0

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict:
        """The optimizer's states (the same on every dp rank) as flat tensors with the layout they fit, the loss
        scaler and the skipped-step count."""
        return {"format": self.FORMAT, "stage": 0, "dp_rank": self.dp_group.rank, "dp_size": self.dp_group.size,
                "layout": self.flat.layout(), "torch": self.optimizer.state_dict(),
                "skipped_steps": self.skipped_steps,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (from any dp rank of any dp size: the states are replicated over dp), or the
        per-parameter state of the earlier format."""
        from repro.training.flat_state import flat_torch_state

        fmt = state.get("format")
        if fmt == self.FORMAT:
            if state.get("layout") != self.flat.layout():
                raise ValueError("the checkpoint's optimizer state was laid out for other parameters (names, sizes "
                                 "or dtypes differ from this model's)")
            torch_state = state["torch"]
        elif fmt == self.FORMAT_PER_PARAMETER:
            torch_state = flat_torch_state(state["torch"], self.flat)
        else:
            raise ValueError(f"not a data-parallel optimizer state (format {fmt!r}, expected {self.FORMAT!r}); was "
                             "the checkpoint written with another --zero-stage?")
        if (state["scaler"] is None) != (self.scaler is None):
            raise ValueError("the checkpoint's precision differs from this run's (fp16 loss scaler present in one "
                             "of them only)")
        kernel = {k: group[k] for group in self.optimizer.param_groups[:1] for k in ("fused", "foreach",
                                                                                    "capturable") if k in group}
        self.optimizer.load_state_dict(torch_state)
        for group in self.optimizer.param_groups:
            group.update(kernel)  # the kernel is this machine's choice, not the checkpoint's
            if group.get("fused") or group.get("capturable"):  # whose step count lives beside the parameters
                for param in group["params"]:
                    states = self.optimizer.state.get(param, {})
                    if isinstance(states.get("step"), torch.Tensor):
                        states["step"] = states["step"].to(param.device, torch.float32)
        self.skipped_steps = int(state["skipped_steps"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradients in place (``set_to_none`` is accepted and ignored: the gradients are views of the
        flat buffers, which backward accumulates into)."""
        self.flat.zero_grad()

    def _unscale_and_check(self) -> bool:
        """Divide gradients by the loss scale; True when any gradient of the model is inf or nan."""
        from repro.dist import comm

        found = None
        for group in self.flat.groups:
            group.grad.div_(self.scaler.scale)
            bad = (~torch.isfinite(group.grad)).any().float()
            found = bad if found is None else torch.maximum(found, bad)
        comm.all_reduce(found, self.groups.tp, op=torch.distributed.ReduceOp.MAX)
        comm.all_reduce(found, self.groups.pp, op=torch.distributed.ReduceOp.MAX)
        return bool(found > 0)

    def _global_norm(self) -> torch.Tensor:
        """The full model's gradient norm (Megatron's rule: each value once), a 0-dim fp64 device tensor, identical
        on every rank; the sums of squares are added over the tp and pp groups on the device."""
        from repro.dist import comm

        norms = self.flat.counted_norms()
        single = self.groups.tp.size == 1 and self.groups.pp.size == 1
        if single and len(norms) == 1:
            return norms[0].double()
        if not norms:
            squares = torch.zeros((), dtype=torch.float64, device=self.flat.groups[0].grad.device)
        else:
            squares = torch.stack(norms).double().square().sum() if len(norms) > 1 else norms[0].double().square()
        comm.all_reduce(squares, self.groups.tp)
        comm.all_reduce(squares, self.groups.pp)
        return squares.sqrt()

    def step(self) -> None:
        from repro.dist import comm

        self.flat.repair_grads()
        if self.dp_group.size > 1:
            for group in self.flat.groups:  # DDP: the average over the replicas, one all-reduce per buffer
                comm.all_reduce(group.grad, self.dp_group)
                group.grad.div_(self.dp_group.size)
        if self.scaler is not None:
            if self.scaler.update(self._unscale_and_check()):
                self.skipped_steps += 1
                return
        unscale = None
        if self.clip_grad is not None:
            norm = self.last_grad_norm = self._global_norm()
            if self.clip_in_step:  # the fused kernel divides by it: 1 / min(1, max / (norm + eps)), on the device
                unscale = ((norm + 1e-6) / self.clip_grad).clamp(min=1.0).float()
            else:
                factor = (self.clip_grad / (norm + 1e-6)).clamp(max=1.0)
                for group in self.flat.groups:
                    group.grad.mul_(factor)  # as grad.mul_(python float): the same bits
        self.optimizer.grad_scale = unscale  # read by the fused AdamW (torch's GradScaler hook)
        try:
            self.optimizer.step()
        finally:
            self.optimizer.grad_scale = None


def model_parallel_group(groups: ParallelGroups) -> CommGroup:
    """The tp x pp ranks of this rank's data-parallel replica (one model copy), for the global gradient norm.

    Creates one group per dp rank, so every rank of the job must call it, in the same order; their timeout is the
    one ``groups`` were made with."""
    grid = groups.grid
    families = [[grid.rank(GridCoord(t, d, p)) for p in range(grid.pp) for t in range(grid.tp)]
                for d in range(grid.dp)]
    mine = [new_comm_group("model_parallel", ranks, groups.ledger, timeout_s=groups.world.timeout_s)
            for ranks in families]
    return next(g for g in mine if g.rank >= 0)


def build_zero(model: nn.Module, settings: TrainSettings, groups: ParallelGroups, *,
               module: nn.Module | None = None):
    """ZeRO stage 1, 2 or 3 over ``groups.dp`` (repro.zero): optimizer states (1), gradients (2) and parameters (3)
    of each dp replica sharded dp ways. Stage 3 partitions ``module`` (default ``model``), whose forward must run
    every parameter it uses (see :class:`repro.training.parallelize.StageLoss`).

    The clipping norm is summed over the model-parallel ranks, counting tp-replicated parameters and the last
    stage's copy of the tied embedding once (Megatron's rule, as in :mod:`repro.training.grads`)."""
    from repro.zero import ZeroStage1, ZeroStage2, ZeroStage3

    if settings.optimizer != "adam":
        raise ValueError(f"zero_stage={settings.zero_stage} shards Adam's states; optimizer={settings.optimizer!r} "
                         "is not supported")
    from repro.zero.config import ZeroConfig
    from repro.zero.offload import build_tier

    zero = settings.zero if settings.zero is not None else ZeroConfig(stage=settings.zero_stage)
    named = list(model.named_parameters())
    excluded = [p for name, p in named if not counted_in_norm(name, groups.tp_rank)]
    mp_group = model_parallel_group(groups)
    device = named[0][1].device
    common = dict(
        dp_group=groups.dp, lr=settings.lr, betas=settings.betas, eps=settings.eps,
        weight_decay=settings.weight_decay,
        max_grad_norm=zero.max_grad_norm if zero.max_grad_norm is not None else settings.clip_grad,
        model_parallel_group=mp_group if mp_group.size > 1 else None, norm_excluded=excluded,
        bucket_numel=zero.bucket_numel,
        optimizer_tier=build_tier(zero.offload_optimizer, device=device, role="optimizer"),
    )
    if settings.zero_stage == 3:
        root = module if module is not None else model
        word = model.tied_embedding() if hasattr(model, "tied_embedding") else None
        external = {root: [word.weight]} if word is not None and root is not model else None
        return ZeroStage3(root, [p for _, p in named], external_parameters=external, param_names=named,
                          param_tier=build_tier(zero.offload_param, device=device, role="param"),
                          prefetch=zero.prefetch, prefetch_numel=zero.prefetch_numel, **common)
    cls = {1: ZeroStage1, 2: ZeroStage2}[settings.zero_stage]
    return cls([p for _, p in named], param_names=named, **common)

