"""Stage 2, P_os+g (ZeRO sec. 5.2): partition the gradients too.

A rank only ever uses the reduced gradient of its own shard, so the full gradient need not outlive the moment it
is produced. As soon as every gradient of a bucket has arrived during backward (a post-accumulate-grad hook per
parameter), the bucket is reduce-scattered into its owners' shards and its full buffer is freed. Per-rank model
states fall to 2 psi + (2 + K) psi / N_d; the traffic is unchanged at 2 psi (sec. 7.2.1), and the reduce-scatter
of one bucket overlaps with the backward of the next.

Gradient accumulation over micro-batches adds each backward's reduced shard to the previous ones. On the CPU the flat
buffers (and shards a subclass hands back) are reused within a backward (``gather_buffers.py``): a fresh one would
cost a page fault and a kernel zero-fill per page.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn

from repro.dist import comm
from repro.zero.buckets import Bucket
from repro.zero.gather_buffers import GatherBufferPool
from repro.zero.ledger import Item, tensor_bytes
from repro.zero.stage0 import MAX_BUCKETS_IN_FLIGHT
from repro.zero.stage1 import ZeroStage1


class ZeroStage2(ZeroStage1):
    stage = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inflight: list[tuple[Bucket, torch.Tensor, torch.Tensor, Any]] = []
        self.grad_pool: GatherBufferPool | None = None  # CPU only, made on first use
        super().__init__(*args, **kwargs)

    def _grad_buffer(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised gradient buffer: on the CPU a released one of that size if any (gather_buffers.py)."""
        if device.type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        if self.grad_pool is None or self.grad_pool.dtype != dtype:
            self.grad_pool = GatherBufferPool(dtype=dtype, device=device, max_per_size=MAX_BUCKETS_IN_FLIGHT + 2)
        return self.grad_pool.take(numel)

    def _give_back(self, buffer: torch.Tensor) -> None:
        """``buffer`` is no longer used: the next gradient buffer of its size may reuse it."""
        if self.grad_pool is not None and buffer.device.type == "cpu" and buffer.dtype == self.grad_pool.dtype:
            self.grad_pool.give(buffer)

    def _init_grads(self, bucket: Bucket) -> None:
        for index, param in enumerate(bucket.params):
            param.grad = None
            self._slots[id(param)] = (bucket, index)
            param.register_post_accumulate_grad_hook(self._on_grad)

    # -- backward: collect a bucket, reduce-scatter it, free it --------------------------------------------
    def _on_grad(self, param: nn.Parameter) -> None:
        bucket, index = self._slots[id(param)]
        if bucket.flat_grad is None:
            bucket.flat_grad = self._grad_buffer(bucket.layout.padded_numel, param.grad.dtype, param.grad.device)
            bucket.flat_grad.zero_()
            self.transient.add("comm_buffers", tensor_bytes(bucket.flat_grad))
        bucket.param_view(bucket.flat_grad, index).add_(param.grad)
        param.grad = None
        bucket.arrived.add(index)
        if len(bucket.arrived) == len(bucket.params):
            self._reduce_bucket(bucket)

    def _reduce_bucket(self, bucket: Bucket) -> None:
        flat, bucket.flat_grad = bucket.flat_grad, None
        bucket.arrived.clear()
        shard = self._grad_buffer(bucket.layout.shard_numel, flat.dtype, flat.device)
        self.transient.add("comm_buffers", tensor_bytes(shard))
        work = comm.reduce_scatter_tensor(shard, flat, self.dp_group, async_op=True)
        self._inflight.append((bucket, flat, shard, work))
        while len(self._inflight) > MAX_BUCKETS_IN_FLIGHT:
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        bucket, flat, shard, work = self._inflight.pop(0)
        if work is not None:
            work.wait()
        self.transient.remove("comm_buffers", tensor_bytes(flat) + tensor_bytes(shard))
        if bucket.grad_shard is None:
            bucket.grad_shard = shard
        else:
            bucket.grad_shard.add_(shard)
            self._give_back(shard)
        self._give_back(flat)
        self._bucket_reduced(bucket)

    def _bucket_reduced(self, bucket: Bucket) -> None:
        """Hook for stage 3 (release the bucket's parameters)."""

    def finish_backward(self) -> None:
        """Reduce buckets whose gradients are incomplete (unused parameters count as zero) and wait for all."""
        for bucket in self.buckets:
            if bucket.flat_grad is not None:
                self._reduce_bucket(bucket)
        while self._inflight:
            self._complete_oldest()
        if self.grad_pool is not None:
            self.grad_pool.clear()  # nothing held between backward passes

    def _reduce_gradients(self) -> list[torch.Tensor]:
        self.finish_backward()
        shards = []
        for bucket in self.buckets:
            if bucket.grad_shard is None:  # no gradient arrived at all this step
                bucket.grad_shard = torch.zeros(
                    bucket.layout.shard_numel, dtype=self.precision.dtype, device=self.device)
            shards.append(bucket.grad_shard)
        self._shard_bytes = 0  # the shards are the gradients themselves, not a transient buffer
        return shards

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.finish_backward()
        for bucket in self.buckets:
            if set_to_none:
                bucket.grad_shard = None
            elif bucket.grad_shard is not None:
                bucket.grad_shard.zero_()
            for param in bucket.params:
                param.grad = None

    def _model_items(self) -> Iterator[Item]:
        for bucket in self.buckets:
            if bucket.flat_param is not None:
                yield "params", self._device_tier(), bucket.flat_param
        for bucket in self.buckets:
            if bucket.grad_shard is not None:
                yield "grads", self._device_tier(), bucket.grad_shard
