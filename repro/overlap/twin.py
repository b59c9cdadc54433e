"""Build an overlapped variant of a plain layer that shares the plain layer's state (used by every ``from_plain``)."""

from __future__ import annotations

from typing import TypeVar

from torch import nn

from repro.overlap.chunking import check_num_chunks

LayerT = TypeVar("LayerT", bound=nn.Module)


def twin_of(cls: type[LayerT], plain: nn.Module, *, num_chunks: int) -> LayerT:
    """An instance of ``cls`` (a subclass of ``type(plain)``) holding ``plain``'s attributes and the very same
    parameter tensors: no new initialisation, no RNG use, so the twin computes what ``plain`` computes."""
    if not isinstance(plain, cls.__mro__[1]):
        raise TypeError(f"{cls.__name__} is a twin of {cls.__mro__[1].__name__}, not of {type(plain).__name__}")
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    for name, value in vars(plain).items():
        if not name.startswith("_") and name != "training":
            setattr(layer, name, value)
    for name, param in plain._parameters.items():
        layer.register_parameter(name, param)
    layer.train(plain.training)
    layer.num_chunks = check_num_chunks(num_chunks)
    return layer
