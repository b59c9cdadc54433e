"""Stage 0: plain data parallelism, the baseline of ZeRO sec. 3 and the base the three stages build on.

Every rank holds all model states: 16-bit parameters and gradients (2 psi + 2 psi bytes) and the optimizer's
fp32 master weights and moments (K psi, K = 12 for Adam). Gradients are averaged with one all-reduce per bucket
(2 psi elements on the wire per rank, ZeRO sec. 7.1), then every rank runs the same update.

The step is written once, here, as a loop over buckets, and the stages override only what they change:

    _init_params / _init_grads     where parameters and gradients live
    _reduce_gradients              how gradients are reduced (all-reduce here)
    _master_source                 which elements this rank's optimizer owns
    _write_params                  how updated parameters reach every rank

Device: every buffer is allocated on the parameters' device. With the optimizer states on a host tier and the
model on a GPU (ZeRO-Offload), each bucket's gradient shard is copied to pinned host memory one bucket ahead of
the CPU step and the updated fp32 master is copied back asynchronously (see transfer.py for when that is safe).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.zero.buckets import Bucket, build_buckets
from repro.zero.config import LossScaleConfig
from repro.zero.grad_norm import clip_coefficient, global_grad_sums, scale_
from repro.zero.inner import OptimizerFactory, TieredOptimizer, optimizer_defaults
from repro.zero.ledger import Item, MemoryLedger, TransientTracker, measure, tensor_bytes
from repro.zero.offload.nvme import NvmeTier
from repro.zero.offload.tiers import ResidentTier, Tier
from repro.zero.precision import Precision
from repro.zero.transfer import GradientStager, copy_into, synchronize

CHECKPOINT_FORMAT = "repro-zero/1"
#: Collectives of whole buckets allowed in flight at once: enough to overlap, few enough that the communication
#: library's temporary buffers stay small.
MAX_BUCKETS_IN_FLIGHT = 2


def bound_inflight(works: list[Any], limit: int = MAX_BUCKETS_IN_FLIGHT) -> None:
    """Wait for the oldest asynchronous collectives until at most ``limit`` remain (``works`` is edited)."""
    while len(works) > limit:
        work = works.pop(0)
        if work is not None:
            work.wait()


class DataParallelOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer_cls`` (default AdamW) for data parallelism over ``dp_group``.

    ``params``: parameters or parameter groups, as for any torch optimizer. ``optimizer_tier`` holds the fp32
    master weights and optimizer states (resident on the parameters' device by default). ``model_parallel_group``
    (one group, or several such as ``(groups.tp, groups.pp)``) and ``norm_excluded`` (parameters another rank
    already counts: tensor-parallel duplicates, the second copy of a tied embedding) make the clipping norm and
    the fp16 overflow check global under tensor/pipeline parallelism (see grad_norm.py). Gradients accumulate
    over micro-batches until ``step()``; gradients of tied copies must be summed by the caller before it.
    Remaining keyword arguments go to ``optimizer_cls`` (lr, betas, weight_decay, ...).
    """

    stage = 0

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict],
        *,
        dp_group: CommGroup,
        optimizer_cls: OptimizerFactory = torch.optim.AdamW,
        optimizer_tier: Tier | None = None,
        max_grad_norm: float | None = None,
        bucket_numel: int = 500_000,
        loss_scale: LossScaleConfig = LossScaleConfig(),
        model_parallel_group: CommGroup | Sequence[CommGroup] | None = None,
        norm_excluded: Iterable[nn.Parameter] = (),
        param_names: Iterable[tuple[str, nn.Parameter]] = (),
        **optimizer_kwargs: Any,
    ) -> None:
        super().__init__(params, optimizer_defaults(optimizer_cls, optimizer_kwargs))
        trainable = [[p for p in group["params"] if p.requires_grad] for group in self.param_groups]
        flat = [p for group in trainable for p in group]
        if not flat:
            raise ValueError("the optimizer was given no parameters that require gradients")
        dtypes = {p.dtype for p in flat}
        if len(dtypes) != 1:
            raise ValueError(
                f"all parameters must share one dtype (the training precision), got {sorted(map(str, dtypes))}")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm={max_grad_norm} must be > 0 (or None for no clipping)")
        self.device = flat[0].device
        self.precision = Precision(flat[0].dtype, loss_scale)
        self.dp_group = dp_group
        self.model_parallel_group = model_parallel_group
        self.max_grad_norm = max_grad_norm
        #: the last step's norm before clipping: a float under fp16, else a 0-dim fp64 device tensor (read when logged)
        self.last_grad_norm: float | torch.Tensor | None = None
        self.tier = optimizer_tier if optimizer_tier is not None else ResidentTier("device", self.device)
        self.transient = TransientTracker()
        self._norm_excluded = {id(p) for p in norm_excluded}
        self._names = {id(p): name for name, p in param_names}
        self._slots: dict[int, tuple[Bucket, int]] = {}
        self.buckets = self._build_buckets(trainable, bucket_numel)
        self.inner = TieredOptimizer(optimizer_cls, self.tier, param_device=self.device)
        self.stager = GradientStager(self.tier.compute_device)
        self._pending: list[Any] = []
        for bucket in self.buckets:
            self._init_params(bucket)
            self._init_grads(bucket)
            self._add_subgroup(bucket)
        self.tier.flush()

    def _add_subgroup(self, bucket: Bucket) -> None:
        """Register the bucket's shard with the wrapped optimizer (its fp32 master starts from the parameters)."""
        self.inner.add(bucket.key, self._master_source(bucket), self._hparams(bucket))

    # -- layout ------------------------------------------------------------------------------------------------
    def _layout_world(self) -> tuple[int, int]:
        """(shards, this rank's shard) of every bucket: stage 0 does not partition."""
        return 1, 0

    def _build_buckets(self, trainable: list[list[nn.Parameter]], bucket_numel: int) -> list[Bucket]:
        world, rank = self._layout_world()
        return build_buckets(trainable, self._names, world_size=world, rank=rank, bucket_numel=bucket_numel)

    def _hparams(self, bucket: Bucket) -> dict[str, Any]:
        return {k: v for k, v in self.param_groups[bucket.group_index].items() if k != "params"}

    # -- storage -----------------------------------------------------------------------------------------------
    def _init_params(self, bucket: Bucket) -> None:
        """Parameters become views of one flat buffer, so shards and collectives need no copies."""
        bucket.flat_param = bucket.flatten(bucket.params, dtype=self.precision.dtype, device=self.device)
        for index, param in enumerate(bucket.params):
            param.data = bucket.param_view(bucket.flat_param, index)

    def _init_grads(self, bucket: Bucket) -> None:
        """Gradients live in one flat buffer per bucket, allocated when the bucket's first gradient arrives in
        backward and freed by ``zero_grad()``: like torch's own ``set_to_none``, no gradient memory is held
        during the forward pass, when activations peak."""
        for index, param in enumerate(bucket.params):
            param.grad = None
            self._slots[id(param)] = (bucket, index)
            param.register_post_accumulate_grad_hook(self._adopt_grad)

    def _adopt_grad(self, param: nn.Parameter) -> None:
        """Move a freshly produced ``param.grad`` into the bucket's flat buffer (later micro-batches then
        accumulate into the view in place)."""
        bucket, index = self._slots[id(param)]
        if bucket.flat_grad is None:
            bucket.flat_grad = torch.zeros(bucket.layout.padded_numel, dtype=param.grad.dtype, device=param.grad.device)
        view = bucket.param_view(bucket.flat_grad, index)
        if param.grad.data_ptr() != view.data_ptr():
            view.copy_(param.grad)
            param.grad = view

    def _point_grads(self, bucket: Bucket) -> None:
        """``param.grad`` must be a view of the flat gradient; repair it if the caller replaced or cleared it."""
        if bucket.flat_grad is None:
            bucket.flat_grad = torch.zeros(bucket.layout.padded_numel, dtype=self.precision.dtype, device=self.device)
        for index, param in enumerate(bucket.params):
            view = bucket.param_view(bucket.flat_grad, index)
            if param.grad is None:
                view.zero_()
            elif param.grad.data_ptr() != view.data_ptr():
                view.copy_(param.grad)
            param.grad = view

    def _master_source(self, bucket: Bucket) -> torch.Tensor:
        lo, hi = bucket.shard_range
        return bucket.flat_param[lo:hi]

    # -- the step ----------------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with the fp16 loss scale applied."""
        self.precision.scale_loss(loss).backward()

    def _reduce_gradients(self) -> list[torch.Tensor]:
        """This rank's summed (not yet averaged) gradient shard of every bucket."""
        works: list[Any] = []
        for bucket in self.buckets:
            self._point_grads(bucket)
            works.append(comm.all_reduce(bucket.flat_grad, self.dp_group, async_op=True))
            bound_inflight(works)
        bound_inflight(works, 0)
        return [bucket.flat_grad for bucket in self.buckets]

    def _scale_factor(self, shards: list[torch.Tensor]) -> tuple[float | torch.Tensor, bool]:
        """(factor turning summed gradients into the clipped mean, skip this step?)."""
        factor = 1.0 / (self.dp_group.size * self.precision.loss_scale)
        if self.max_grad_norm is None and not self.precision.checks_overflow:
            return factor, False
        sums = global_grad_sums(
            ((shard, bucket.shard_ranges_excluding(self._norm_excluded))
             for bucket, shard in zip(self.buckets, shards)),
            dp_group=self.dp_group, model_parallel_group=self.model_parallel_group,
            replicated_over_dp=self.stage == 0, device=self.device,
        )
        if self.precision.checks_overflow:  # fp16: whether to skip is decided on the host (one sync)
            sumsq, found_inf = sums.tolist()
            if self.precision.update(bool(found_inf > 0 or not math.isfinite(sumsq))):
                return factor, True
            self.last_grad_norm = math.sqrt(sumsq) * factor
            return factor * clip_coefficient(self.last_grad_norm, self.max_grad_norm), False
        # bf16, fp32: the same double-precision arithmetic on the device, nothing waits for it
        self.last_grad_norm = sums[0].double().sqrt() * factor
        return factor * (self.max_grad_norm / (self.last_grad_norm + 1e-6)).clamp(max=1.0), False

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer API
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        shards = self._reduce_gradients()
        factor, skip = self._scale_factor(shards)
        if skip:
            self._after_step()
            self.zero_grad()
            return loss
        # The step writes host tiers in place: host -> device copies issued from them last step must be done.
        if not (isinstance(self.tier, ResidentTier) and self.tier.name == "device"):
            synchronize(self.device)
        for i, bucket in enumerate(self.buckets):
            if i + 1 < len(self.buckets):
                self.inner.prefetch(self.buckets[i + 1].key)
                self.stager.start(i + 1, shards[i + 1])
            grad = self.stager.fetch(i, shards[i]).float()
            if grad.data_ptr() != shards[i].data_ptr():
                self.transient.add("comm_buffers", tensor_bytes(grad))
            scale_(grad, factor)
            master = self.inner.step(bucket.key, grad, self._hparams(bucket))
            self._write_params(bucket, master)
            self.inner.release(bucket.key)
            if grad.data_ptr() != shards[i].data_ptr():
                self.transient.remove("comm_buffers", tensor_bytes(grad))
        self._after_step()
        return loss

    def _write_params(self, bucket: Bucket, master: torch.Tensor) -> None:
        lo, hi = bucket.shard_range
        own = bucket.flat_param[lo:hi]
        if own.data_ptr() != master.data_ptr():
            copy_into(own, master)  # fp32 -> 16 bit; from a pinned host master asynchronously

    def _after_step(self) -> None:
        for work in self._pending:
            if work is not None:
                work.wait()
        self._pending.clear()
        self.stager.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the flat gradients (``set_to_none``, the default) or zero them in place."""
        for bucket in self.buckets:
            if set_to_none or bucket.flat_grad is None:
                bucket.flat_grad = None
                for param in bucket.params:
                    param.grad = None
            else:
                bucket.flat_grad.zero_()

    def close(self) -> None:
        """Release the tiers (NVMe swap files are deleted)."""
        self.tier.close()

    # -- inspection --------------------------------------------------------------------------------------------
    def _device_tier(self) -> str:
        return "device"

    def _model_items(self) -> Iterator[Item]:
        for bucket in self.buckets:
            yield "params", self._device_tier(), bucket.flat_param
        for bucket in self.buckets:
            if bucket.flat_grad is not None:
                yield "grads", self._device_tier(), bucket.flat_grad

    def _optimizer_items(self) -> Iterator[Item]:
        if isinstance(self.tier, NvmeTier):
            self.tier.flush()
        for kind, key in self.inner.keys_by_kind():
            if isinstance(self.tier, ResidentTier):
                yield kind, self.tier.name, self.tier.fetch(key)
            else:
                numel, dtype = self.tier.stored(key)
                yield kind, self.tier.name, numel * torch.empty(0, dtype=dtype).element_size()
        if isinstance(self.tier, NvmeTier):
            yield "io_buffers", "cpu", self.tier.resident_bytes()["nvme_buffers"]

    def memory_ledger(self) -> MemoryLedger:
        """Bytes of model states this rank holds now, by kind and tier (see ledger.py)."""
        return measure(list(self._model_items()) + list(self._optimizer_items()))

    @property
    def padding_elements(self) -> int:
        return sum(bucket.layout.padding for bucket in self.buckets)

    @property
    def num_parameters(self) -> int:
        """psi: elements of the trainable parameters this optimizer updates (padding excluded)."""
        return sum(bucket.layout.numel for bucket in self.buckets)

    # -- checkpoints (files: checkpoint.py) --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard of the optimizer: master weights, states, hyperparameters, loss scale."""
        return {
            "format": CHECKPOINT_FORMAT, "stage": self.stage, "dp_rank": self.dp_group.rank,
            "dp_size": self.dp_group.size,
            "buckets": [
                {"key": b.key, "numels": list(b.layout.numels), "names": list(b.names), "group": b.group_index,
                 "shapes": [list(shape) for shape in b.shapes],
                 "layout_world": b.layout.world_size, "layout_rank": b.rank, "state": self.inner.state_dict(b.key)}
                for b in self.buckets
            ],
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
            "precision": self.precision.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"not a ZeRO optimizer state (format {state.get('format')!r}, expected {CHECKPOINT_FORMAT!r})")
        for name, mine in (("stage", self.stage), ("dp_size", self.dp_group.size), ("dp_rank", self.dp_group.rank)):
            if state[name] != mine:
                raise ValueError(f"checkpoint has {name}={state[name]}, this optimizer has {name}={mine}")
        if len(state["buckets"]) != len(self.buckets):
            raise ValueError(f"checkpoint has {len(state['buckets'])} buckets, this optimizer {len(self.buckets)}")
        for saved, bucket in zip(state["buckets"], self.buckets):
            if tuple(saved["numels"]) != bucket.layout.numels:
                raise ValueError(f"bucket {bucket.key}: checkpoint parameter sizes differ from this model's")
        synchronize(self.device)  # the masters are about to be overwritten on the host
        self.precision.load_state_dict(state["precision"])
        for group, saved in zip(self.param_groups, state["param_groups"]):
            group.update(saved)
        for saved, bucket in zip(state["buckets"], self.buckets):
            master = self.inner.load_state_dict(bucket.key, saved["state"])
            self._write_params(bucket, master)
            self.inner.release(bucket.key)
        self._after_step()
        self.tier.flush()
