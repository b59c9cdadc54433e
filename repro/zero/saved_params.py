"""Stage 3 must not let autograd keep gathered parameters alive between forward and backward.

``F.linear`` saves ``weight.t()`` for its backward: a *view* of the gathered full parameter buffer, not the
parameter. Releasing the unit after forward swaps the parameter's storage for a placeholder, but the saved view
still holds the gathered buffer, so by the end of forward every parameter of the model is resident: the memory
stage 3 exists to avoid (ZeRO sec. 5.3; DeepSpeed replaces ``F.linear`` with its own function that saves the
parameter instead). Here a ``saved_tensors_hooks`` pair, active during the wrapped module's forward, replaces a
saved tensor that views a gathered bucket by (bucket, offset, size, stride) and rebuilds the view in backward,
after the pre-backward hook has gathered the unit again. Parameters themselves are saved as they are (the
Parameter object does not pin a released buffer). Nothing changes numerically: the view is of the same values.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import nn

from repro.zero.buckets import Bucket


class SavedParameterViews:
    """``pack``/``unpack`` for ``torch.autograd.graph.saved_tensors_hooks``; ``gathered()`` yields the buckets whose
    ``flat_param`` is currently gathered."""

    def __init__(self, gathered: Callable[[], Iterable[Bucket]]) -> None:
        self.gathered = gathered
        self.replaced = 0  # saved views turned into references (for tests)
        self._context = None

    def pack(self, tensor: torch.Tensor) -> Any:
        if isinstance(tensor, nn.Parameter) or tensor.layout != torch.strided:
            return tensor
        pointer = tensor.untyped_storage().data_ptr()
        for bucket in self.gathered():
            flat = bucket.flat_param
            if flat is not None and flat.untyped_storage().data_ptr() == pointer:
                self.replaced += 1
                return (bucket, tensor.storage_offset() - flat.storage_offset(), tensor.size(), tensor.stride())
        return tensor

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        bucket, offset, size, stride = packed
        if bucket.flat_param is None:
            raise RuntimeError(f"bucket {bucket.key} ({bucket.names[:2]}...) is not gathered in backward: stage 3 "
                               "gathers a module's parameters when the gradient of its output arrives")
        return bucket.flat_param.as_strided(size, stride, bucket.flat_param.storage_offset() + offset)

    # forward pre-hook / forward hook of the wrapped module
    def enter(self, module: nn.Module, args: Any) -> None:
        self._context = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._context.__enter__()

    def exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)
