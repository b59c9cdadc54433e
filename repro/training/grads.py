"""Gradient reductions of a (tp x pp x dp) training step: data-parallel averaging and the global gradient norm.

* Data parallelism: every dp replica back-propagates its own slice of the batch; their gradients are averaged
  with one all-reduce of a flat buffer per step (DDP; ZeRO-1 replaces this with its own reduction).
* Gradient clipping (MT-NLG sec. 3: clip at 1.0) needs the norm of the *whole* model's gradient: each rank sums
  the squares of the gradients it owns, counting a tensor-replicated parameter once (on tp rank 0) and the last
  stage's copy of the tied embedding not at all, then the sums are added over the tp and pp groups.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.models.sharding import split_rule
from repro.pipeline.stage import OUTPUT_EMBEDDING


def allreduce_data_parallel_grads(params: Iterable[nn.Parameter], dp_group: CommGroup) -> None:
    """Average ``.grad`` over the data-parallel group in one flat all-reduce (a missing grad counts as zero)."""
    if dp_group.size == 1:
        return
    params = list(params)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce(flat, dp_group)
    flat.div_(dp_group.size)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def counted_in_norm(name: str, tp_rank: int) -> bool:
    """Whether this rank's copy of parameter ``name`` enters the global norm (each value exactly once)."""
    if name == OUTPUT_EMBEDDING:
        return False  # the first stage counts the tied word embedding
    return split_rule(name) is not None or tp_rank == 0


def _by_device(tensors: Iterable[torch.Tensor]) -> dict[torch.device, list[torch.Tensor]]:
    """``tensors`` grouped by device (a foreach op takes one device's tensors)."""
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.device, []).append(tensor)
    return groups


def gradient_norms(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Each gradient's L2 norm (fp32, as computed) in one fp64 vector on ``device``, without a host sync: one
    ``_foreach_norm`` per device (a few kernels on a GPU, where a loop over ~500 parameters launched ~2,000)."""
    norms = [torch.stack(torch._foreach_norm(tensors)).to(device) for tensors in _by_device(grads).values()]
    if not norms:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return (norms[0] if len(norms) == 1 else torch.cat(norms)).double()


def global_grad_norm(model: nn.Module, *, tp_group: CommGroup, pp_group: CommGroup) -> torch.Tensor:
    """L2 norm of the gradient of the full (unsharded, unpipelined) model, identical on every rank: a 0-dim fp64
    tensor on the parameters' device (reading it is the only host sync). Over several ranks the fp64 sums of
    squares are added over the tp and pp groups, on the device."""
    device = next((p.device for p in model.parameters()), None)
    device = device if device is not None else comm.group_device(tp_group)  # nccl reduces GPU tensors only
    norms = gradient_norms([p.grad.detach() for name, p in model.named_parameters()
                            if p.grad is not None and counted_in_norm(name, tp_group.rank)], device)
    if tp_group.size == 1 and pp_group.size == 1:
        return torch.linalg.vector_norm(norms)
    squares = norms.square().sum()
    comm.all_reduce(squares, tp_group)
    comm.all_reduce(squares, pp_group)
    return squares.sqrt()


def clip_grad_norm_(model: nn.Module, max_norm: float, *, tp_group: CommGroup, pp_group: CommGroup) -> torch.Tensor:
    """Scale every gradient by ``min(1, max_norm / (norm + 1e-6))``, a factor that stays on the device (clamped,
    not compared on the host: multiplying by 1 changes nothing); return the norm before clipping (0-dim tensor)."""
    if max_norm <= 0:
        raise ValueError(f"max_norm={max_norm} must be positive")
    norm = global_grad_norm(model, tp_group=tp_group, pp_group=pp_group)
    factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    for device, grads in _by_device(grads).items():
        torch._foreach_mul_(grads, factor.to(device))  # as grad.mul_(python float): the same bits
    return norm
