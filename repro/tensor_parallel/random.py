"""RNG for dropout under tensor parallelism (Megatron sec. 3, last paragraph).

Outside tensor-parallel regions activations are replicated, so dropout must draw the *same* mask on every tp rank:
the default generator is seeded identically there. Inside regions (e.g. attention probabilities, whose heads are
split across ranks) each rank holds different data and must draw *different* masks: :meth:`RNGTracker.fork`
swaps in a per-tp-rank generator state for the duration of the block.

Compiled layers use :meth:`RNGTracker.enter` and :meth:`RNGTracker.leave` instead: the same swap as two custom ops
(:mod:`repro.tensor_parallel.rng_ops`) that dynamo traces into the layer's one graph, where a Python
``get_rng_state``/``set_rng_state`` would break it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from repro.optional import torch_version
from repro.tensor_parallel import rng_ops

TENSOR_PARALLEL_SEED_OFFSET = 2718  # any constant works; Megatron uses this one

#: Whether torch.compile can keep the swap ops in the layer's graph. torch 2.4's AOTAutograd cannot (it clones the
#: generator-state buffers the ops write outside its fake mode: "Please convert all Tensors to FakeTensors"), so
#: there the ops run outside the graph (a graph break on each side: the same states, the same masks).
#: the torch from which compiled transformer layers work (the trainer refuses ``compile_layers`` below it)
COMPILED_LAYERS_TORCH = (2, 5)
OPS_IN_GRAPH = torch_version() >= COMPILED_LAYERS_TORCH


def _rng_enter(like: torch.Tensor, load: torch.Tensor, save: torch.Tensor, device: str) -> torch.Tensor:
    return torch.ops.repro.rng_enter(like, load, save, device)


def _rng_leave(after: torch.Tensor, load: torch.Tensor, save: torch.Tensor, device: str) -> None:
    torch.ops.repro.rng_leave(after, load, save, device)


if not OPS_IN_GRAPH:
    _rng_enter = torch._dynamo.disable(_rng_enter)
    _rng_leave = torch._dynamo.disable(_rng_leave)


@dataclass
class RNGTracker:
    """Holds the saved RNG state of the tensor-parallel region (CPU or CUDA, chosen by ``device``)."""

    seed: int
    tp_rank: int
    device: str = "cpu"
    _state: torch.Tensor | None = field(default=None, repr=False)
    #: Where :meth:`enter` keeps the replicated generator's state until :meth:`leave` (a buffer the ops write).
    _outside: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def _get(self) -> torch.Tensor:
        return rng_ops.get_state(self.device)

    def _set(self, state: torch.Tensor) -> None:
        rng_ops.set_state(self.device, state)

    def reset(self) -> None:
        outside = self._get()
        region_seed = self.seed + TENSOR_PARALLEL_SEED_OFFSET + self.tp_rank
        if self.device == "cuda":
            torch.cuda.manual_seed(region_seed)
        else:
            torch.manual_seed(region_seed)
        self._state = self._get()
        self._outside = torch.empty_like(self._state)
        self._set(outside)

    def enter(self, anchor: torch.Tensor) -> torch.Tensor:
        """Swap in the region's generator; return ``anchor`` plus a zero that only exists after the swap, so that
        the region's random op runs after it when it consumes the result (pass a small tensor it depends on, such
        as a projection's bias: the same values, gradients pass through). Pair with :meth:`leave`. Traceable."""
        zero = _rng_enter(anchor.detach(), self._state, self._outside, self.device)
        # eagerly, program order is the order: the addition (a kernel launch) only matters to a graph
        return anchor + zero if torch.compiler.is_compiling() else anchor

    def leave(self, after: torch.Tensor) -> None:
        """Once ``after`` (the region's output) exists, keep the region's state and restore the replicated one."""
        _rng_leave(after.detach(), self._outside, self._state, self.device)

    @contextlib.contextmanager
    def fork(self):
        """Run the block with the tensor-parallel region's generator, then restore the replicated one."""
        outside = self._get()
        self._set(self._state)
        try:
            yield
        finally:
            self._state = self._get()
            self._set(outside)


def seed_everything(seed: int, tp_rank: int = 0, device: str = "cpu") -> RNGTracker:
    """Seed the replicated generator identically on all ranks and return the tracker for parallel regions."""
    torch.manual_seed(seed)
    if device == "cuda":
        torch.cuda.manual_seed(seed)
    return RNGTracker(seed=seed, tp_rank=tp_rank, device=device)
