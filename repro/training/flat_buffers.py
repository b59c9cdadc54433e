"""A model's parameters and gradients as views of flat buffers, one per dtype and parameter group.

Megatron-LM keeps every gradient of a model replica in one contiguous buffer (its ``main_grad``; Shoeybi et al. 2019
train with fp32 master weights), and ZeRO (Rajbhandari et al. 2020, sec. 5) flattens parameters into buckets, so
that reductions and the optimizer touch a few large tensors. Here a :class:`FlatParameters` does the same for the
trainer's optimizer: each parameter's storage becomes a slice of its group's flat buffer, each ``.grad`` a slice of
a flat gradient buffer that persists across steps (zeroed in place, so autograd accumulates into it), and the global
gradient norm, the clipping and the AdamW step each become one operation per buffer, whatever the number of
parameters (a GPU reads ~5 GB of fp32 gradients of a 1.2B model in ~1 ms; launching ~500 per-tensor kernels costs
the host more than that).

The clipping norm counts each value of the full model once (Megatron's rule, :func:`repro.training.grads.
counted_in_norm`): inside a buffer the counted parameters come first, so the norm reads one prefix slice of it, and
the ones another rank already counts (tensor-parallel copies, the last stage's tied embedding) sit behind it.

    flat buffer [numel]   | counted p0 | counted p1 | ... | not counted q0 | ... |
    norm reads            |<------- counted_numel ------->|
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
from torch import nn


@dataclass(eq=False)
class FlatGroup:
    """The parameters of one dtype and parameter group, back to back in ``data`` (their gradients in ``grad``), the
    counted ones first. ``params``/``names``/``offsets`` are in buffer order."""

    index: int
    group_index: int
    params: list[nn.Parameter]
    names: list[str]
    offsets: list[int]
    counted_numel: int
    data: torch.Tensor
    grad: torch.Tensor
    grad_views: list[torch.Tensor] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return self.data.numel()

    def slot(self, position: int) -> tuple[int, int]:
        """[start, stop) of parameter ``position`` (buffer order) in the flat buffers."""
        start = self.offsets[position]
        return start, start + self.params[position].numel()

    def view(self, flat: torch.Tensor, position: int) -> torch.Tensor:
        start, stop = self.slot(position)
        return flat[start:stop].view(self.params[position].shape)

    def counted_grad(self) -> torch.Tensor:
        """The slice of the flat gradient that enters the global norm."""
        return self.grad[: self.counted_numel]


class FlatParameters:
    """Make ``named_params`` views of flat buffers (in place: the modules keep their ``nn.Parameter`` objects).

    ``counted(name)`` says whether a parameter enters the global gradient norm; ``group_of(name)`` its parameter
    group (hyperparameters; 0 for all by default). Parameters of one dtype and group share a buffer."""

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]], *, counted: Callable[[str], bool],
                 group_of: Callable[[str], int] = lambda name: 0) -> None:
        named = [(name, p) for name, p in named_params]
        if not named:
            raise ValueError("no parameters to flatten: the model has no parameter that requires a gradient")
        devices = {p.device for _, p in named}
        if len(devices) != 1:
            raise ValueError(f"the parameters live on several devices ({sorted(map(str, devices))}); one is needed")
        #: the parameters in model order (the order of a per-parameter optimizer's state)
        self.params = [p for _, p in named]
        self.names = [name for name, _ in named]
        keys: dict[tuple[torch.dtype, int], list[tuple[bool, str, nn.Parameter]]] = {}
        for name, p in named:
            keys.setdefault((p.dtype, group_of(name)), []).append((counted(name), name, p))
        self.groups: list[FlatGroup] = []
        self._where: dict[int, tuple[FlatGroup, int]] = {}
        #: bumped by zero_grad: a parameter whose gradient was written in this epoch is added to, else copied in
        self._epoch = 0
        self._written: dict[int, int] = {}
        for (dtype, group_index), members in keys.items():
            ordered = [m for m in members if m[0]] + [m for m in members if not m[0]]  # counted first, stable
            self.groups.append(self._flatten(len(self.groups), group_index, dtype, ordered))

    def _flatten(self, index: int, group_index: int, dtype: torch.dtype,
                 members: Sequence[tuple[bool, str, nn.Parameter]]) -> FlatGroup:
        offsets, cursor, counted_numel = [], 0, 0
        for is_counted, _, p in members:
            offsets.append(cursor)
            cursor += p.numel()
            counted_numel += p.numel() if is_counted else 0
        device = members[0][2].device
        data = torch.empty(cursor, dtype=dtype, device=device)
        grad = torch.zeros(cursor, dtype=dtype, device=device)
        group = FlatGroup(index, group_index, [m[2] for m in members], [m[1] for m in members], offsets,
                          counted_numel, data, grad)
        with torch.no_grad():
            for position, p in enumerate(group.params):
                view = group.view(data, position)
                view.copy_(p.detach())
                p.data = view  # the module's parameter now lives in the flat buffer
                grad_view = group.view(grad, position)
                if p.grad is not None:
                    grad_view.copy_(p.grad)
                p.grad = grad_view
                group.grad_views.append(grad_view)
                self._where[id(p)] = (group, position)
        return group

    # -- gradients -------------------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Zero every flat gradient in place (one fill per buffer); ``.grad`` stays a view of it, so the next
        backward accumulates into the buffer."""
        for group in self.groups:
            group.grad.zero_()
        self._epoch += 1

    def write_grad(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        """Put ``grad`` (any floating dtype: a 16-bit cast's gradient) into ``param``'s slice: copied (converted) by
        the first write since :meth:`zero_grad`, added by later ones (micro-batches accumulate), as autograd would
        accumulate into ``.grad``. Used by :class:`repro.training.weight_casts.WeightCasts`."""
        group, position = self._where[id(param)]
        view = group.grad_views[position]
        if self._written.get(id(param)) == self._epoch:
            view.add_(grad)
        else:
            view.copy_(grad)
            self._written[id(param)] = self._epoch

    def grad_view(self, param: nn.Parameter) -> torch.Tensor:
        """``param``'s slice of its flat gradient (what its ``.grad`` is)."""
        group, position = self._where[id(param)]
        return group.grad_views[position]

    def repair_grads(self) -> None:
        """Point every ``.grad`` back at its slice if something replaced it (``module.zero_grad()`` sets None, an
        assignment puts another tensor there): its values are copied in, None counts as zero. A loop of identity
        checks when nothing changed (the usual case: no operation is dispatched)."""
        for group in self.groups:
            for p, view in zip(group.params, group.grad_views):
                grad = p.grad
                if grad is view:
                    continue
                with torch.no_grad():
                    if grad is None:
                        view.zero_()
                    elif grad.data_ptr() != view.data_ptr():
                        view.copy_(grad)
                p.grad = view

    def counted_norms(self) -> list[torch.Tensor]:
        """The L2 norm of each buffer's counted gradients: one fp32 reduction per buffer (0-dim device tensors)."""
        return [torch.linalg.vector_norm(g.counted_grad()) for g in self.groups if g.counted_numel]

    # -- per-parameter views of flat state -----------------------------------------------------------------------
    def unflatten(self, flats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per parameter (model order), its view of ``flats[g]`` (one flat tensor per group, laid out as the
        groups' buffers)."""
        return [self.groups[g].view(flats[g], position) for g, position in (self.locate(p) for p in self.params)]

    def locate(self, param: nn.Parameter) -> tuple[int, int]:
        """(group index, position in the group) of ``param``."""
        group, position = self._where[id(param)]
        return group.index, position

    def layout(self) -> list[dict]:
        """What a checkpoint records to check that a flat state fits this model: per buffer, names, sizes, dtype."""
        return [{"names": list(g.names), "numels": [p.numel() for p in g.params], "dtype": str(g.data.dtype),
                 "group": g.group_index, "counted_numel": g.counted_numel} for g in self.groups]
