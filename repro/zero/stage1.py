"""Stage 1, P_os (ZeRO sec. 5.1): partition the optimizer states.

Each of the N_d ranks keeps the fp32 master weights and Adam moments of 1/N_d of every bucket, so the optimizer
part of the model states falls from K psi to K psi / N_d bytes (per-rank total 4 psi + K psi / N_d). One idea is
added to stage 0: since a rank only updates its shard, it needs only its shard of the averaged gradient (a
reduce-scatter instead of an all-reduce), and after the update the shards are all-gathered back into the full
16-bit parameters. Reduce-scatter + all-gather move psi + psi elements per rank, the 2 psi of plain DP
(ZeRO sec. 7.2.1), where DeepSpeed's stage 1 all-reduces the whole gradient and then all-gathers (3 psi).

Usable on its own as an optimizer wrapper, e.g. over the data-parallel group of a 3-D grid:

    optimizer = ZeroStage1(model.parameters(), dp_group=groups.dp, lr=1e-4, weight_decay=0.1)
"""

from __future__ import annotations

import torch

from repro.dist import comm
from repro.zero.buckets import Bucket
from repro.zero.ledger import tensor_bytes
from repro.zero.stage0 import DataParallelOptimizer, bound_inflight


class ZeroStage1(DataParallelOptimizer):
    stage = 1

    def _layout_world(self) -> tuple[int, int]:
        return self.dp_group.size, self.dp_group.rank

    def _reduce_gradients(self) -> list[torch.Tensor]:
        """Reduce-scatter every bucket's full gradient into this rank's shard (issued together, then awaited)."""
        shards, works = [], []
        for bucket in self.buckets:
            self._point_grads(bucket)
            shard = torch.empty(bucket.layout.shard_numel, dtype=bucket.flat_grad.dtype, device=self.device)
            self.transient.add("comm_buffers", tensor_bytes(shard))
            works.append(comm.reduce_scatter_tensor(shard, bucket.flat_grad, self.dp_group, async_op=True))
            shards.append(shard)
            bound_inflight(works)
        bound_inflight(works, 0)
        self._shard_bytes = sum(tensor_bytes(s) for s in shards)
        return shards

    def _write_params(self, bucket: Bucket, master: torch.Tensor) -> None:
        """Write the updated shard into the flat parameters and start the all-gather that completes them."""
        super()._write_params(bucket, master)
        lo, hi = bucket.shard_range
        self._pending.append(
            comm.all_gather_into_tensor(bucket.flat_param, bucket.flat_param[lo:hi], self.dp_group, async_op=True)
        )
        bound_inflight(self._pending)

    def _after_step(self) -> None:
        super()._after_step()
        self.transient.remove("comm_buffers", getattr(self, "_shard_bytes", 0))
        self._shard_bytes = 0
