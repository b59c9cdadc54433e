"""Stage 3 with the gradients on a tier too, and a step that streams sub-groups from the tiers (ZeRO-Infinity).

ZeRO-Infinity sec. 5 puts every model state on NVMe: parameters (read just in time by stage 3's gathers),
optimizer states, and the gradients, which would otherwise be psi x 4 bytes of fp32 in memory waiting for the
step. This class adds that one idea to :class:`ZeroStage3`: when a bucket's gradient shard has been
reduce-scattered (stage 2's hook), it is written to ``grad_tier`` and freed; micro-batches accumulate by read, add,
write. The step is DeepSpeed's stage-3 loop over sub-groups (its ``sub_group_size``, our buckets): while sub-group
i is updated, the reads of sub-group i + 1 (master, moments, gradient) are in flight and the writes of sub-group
i - 1 drain, so reads, the Adam update and writes overlap (ZeRO-Infinity sec. 6.2, "overlap-centric design").
Memory holds two sub-groups and the writes in flight, never the model.

With fp32 parameters and the optimizer on the parameters' tier the master weights are the parameter shard
(``ZeroStage3.shares_master``): 4 bytes of parameters + 8 of moments + 4 of gradients = 16 bytes per parameter on
disk, the paper's accounting.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch
from torch import nn

from repro.zero.buckets import Bucket
from repro.zero.grad_norm import scale_
from repro.zero.ledger import Item
from repro.zero.offload.tiers import Tier
from repro.zero.stage3 import ZeroStage3


def grad_key(bucket: Bucket) -> str:
    return f"{bucket.key}.grad"


class ZeroInfinityStage3(ZeroStage3):
    """``ZeroInfinityStage3(model, grad_tier=NvmeTier(...), param_tier=..., optimizer_tier=..., dp_group=...)``."""

    def __init__(self, module: nn.Module, params: Iterable[nn.Parameter] | Iterable[dict] | None = None, *,
                 grad_tier: Tier, **kwargs: Any) -> None:
        self.grad_tier = grad_tier
        self._grad_files: set[int] = set()  # buckets with a gradient file (created once, reused every step)
        self._grads_stored: set[int] = set()  # buckets whose gradient of this step is in the tier
        super().__init__(module, params, **kwargs)

    # -- backward: each reduced gradient shard goes to the tier -------------------------------------------------
    def _bucket_reduced(self, bucket: Bucket) -> None:
        shard, bucket.grad_shard = bucket.grad_shard, None
        key = grad_key(bucket)
        if bucket.index in self._grads_stored:  # a later micro-batch: accumulate into the stored gradient
            stored = self.grad_tier.fetch(key)
            stored.add_(shard)
            self.grad_tier.writeback(key, stored)
        elif bucket.index in self._grad_files:
            self.grad_tier.writeback(key, shard)
        else:
            self.grad_tier.create(key, shard)
            self._grad_files.add(bucket.index)
        self._grads_stored.add(bucket.index)
        self._give_back(shard)  # the tier copied it: the next reduce-scatter may write into it

    def _stored_grads(self) -> Iterator[torch.Tensor]:
        """Every bucket's gradient shard, read one at a time (for the clipping norm and the fp16 overflow check)."""
        for i, bucket in enumerate(self.buckets):
            if i + 1 < len(self.buckets) and self.buckets[i + 1].index in self._grads_stored:
                self.grad_tier.prefetch(grad_key(self.buckets[i + 1]))
            yield self._grad(bucket)
            self.grad_tier.release(grad_key(bucket))

    def _grad(self, bucket: Bucket) -> torch.Tensor:
        if bucket.index not in self._grads_stored:  # no gradient arrived this step: it is zero
            return torch.zeros(bucket.layout.shard_numel, dtype=self.precision.dtype, device=self.device)
        return self.grad_tier.fetch(grad_key(bucket))

    def _prefetch_subgroup(self, bucket: Bucket) -> None:
        self.inner.prefetch(bucket.key)
        if bucket.index in self._grads_stored:
            self.grad_tier.prefetch(grad_key(bucket))

    # -- the step: sub-group by sub-group from the tiers -----------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer API
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.finish_backward()
        self.release_all()
        if self.trace is not None:
            self.trace.end_step()
        factor, skip = self._scale_factor(self._stored_grads())
        if skip:
            self._after_step()
            self.zero_grad()
            return loss
        if self.buckets:
            self._prefetch_subgroup(self.buckets[0])
        for i, bucket in enumerate(self.buckets):
            if i + 1 < len(self.buckets):
                self._prefetch_subgroup(self.buckets[i + 1])
            grad = self._grad(bucket)
            grad = grad if grad.dtype == torch.float32 else grad.float()
            scale_(grad, factor)  # the fetched buffer is scratch: the stored gradient is not written back
            master = self.inner.step(bucket.key, grad, self._hparams(bucket))
            self._write_params(bucket, master)
            self.inner.release(bucket.key)
            if bucket.index in self._grads_stored:
                self.grad_tier.release(grad_key(bucket))
        self._after_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients in the tier are forgotten (their files are overwritten next step)."""
        super().zero_grad(set_to_none)
        self._grads_stored.clear()

    # -- inspection ----------------------------------------------------------------------------------------
    def _model_items(self) -> Iterator[Item]:
        yield from super()._model_items()
        for bucket in self.buckets:
            if bucket.index in self._grads_stored:
                numel, dtype = self.grad_tier.stored(grad_key(bucket))
                yield "grads", self.grad_tier.name, numel * torch.empty(0, dtype=dtype).element_size()

    def close(self) -> None:
        self.grad_tier.close()
        super().close()
