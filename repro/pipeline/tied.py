"""Keep the two copies of the tied word embedding equal across the first and last pipeline stage.

Megatron (Narayanan et al. 2021; Shoeybi et al. 2019 sec. 3 "output embedding") ties the output layer to the input
embedding. Under pipeline parallelism the input embedding lives on the first stage and the output layer on the last;
each keeps a copy of the weight, both start equal, and before each optimizer step the two gradients are summed over
``groups.embedding`` (the first and last stage of each pipeline, per tp rank), so both copies take the same update.
The sum is the gradient the single tied parameter of an unpipelined model gets.
"""

from __future__ import annotations

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.models.gpt import GPTModel


def allreduce_tied_embedding_grad(stage: GPTModel, embedding_group: CommGroup) -> None:
    """Sum the word-embedding gradient of the first and last stage (no-op for pp=1 or a middle stage)."""
    weight = stage.tied_embedding()
    if weight is None or embedding_group.size == 1:
        return
    weight = weight.weight
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    comm.all_reduce(weight.grad, embedding_group)


def check_tied_embedding_equal(stage: GPTModel, embedding_group: CommGroup, *, atol: float = 0.0) -> float:
    """Max |difference| between the first and last stage's copies (0 on middle stages); raises above ``atol``."""
    weight = stage.tied_embedding()
    if weight is None or embedding_group.size == 1:
        return 0.0
    mine = weight.weight.detach().clone()
    total = mine.clone()
    comm.all_reduce(total, embedding_group)
    diff = float((total - 2 * mine).abs().max()) / 2  # other - mine, seen from either side
    if diff > atol:
        raise AssertionError(f"tied word-embedding copies differ by {diff:.3e} > {atol:.1e} across first/last stage")
    return diff
