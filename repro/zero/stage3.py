"""Stage 3, P_os+g+p (ZeRO sec. 5.3): partition the parameters too.

Each rank stores only its 1/N_d shard of every parameter, so the model states fall to (2 + 2 + K) psi / N_d.
Module hooks gather a module's parameters just before its forward, free them just after, gather them again when
the gradient of the module's output arrives (before its backward) and free them once all of their gradients
have been reduce-scattered. The parameters are all-gathered twice (forward, backward) and the gradients
reduce-scattered once: 3 psi per step, 1.5x plain DP (ZeRO sec. 7.2.2).

Parameters may live on a slower tier (ZeRO-Infinity: ``param_tier`` = cpu or nvme); the fp32 master weights and
optimizer states on theirs (``optimizer_tier``). On a GPU the gathers run on a side stream (param_units.py), so the
next module's parameters arrive while this one computes. A parameter that a module uses outside its own forward (GPT's
output layer reuses the word embedding) is registered as *external* to the module whose forward uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

from repro.zero.buckets import Bucket, param_numel
from repro.zero.ledger import Item
from repro.zero.offload.tiers import ResidentTier, Tier
from repro.zero.param_units import ParamUnit, PrefetchTrace, UnitGatherer, param_key, released_placeholder
from repro.zero.partition import flat_layout, group_into_buckets
from repro.zero.saved_params import SavedParameterViews
from repro.zero.stage2 import ZeroStage2

if TYPE_CHECKING:
    from repro.zero.construction import BlockMaterializer


#: the method a module defines to tell stage 3 which of its sub-modules use parameters that another sub-module owns
EXTERNAL_PARAMETERS_METHOD = "zero_external_parameters"


def default_external_parameters(module: nn.Module) -> dict[nn.Module, list[nn.Parameter]]:
    """What ``module`` declares through its ``zero_external_parameters()`` method, else none. A parameter used
    outside the sub-module that owns it (a tied output layer, as in GPT and BERT) must be gathered for that user
    too; stage 3 works on any ``nn.Module`` and knows no model class, so the model says it."""
    declared = getattr(module, EXTERNAL_PARAMETERS_METHOD, None)
    return dict(declared()) if callable(declared) else {}


class ZeroStage3(ZeroStage2):
    """``ZeroStage3(model, dp_group=..., lr=...)``: partitions ``model``'s parameters (all of them by default)."""

    stage = 3

    def __init__(
        self,
        module: nn.Module,
        params: Iterable[nn.Parameter] | Iterable[dict] | None = None,
        *,
        param_tier: Tier | None = None,
        external_parameters: Mapping[nn.Module, Sequence[nn.Parameter]] | None = None,
        prefetch: bool = True,
        prefetch_numel: int | None = None,
        materializer: "BlockMaterializer | None" = None,
        **kwargs: Any,
    ) -> None:
        self.module = module
        self.materializer = materializer
        first = next(module.parameters())
        self.param_tier = param_tier if param_tier is not None else ResidentTier("device", first.device)
        self.units: list[ParamUnit] = []
        self.trace = PrefetchTrace() if prefetch else None
        kwargs.setdefault("param_names", list(module.named_parameters()))
        super().__init__(module.parameters() if params is None else params, **kwargs)
        if self.materializer is not None:
            self.materializer.finish()  # every block built (the RNG ends where the unpartitioned model's does)
        self.gatherer = UnitGatherer(
            dp_group=self.dp_group, param_tier=self.param_tier, dtype=self.precision.dtype, device=self.device,
            transient=self.transient, max_ahead_numel=prefetch_numel,
        )
        self.param_tier.flush()
        self._bucket_units = {bucket.index: unit for unit in self.units for bucket in unit.buckets}
        external = default_external_parameters(module) if external_parameters is None else external_parameters
        self._units_of: dict[nn.Module, list[ParamUnit]] = {unit.module: [unit] for unit in self.units}
        unit_of_param = {id(p): unit for unit in self.units for b in unit.buckets for p in b.params}
        for user, used in external.items():
            extra = [unit_of_param[id(p)] for p in used if id(p) in unit_of_param]
            self._units_of.setdefault(user, [])
            self._units_of[user] += [u for u in dict.fromkeys(extra) if u not in self._units_of[user]]
        # autograd must save references to gathered buffers, not the buffers (saved_params.py)
        self.saved_views = SavedParameterViews(lambda: (b for u in self.units if u.gathered for b in u.buckets))
        self._handles = [module.register_forward_pre_hook(self.saved_views.enter),
                         module.register_forward_hook(self.saved_views.exit, always_call=True)]
        for user in self._units_of:
            self._handles.append(user.register_forward_pre_hook(self._pre_forward))
            self._handles.append(user.register_forward_hook(self._post_forward))

    # -- layout: one unit per module; its parameters cut into buckets by group and at most bucket_numel ---------
    def _build_buckets(self, trainable: list[list[nn.Parameter]], bucket_numel: int) -> list[Bucket]:
        """A bucket is a step sub-group (DeepSpeed's ``sub_group_size``): at most ``bucket_numel`` elements, a
        larger tensor on its own, never spanning modules (a module is gathered as one unit)."""
        group_of = {id(p): g for g, params in enumerate(trainable) for p in params}
        world, rank = self._layout_world()
        buckets: list[Bucket] = []
        seen: set[int] = set()
        for module in self.module.modules():
            mine = [p for p in module.parameters(recurse=False) if id(p) in group_of and id(p) not in seen]
            if not mine:
                continue
            seen.update(id(p) for p in mine)
            unit = ParamUnit(len(self.units), module, [])
            for group in sorted({group_of[id(p)] for p in mine}):
                in_group = [p for p in mine if group_of[id(p)] == group]
                for indices in group_into_buckets([param_numel(p) for p in in_group], bucket_numel):
                    chosen = [in_group[i] for i in indices]
                    names = [self._names.get(id(p), f"param{id(p)}") for p in chosen]
                    bucket = Bucket(len(buckets), group, chosen, names,
                                    flat_layout([param_numel(p) for p in chosen], world), rank)
                    buckets.append(bucket)
                    unit.buckets.append(bucket)
            self.units.append(unit)
        missing = [self._names.get(id(p), str(tuple(p.shape))) for g in trainable for p in g if id(p) not in seen]
        if missing:
            raise ValueError(f"stage 3 partitions the parameters of the module it wraps; {missing} are not in it")
        return buckets

    def _init_params(self, bucket: Bucket) -> None:
        """Keep this rank's shard of the bucket in the parameter tier. A model built partitioned (construction.py)
        has placeholders for parameters: the materializer builds their block now, in construction order."""
        values = bucket.params if self.materializer is None else [self.materializer.value(n) for n in bucket.names]
        full = bucket.flatten(values, dtype=self.precision.dtype, device=self.device)
        lo, hi = bucket.shard_range
        self.param_tier.create(param_key(bucket), full[lo:hi].clone())
        del full, values
        for param in bucket.params:
            param.data = released_placeholder(param)

    @property
    def shares_master(self) -> bool:
        """fp32 with parameters and optimizer states on one tier: the master weights are the parameter shard, as
        on a resident tier, so an NVMe run stores them once (ZeRO-Infinity sec. 5: 16 bytes per parameter)."""
        return self.param_tier is self.tier and self.precision.dtype == torch.float32

    def _add_subgroup(self, bucket: Bucket) -> None:
        if self.shares_master:
            self.inner.adopt(bucket.key, param_key(bucket), bucket.layout.shard_numel, self._hparams(bucket))
        else:
            super()._add_subgroup(bucket)

    def _master_source(self, bucket: Bucket) -> torch.Tensor:
        shard = self.param_tier.fetch(param_key(bucket))
        if not isinstance(self.param_tier, ResidentTier):
            shard = shard.clone()
            self.param_tier.release(param_key(bucket))
        return shard

    def _write_params(self, bucket: Bucket, master: torch.Tensor) -> None:
        key = param_key(bucket)
        if self.shares_master:
            return  # the step wrote the master, which is the parameter shard
        if isinstance(self.param_tier, ResidentTier) and self.param_tier.fetch(key).data_ptr() == master.data_ptr():
            return  # fp32: the master weights are the parameter shard
        # The tier converts to the 16-bit dtype where it stores (on the GPU for a pinned host master).
        self.param_tier.writeback(key, master)

    # -- hooks -----------------------------------------------------------------------------------------------
    def _need(self, unit: ParamUnit) -> None:
        """Gather ``unit`` (waiting for it) and start gathering the units that follow it in the trace."""
        upcoming = self.trace.need(unit.index) if self.trace is not None else []
        self.gatherer.need(unit, [self.units[index] for index in upcoming])

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        for unit in self._units_of[module]:
            unit.refcount += 1
            self._need(unit)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        units = self._units_of[module]
        if torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(lambda grad, units=units: self._pre_backward(units))
        for unit in units:
            unit.refcount -= 1
            if unit.refcount <= 0 and not unit.in_backward:
                self.gatherer.release(unit)

    def _pre_backward(self, units: list[ParamUnit]) -> None:
        for unit in units:
            if not unit.in_backward:
                unit.in_backward = True
                self._need(unit)

    def _reduce_bucket(self, bucket: Bucket) -> None:
        """Once all gradients of a unit are on their way to their owners, its full parameters can go."""
        super()._reduce_bucket(bucket)
        unit = self._bucket_units[bucket.index]
        unit.reduced.add(bucket.index)
        # Every bucket of the unit must have been reduced: one whose first gradient has not arrived yet has no
        # flat_grad either, and its parameters are still needed by the rest of this backward.
        if unit.in_backward and len(unit.reduced) == len(unit.buckets):
            self.gatherer.release(unit)

    def release_all(self) -> None:
        """Free every gathered unit (end of a step; also after an evaluation pass), and the spare gather buffers."""
        for unit in self.units:
            if unit.gathered or unit.inflight:
                self.gatherer.release(unit)
            unit.reduced.clear()
        if self.gatherer.pool is not None:
            self.gatherer.pool.clear()

    def _reduce_gradients(self) -> list[torch.Tensor]:
        shards = super()._reduce_gradients()
        self.release_all()
        if self.trace is not None:
            self.trace.end_step()
        return shards

    # -- inspection ------------------------------------------------------------------------------------------
    def _model_items(self) -> Iterator[Item]:
        for bucket in self.buckets:
            key = param_key(bucket)
            if isinstance(self.param_tier, ResidentTier):
                yield "params", self.param_tier.name, self.param_tier.fetch(key)
            else:
                numel, dtype = self.param_tier.stored(key)
                yield "params", self.param_tier.name, numel * torch.empty(0, dtype=dtype).element_size()
        for bucket in self.buckets:
            if bucket.grad_shard is not None:
                yield "grads", self._device_tier(), bucket.grad_shard
        for bucket in self.buckets:
            if bucket.flat_param is not None:
                yield "working_params", self._device_tier(), bucket.flat_param

    def close(self) -> None:
        """Remove the module hooks and the tiers' files."""
        for handle in self._handles:
            handle.remove()
        if self.param_tier is not self.tier:
            self.param_tier.close()
        super().close()


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)
