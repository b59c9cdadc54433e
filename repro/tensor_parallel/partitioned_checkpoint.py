"""ZeRO-R's partitioned activation checkpointing, P_a and P_a+cpu (Rajbhandari et al. 2019, sec. 6.1 and 8).

Under Megatron-LM's tensor parallelism a transformer layer's input is *replicated*: after the row-parallel output
all-reduce every tp rank holds the same ``[b, s, h]`` activations. One activation checkpoint per layer (Megatron's
setting for large models) therefore keeps ``tp`` identical copies, one per rank. P_a removes the redundancy: each
rank keeps only its ``1/tp`` slice of the (flattened) layer input, and just before the layer is recomputed in
backward one all-gather over the tp group rebuilds the input. Per layer that is one all-gather of ``b s h``
elements beside Megatron's all-reduces of ``12 b s h`` (sec. 8: the extra communication is under 10 %; the closed
form is ``repro.perfmodel.zero_residual.pa_overhead_fraction``), and the checkpoints of ``L`` layers take
``L b s h / tp`` elements per rank instead of ``L b s h`` (sec. 6.1: the 100B model's 33 GB become about 2 GB at
MP 16).

P_a+cpu (``offload=True``) moves the slice to host memory after the forward (pinned, copied asynchronously on a
GPU) and back before the all-gather, so the checkpoints take no device memory at all (sec. 6.1; sec. 8: twice the
data movement of P_a, over PCIe).

The recomputation replays the forward exactly: the default generator (and on a GPU the device generator), the
tensor-parallel region's generator of :class:`~repro.tensor_parallel.random.RNGTracker` and the autocast state are
set back to what the forward saw, and restored afterwards, as Megatron's ``CheckpointFunction`` does. The
function is reentrant: the layer's parameter gradients are accumulated by an inner backward, so gradient hooks
(ZeRO's reduce-scatter buckets) fire as they would without the checkpoint.

The slow obvious reference is ``torch.utils.checkpoint`` on the replicated input
(:class:`repro.training.recompute.Checkpointed`); the tests compare outputs and every gradient with it.
"""

from __future__ import annotations

import contextlib
import torch
from torch import nn

from repro.dist.comm import CommGroup, all_gather_into_tensor
from repro.tensor_parallel.random import RNGTracker


def slice_of(x: torch.Tensor, group: CommGroup) -> torch.Tensor:
    """This rank's ``1/tp`` slice of ``x`` flattened (the last rank's slice padded with zeros to equal length)."""
    flat = x.reshape(-1)
    chunk = -(-flat.numel() // group.size)
    out = torch.zeros(chunk, dtype=x.dtype, device=x.device)
    start = group.rank * chunk
    piece = flat[start:start + chunk]
    out[: piece.numel()].copy_(piece)
    return out


def gather_slices(piece: torch.Tensor, shape: torch.Size, group: CommGroup) -> torch.Tensor:
    """The whole tensor of ``shape`` from every rank's :func:`slice_of` (one all-gather of the group)."""
    flat = torch.empty(piece.numel() * group.size, dtype=piece.dtype, device=piece.device)
    all_gather_into_tensor(flat, piece, group)
    return flat[: shape.numel()].view(shape)


class _RandomState:
    """The generators a layer's forward draws from (and the autocast state it ran under), to replay it."""

    def __init__(self, device: torch.device, tracker: RNGTracker | None) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.tracker = tracker
        self.region = tracker._state.clone() if tracker is not None and tracker._state is not None else None
        self.autocast = torch.is_autocast_enabled(device.type)
        self.autocast_dtype = torch.get_autocast_dtype(device.type)

    @contextlib.contextmanager
    def replay(self):
        """Run a block with the forward's generator states; every generator is set back afterwards."""
        cpu, cuda = torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.cuda is not None else None
        region = self.tracker._state if self.tracker is not None else None
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        if self.region is not None:
            self.tracker._state = self.region.clone()
        try:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast):
                yield
        finally:
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, self.device)
            if self.tracker is not None:
                self.tracker._state = region


class _PartitionedCheckpointFunction(torch.autograd.Function):
    """Forward without a graph keeping a slice of the input; backward gathers, recomputes, back-propagates."""

    @staticmethod
    def forward(ctx, module: "PartitionedCheckpoint", _anchor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.module, ctx.shape, ctx.device = module, x.shape, x.device
        ctx.random = _RandomState(x.device, module.rng_tracker)
        with torch.no_grad():
            y = module.layer(x)
        piece = slice_of(x.detach(), module.tp_group)
        if module.offload:
            host = torch.empty(piece.shape, dtype=piece.dtype, pin_memory=piece.is_cuda)
            piece = host.copy_(piece, non_blocking=piece.is_cuda)
        ctx.piece = piece
        module.saved_elements = piece.numel()
        module.saved_device = piece.device.type
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        module = ctx.module
        piece, ctx.piece = ctx.piece, None
        x = gather_slices(piece.to(ctx.device, non_blocking=True), ctx.shape, module.tp_group)
        x = x.detach().requires_grad_(True)
        with ctx.random.replay(), torch.enable_grad():
            y = module.layer(x)
        torch.autograd.backward(y, dy)
        return None, None, x.grad


class PartitionedCheckpoint(nn.Module):
    """``PartitionedCheckpoint(layer, tp_group, offload=False, rng_tracker=None)``: ``layer(x)`` with one activation
    checkpoint, partitioned over ``tp_group`` (P_a) and with ``offload=True`` kept in host memory (P_a+cpu).

    ``layer`` maps a replicated ``[b, s, h]`` tensor to one of the same shape (a transformer layer under tensor
    parallelism). After a forward, ``saved_elements`` is the checkpoint slice this rank keeps and
    ``saved_device`` where it lives.
    """

    def __init__(self, layer: nn.Module, tp_group: CommGroup, *, offload: bool = False,
                 rng_tracker: RNGTracker | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.tp_group = tp_group
        self.offload = offload
        self.rng_tracker = rng_tracker
        self.saved_elements = 0
        self.saved_device = ""
        # backward is only called for a node with an input that requires grad: the anchor makes it one even when
        # ``x`` does not (the first layer of a model whose embedding is frozen)
        self.register_buffer("_anchor", torch.empty(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.layer(x)
        anchor = self._anchor.detach().requires_grad_(True)
        return _PartitionedCheckpointFunction.apply(self, anchor, x)


#: One activation checkpoint per layer, of three kinds (ZeRO Table 3: C1/C3 replicated, C2/C4 P_a, C5 P_a+cpu).
ACTIVATION_CHECKPOINTS = ("replicated", "partitioned", "partitioned_cpu")
