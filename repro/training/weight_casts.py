"""16-bit casts of a layer's weights made once per step, outside its recomputation (no recast weights).

Under bf16 autocast with fp32 master weights (Micikevicius et al. 2018; Megatron and MT-NLG train so), every matmul
casts its fp32 weight to bf16 when it runs, and a checkpointed layer (Megatron sec. 5) runs its forward twice: the
recomputation in backward casts every weight again, and the casts' backward turns each bf16 weight gradient into a
new fp32 tensor that autograd then adds to the parameter's gradient. :class:`WeightCasts` makes the casts of a layer's
matmul weights once, before its checkpoint, and hands them to the layer (``torch.func.functional_call``): the
checkpoint keeps them as inputs (the recomputation reuses them; they cost 2 bytes per weight from the forward to the
backward), and autocast, finding them already in its dtype, casts nothing. The arithmetic is autocast's: the same
casts of the same weights.

Where the model's gradients are views of flat buffers (:class:`~repro.training.flat_buffers.FlatParameters`), each
cast's backward writes the bf16 gradient straight into its parameter's fp32 slice (a converting copy, or an add for
a later micro-batch), so no fp32 gradient tensor is made and nothing is added to it afterwards. Hooks registered on
such a parameter then see no gradient (none reaches it through autograd).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear

#: the parameters autocast casts in every use, by module type: F.linear's weight and bias (the column-parallel
#: layer adds its bias inside the matmul); the row-parallel bias is added after the reduction, in fp32
CAST_BY_TYPE = ((ColumnParallelLinear, ("weight", "bias")), (RowParallelLinear, ("weight",)))


def cast_parameter_names(layer: nn.Module) -> tuple[str, ...]:
    """Names (relative to ``layer``) of the parameters autocast casts to its 16-bit dtype wherever they are used."""
    names = []
    for prefix, module in layer.named_modules():
        for kind, attributes in CAST_BY_TYPE:
            if isinstance(module, kind):
                names += [f"{prefix}.{a}" if prefix else a for a in attributes if getattr(module, a) is not None]
    return tuple(names)


class GradSink(Protocol):
    """Where a cast's backward writes its parameter's gradient (:meth:`FlatParameters.write_grad`)."""

    def write_grad(self, param: nn.Parameter, grad: torch.Tensor) -> None: ...


class _CastIntoGrad(torch.autograd.Function):
    """``weight.to(dtype)`` whose backward writes the gradient into ``sink`` instead of returning it."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, dtype: torch.dtype, sink: GradSink) -> torch.Tensor:
        ctx.param, ctx.sink = weight, sink
        return weight.to(dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.sink.write_grad(ctx.param, grad)
        return None, None, None


class WeightCasts:
    """The 16-bit casts of one layer's matmul weights (``names``), made by :meth:`make` before its checkpoint.

    ``sink`` (set once the optimizer's flat buffers exist, :func:`attach_grad_sink`) receives the gradients; without
    one they flow back through an ordinary cast."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype) -> None:
        self.names = cast_parameter_names(layer)
        self.params = [layer.get_parameter(name) for name in self.names]
        #: (module, attribute) of each name: where :func:`call_with` puts a cast for the call
        self.slots = [(layer.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]) for name in self.names]
        self.dtype = dtype
        self.sink: GradSink | None = None

    def make(self) -> tuple[torch.Tensor, ...]:
        if self.sink is None or not torch.is_grad_enabled():
            return tuple(p.to(self.dtype) for p in self.params)
        return tuple(_CastIntoGrad.apply(p, self.dtype, self.sink) for p in self.params)


def call_with(layer: nn.Module, x: torch.Tensor, casts: WeightCasts | None, values: tuple[torch.Tensor, ...]):
    """``layer(x)`` with the parameters of ``casts`` replaced by ``values`` (the casts), or plainly without any.

    Traced by torch.compile through ``torch.func.functional_call``; eagerly the casts are put in the modules' parameter
    slots for the call and the parameters put back after it (what functional_call does, without its bookkeeping:
    a quarter of a small layer's host time)."""
    if casts is None or not values:
        return layer(x)
    if torch.compiler.is_compiling():
        return torch.func.functional_call(layer, dict(zip(casts.names, values)), (x,))
    kept = [module._parameters[name] for module, name in casts.slots]
    try:
        for (module, name), value in zip(casts.slots, values):
            module._parameters[name] = value
        return layer(x)
    finally:
        for (module, name), param in zip(casts.slots, kept):
            module._parameters[name] = param


def attach_grad_sink(layers: nn.ModuleList, sink: GradSink | None) -> int:
    """Let the weight casts of ``layers`` write their gradients into ``sink``; returns how many layers cast."""
    attached = 0
    for layer in layers:
        casts = getattr(layer, "casts", None)
        if casts is not None:
            casts.sink = sink
            attached += 1
    return attached
