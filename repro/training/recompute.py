"""Activation recomputation, one checkpoint per transformer layer (Megatron sec. 5; Chen et al. 2016).

Megatron checkpointed after every transformer layer for its large models; the recompute costs a second forward,
which the paper's FLOPs formula counts (96 instead of 72 in ``96 B s l h^2 (...)``). Either wrapper takes the
layer's :class:`~repro.training.weight_casts.WeightCasts` (``casts``): the 16-bit casts of its weights are then made
before the checkpoint and kept as its inputs, so the recomputation does not cast again.
"""

from __future__ import annotations

import functools
import hashlib
import inspect

import torch
from torch.utils.checkpoint import checkpoint

from repro.dist.comm import CommGroup
from repro.tensor_parallel import RNGTracker
from repro.tensor_parallel.partitioned_checkpoint import ACTIVATION_CHECKPOINTS, PartitionedCheckpoint
from repro.training.weight_casts import WeightCasts, call_with


class Checkpointed(torch.nn.Module):
    """A layer whose activations are recomputed in backward instead of kept (one checkpoint per layer).

    ``torch.utils.checkpoint`` replays the default generator for the recomputation (the replicated dropout), but not
    the tensor-parallel region's generator that :class:`RNGTracker` keeps aside (attention dropout). As Megatron's
    ``CheckpointFunction`` does, the tracker's state is saved before the forward, set back for the recomputation and
    restored afterwards, so the recomputed layer draws the same dropout masks and later layers' draws are untouched.
    """

    def __init__(self, layer: torch.nn.Module, rng_tracker: RNGTracker | None = None, *,
                 casts: WeightCasts | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.rng_tracker = rng_tracker
        self.casts = casts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tracker = self.rng_tracker
        casts = self.casts
        values = casts.make() if casts is not None else ()
        if tracker is None:
            return checkpoint(lambda inp, *ws: call_with(self.layer, inp, casts, ws), x, *values,
                              use_reentrant=False)
        forward_state = tracker._state.clone()
        calls = 0

        def run(inp: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
            nonlocal calls
            calls += 1
            if calls == 1:  # the forward itself: advance the tracker as usual
                return call_with(self.layer, inp, casts, weights)
            later_state = tracker._state  # recomputation in backward: replay the forward's draws, then restore
            tracker._state = forward_state.clone()
            try:
                return call_with(self.layer, inp, casts, weights)
            finally:
                tracker._state = later_state

        return checkpoint(run, x, *values, use_reentrant=False)


def _keep_rng_swaps(ctx, op, *args, **kwargs):
    """Selective-checkpoint policy of :class:`CompiledCheckpointed`: the RNG tracker's swap ops (which write the
    generators' states) run once, in the forward, and are never replayed; everything else may be recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if "repro." in str(op) else CheckpointPolicy.PREFER_RECOMPUTE


def _policy_hash() -> str:
    """The selective-checkpoint policy's identity for compile caches: its source (its bytecode and constants where
    the source is not shipped), so that a changed policy misses."""
    try:
        text = inspect.getsource(_keep_rng_swaps).encode()
    except (OSError, TypeError):
        code = _keep_rng_swaps.__code__
        text = code.co_code + repr((code.co_consts, code.co_names)).encode()
    return "repro.training.recompute._keep_rng_swaps:" + hashlib.sha256(text).hexdigest()


_POLICY_HASH = _policy_hash()


class CompiledCheckpointed(torch.nn.Module):
    """A layer and its activation checkpoint compiled as one region (call :meth:`compile` on it; eager is wrong).

    ``checkpoint(compiled layer)`` replays the compiled forward whole in backward: every GEMM, the second FC's
    included, whose output backward never reads. Compiled as one region, the checkpoint becomes a tag on the
    layer's graph and the partitioner recomputes only what the backward graph needs (the second FC's GEMM drops
    out: ``tests/training/test_step_proxies.py`` checks it on the graphs inductor compiles). Random ops are not
    redrawn: the graph saves the generator state each one drew from and replays it, so attention dropout keeps the
    mask it drew from the tensor-parallel generator, and the tracker's swap ops are saved by the policy, not re-run.
    Compiled with ``fullgraph=True``: eagerly the policy would skip the swap while dropout redraws (wrong masks)."""

    def __init__(self, layer: torch.nn.Module, *, casts: WeightCasts | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.casts = casts
        self._compiled = None
        try:
            from torch.utils.checkpoint import create_selective_checkpoint_contexts
        except ImportError:  # torch 2.4: no selective checkpointing, no compiled layers (they need torch >= 2.5)
            self._context_fn = None
            return
        # made here, not in the compiled region (dynamo cannot set an attribute there): the policy's name for
        # AOTAutograd's cache (torch's newer versions read it, older ones ignore it); without it every compile of this
        # region is traced and partitioned anew ("SAC context_fn does not have a cache_hash attribute")
        self._context_fn = functools.partial(create_selective_checkpoint_contexts, _keep_rng_swaps)
        self._context_fn.cache_hash = _POLICY_HASH

    def _checkpointed(self, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda inp, *ws: call_with(self.layer, inp, self.casts, ws), x, *weights, use_reentrant=False,
                          context_fn=self._context_fn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.casts is None:
            return self._checkpointed(x)
        # the casts are made outside the compiled region (their backward writes into the flat gradients) and
        # enter it as inputs of the checkpoint, which keeps them for the recomputation
        run = self._compiled if self._compiled is not None else self._checkpointed
        return run(x, *self.casts.make())

    def compile(self, **kwargs) -> None:  # noqa: D102 - nn.Module.compile, whole graph only
        if self.casts is None:
            super().compile(fullgraph=True, **kwargs)
        else:
            self._compiled = torch.compile(self._checkpointed, fullgraph=True, **kwargs)


def checkpoint_layers(layers: torch.nn.ModuleList, mode: str, tp_group: CommGroup,
                      rng_tracker: RNGTracker | None = None) -> None:
    """Wrap every layer of ``layers`` in place with one activation checkpoint of ``mode``: ``replicated``
    (Megatron's: every tp rank keeps the whole layer input), ``partitioned`` (ZeRO-R's P_a: a ``1/tp`` slice per
    rank) or ``partitioned_cpu`` (P_a+cpu: the slice in host memory)."""
    if mode not in ACTIVATION_CHECKPOINTS:
        raise ValueError(f"activation checkpoints {mode!r} must be one of {', '.join(ACTIVATION_CHECKPOINTS)}")
    for index, layer in enumerate(layers):
        if mode == "replicated":
            layers[index] = Checkpointed(layer, rng_tracker)
        else:
            layers[index] = PartitionedCheckpoint(layer, tp_group, offload=mode == "partitioned_cpu",
                                                  rng_tracker=rng_tracker)
