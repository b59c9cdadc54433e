"""RNG for dropout under tensor parallelism (Megatron sec. 3, last paragraph).

Outside tensor-parallel regions activations are replicated, so dropout must draw the *same* mask on every tp rank:
the default generator is seeded identically there. Inside regions (e.g. attention probabilities, whose heads are
split across ranks) each rank holds different data and must draw *different* masks: :meth:`RNGTracker.fork`
swaps in a per-tp-rank generator state for the duration of the block.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

TENSOR_PARALLEL_SEED_OFFSET = 2718  # any constant works; Megatron uses this one


@dataclass
class RNGTracker:
    """Holds the saved RNG state of the tensor-parallel region (CPU or CUDA, chosen by ``device``)."""

    seed: int
    tp_rank: int
    device: str = "cpu"
    _state: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def _get(self) -> torch.Tensor:
        return torch.cuda.get_rng_state() if self.device == "cuda" else torch.get_rng_state()

    def _set(self, state: torch.Tensor) -> None:
        if self.device == "cuda":
            torch.cuda.set_rng_state(state)
        else:
            torch.set_rng_state(state)

    def reset(self) -> None:
        outside = self._get()
        region_seed = self.seed + TENSOR_PARALLEL_SEED_OFFSET + self.tp_rank
        if self.device == "cuda":
            torch.cuda.manual_seed(region_seed)
        else:
            torch.manual_seed(region_seed)
        self._state = self._get()
        self._set(outside)

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
