"""Activation recomputation, one checkpoint per transformer layer (Megatron sec. 5; Chen et al. 2016).

Megatron checkpointed after every transformer layer for its large models; the recompute costs a second forward,
which the paper's FLOPs formula counts (96 instead of 72 in ``96 B s l h^2 (...)``).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from repro.dist.comm import CommGroup
from repro.tensor_parallel import RNGTracker
from repro.tensor_parallel.partitioned_checkpoint import ACTIVATION_CHECKPOINTS, PartitionedCheckpoint


class _Checkpointed(torch.nn.Module):
    """A layer whose activations are recomputed in backward instead of kept (one checkpoint per layer).

    ``torch.utils.checkpoint`` replays the default generator for the recomputation (the replicated dropout), but not
    the tensor-parallel region's generator that :class:`RNGTracker` keeps aside (attention dropout). As Megatron's
    ``CheckpointFunction`` does, the tracker's state is saved before the forward, set back for the recomputation and
    restored afterwards, so the recomputed layer draws the same dropout masks and later layers' draws are untouched.
    """

    def __init__(self, layer: torch.nn.Module, rng_tracker: RNGTracker | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.rng_tracker = rng_tracker

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tracker = self.rng_tracker
        if tracker is None:
            return checkpoint(self.layer, x, use_reentrant=False)
        forward_state = tracker._state.clone()
        calls = 0

        def run(inp: torch.Tensor) -> torch.Tensor:
            nonlocal calls
            calls += 1
            if calls == 1:  # the forward itself: advance the tracker as usual
                return self.layer(inp)
            later_state = tracker._state  # recomputation in backward: replay the forward's draws, then restore
            tracker._state = forward_state.clone()
            try:
                return self.layer(inp)
            finally:
                tracker._state = later_state

        return checkpoint(run, x, use_reentrant=False)


def checkpoint_layers(layers: torch.nn.ModuleList, mode: str, tp_group: CommGroup,
                      rng_tracker: RNGTracker | None = None) -> None:
    """Wrap every layer of ``layers`` in place with one activation checkpoint of ``mode``: ``replicated``
    (Megatron's: every tp rank keeps the whole layer input), ``partitioned`` (ZeRO-R's P_a: a ``1/tp`` slice per
    rank) or ``partitioned_cpu`` (P_a+cpu: the slice in host memory)."""
    if mode not in ACTIVATION_CHECKPOINTS:
        raise ValueError(f"activation checkpoints {mode!r} must be one of {', '.join(ACTIVATION_CHECKPOINTS)}")
    for index, layer in enumerate(layers):
        if mode == "replicated":
            layers[index] = _Checkpointed(layer, rng_tracker)
        else:
            layers[index] = PartitionedCheckpoint(layer, tp_group, offload=mode == "partitioned_cpu",
                                                  rng_tracker=rng_tracker)
