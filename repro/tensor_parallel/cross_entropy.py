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
from repro.tensor_parallel.layers import group_or_single


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Saves the logits as they came (bf16 under autocast) with ``m`` and ``S`` per token, not an fp32 softmax the
    size of the logits: backward recomputes ``exp(z - m) / S`` from them, the same fp32 operations on the same
    values as a saved softmax, so the gradient is bit for bit the same, at half the memory held from the loss's
    forward to its backward (a quarter under bf16 of what an fp32 copy plus softmax took)."""

    @staticmethod
    def forward(ctx, logits, target, group):
        # logits: [..., V/p] (this rank's shard, any float dtype); target: [...] global vocabulary ids.
        vocab_per_rank = logits.shape[-1]
        start = group.rank * vocab_per_rank
        logits_max = logits.max(dim=-1).values.float()  # exact: the largest value is one of the logits
        comm.all_reduce(logits_max, group, op=dist.ReduceOp.MAX)

        if group.size > 1:
            outside = (target < start) | (target >= start + vocab_per_rank)
            local_target = (target - start).masked_fill(outside, 0)
        else:  # one rank holds every target
            outside, local_target = None, target
        target_logit = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).float() - logits_max
        if outside is not None:
            target_logit = target_logit.masked_fill(outside, 0.0)
        comm.all_reduce(target_logit, group)

        sum_exp = _shifted_exp(logits, logits_max).sum(dim=-1)
        comm.all_reduce(sum_exp, group)
        ctx.save_for_backward(logits, logits_max, sum_exp, local_target, outside)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        logits, logits_max, sum_exp, local_target, outside = ctx.saved_tensors
        grad = _shifted_exp(logits, logits_max).div_(sum_exp.unsqueeze(-1))  # the softmax
        if outside is not None:
            grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        else:
            grad.scatter_(-1, local_target.unsqueeze(-1), -1.0, reduce="add")
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(logits.dtype), None, None


def _shifted_exp(logits: torch.Tensor, logits_max: torch.Tensor) -> torch.Tensor:
    """``exp(z - m)`` in fp32 as one new tensor, the logits left as they are: fp32 logits minus ``m`` is that tensor;
    16-bit ones are copied to fp32 first, the subtraction in place on the copy (one fp32 temporary, not two)."""
    if logits.dtype == torch.float32:
        return (logits - logits_max.unsqueeze(-1)).exp_()
    return logits.float().sub_(logits_max.unsqueeze(-1)).exp_()


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: CommGroup | None = None):
    """Per-token loss ``[...]`` from vocab-parallel logits ``[..., V/p]`` and targets ``[...]`` (fp32 math)."""
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree on leading dims")
    return _VocabParallelCrossEntropy.apply(logits, target, group_or_single(group))
