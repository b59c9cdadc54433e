"""The RNG swap of :class:`repro.tensor_parallel.random.RNGTracker` as two custom ops, so compiled layers stay whole.

Megatron sec. 3 draws dropout inside tensor-parallel regions (attention probabilities, whose heads are split over
the tp ranks) from a generator of its own, and outside them from the default generator seeded alike on every tp
rank. Swapping the generator's state with ``torch.get_rng_state``/``set_rng_state`` in Python is what dynamo refuses
to trace: a compiled transformer layer fell apart into 4 graphs with 3 graph breaks. Here the swap is an operator
with a declared effect on the state buffers it writes, which dynamo, AOTAutograd and inductor keep as one node:

* ``repro::rng_enter(like, load, save, device)`` saves the current state into ``save``, loads ``load`` and returns
  a 0-dim zero of ``like``'s dtype and device. Whatever consumes it runs after the swap: the caller adds it to a
  *small* tensor that the region's random op depends on (the QKV projection's bias: attention runs on its output),
  so the ordering costs an addition over a few kilobytes, not a copy of an activation. The zero carries no
  gradient (an op that writes state cannot have an autograd formula), the addition passes the bias's through.
* ``repro::rng_leave(after, load, save, device)`` saves the current state into ``save`` and loads ``load``; it takes
  the region's output ``after`` so it runs once that output exists, and returns nothing.

Both run eagerly exactly as the Python swap did (same states, same order), so eager numbers are unchanged.
``device`` is ``"cpu"`` or ``"cuda"`` (the current CUDA device's generator).
"""

# No ``from __future__ import annotations``: torch 2.4's custom_op reads the annotations as types, not strings.
import torch
from torch import Tensor


def get_state(device: str) -> Tensor:
    """The generator state of ``device`` ("cpu", or "cuda": the current CUDA device)."""
    return torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()


def set_state(device: str, state: Tensor) -> None:
    if device == "cuda":
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


@torch.library.custom_op("repro::rng_enter", mutates_args=("save",), device_types=None)
def rng_enter(like: Tensor, load: Tensor, save: Tensor, device: str) -> Tensor:
    """Save the generator of ``device`` into ``save`` and load ``load``; return a zero of ``like``'s dtype and
    device (a 0-dim tensor): adding it to an input of the region orders the region after the swap."""
    save.copy_(get_state(device))
    set_state(device, load)
    return torch.zeros((), dtype=like.dtype, device=like.device)


@rng_enter.register_fake
def _rng_enter_fake(like: Tensor, load: Tensor, save: Tensor, device: str) -> Tensor:
    return torch.empty((), dtype=like.dtype, device=like.device)


@torch.library.custom_op("repro::rng_leave", mutates_args=("save",), device_types=None)
def rng_leave(after: Tensor, load: Tensor, save: Tensor, device: str) -> None:
    """Once ``after`` exists: save the generator of ``device`` into ``save`` and load ``load``."""
    save.copy_(get_state(device))
    set_state(device, load)


@rng_leave.register_fake
def _rng_leave_fake(after: Tensor, load: Tensor, save: Tensor, device: str) -> None:
    return None
