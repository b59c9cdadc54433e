"""Cross-entropy over vocabulary-parallel logits (Megatron-LM sec. 3, "output embedding").

Gathering the logits ``[b, s, V]`` would move b*s*V values; instead each rank keeps its ``[b, s, V/p]`` shard and
three all-reduces of ``[b, s]`` scalars suffice:

    m      = max_v z_v                      (all-reduce MAX)
    z_t    = logit of the target token      (all-reduce SUM; only its owner contributes)
    S      = sum_v exp(z_v - m)             (all-reduce SUM)
    loss   = log S - (z_t - m)

Backward is local: dL/dz_v = softmax_v - 1[v = t], times the incoming gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.tensor_parallel.layers import _group


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group):
        # logits: [..., V/p] (this rank's shard); target: [...] global vocabulary ids.
        logits = logits.float()
        vocab_per_rank = logits.shape[-1]
        start = group.rank * vocab_per_rank
        logits_max = logits.max(dim=-1).values
        comm.all_reduce(logits_max, group, op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)

        outside = (target < start) | (target >= start + vocab_per_rank)
        local_target = (target - start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        comm.all_reduce(target_logit, group)

        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp, group)
        loss = sum_exp.log() - target_logit

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax.clone()
        inside = (~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -inside.unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: CommGroup | None = None):
    """Per-token loss ``[...]`` from vocab-parallel logits ``[..., V/p]`` and targets ``[...]`` (fp32 math)."""
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree on leading dims")
    return _VocabParallelCrossEntropy.apply(logits, target, _group(group))
