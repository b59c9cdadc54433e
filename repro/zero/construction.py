"""Partitioned construction (ZeRO-Infinity sec. 7.2, DeepSpeed's ``zero.Init``): build a model no rank can hold.

Stage 3 stores 1/N_d of every parameter, but a model built the ordinary way exists whole on every rank before the
optimizer partitions it, so the largest model is bounded by one rank's memory after all. Here the model is built
in two passes:

1. a *skeleton*: the module tree built on the ``meta`` device (shapes, no storage, the RNG untouched); every
   parameter becomes an empty CPU placeholder that remembers its shape as ``zero_shape`` (DeepSpeed's
   ``ds_shape``), so stage 3 can lay out its buckets;
2. *blocks*: the model's top-level pieces (GPT: the embedding, each transformer layer, the final LayerNorm), each
   built for real by its ordinary constructor, in the order the model's own ``__init__`` builds them, when stage 3
   asks for the values of its first parameter (:class:`BlockMaterializer`). Stage 3 keeps this rank's shard in its
   parameter tier (on NVMe, written at once) and the block is dropped when the next one is built.

Because the blocks consume the default generator in the same order as the unpartitioned constructor, the values
are the same numbers, not merely the same distribution (tests/zero/test_zero_construction.py). At most one block
is whole at a time: the peak of construction is one layer, not the model.

    model, optimizer = build_partitioned_gpt(config, zero_config, dp_group=groups.dp, lr=1e-4)

(``build_partitioned_gpt`` and the GPT's blocks are in :mod:`repro.models.partitioned_gpt`: this module takes any
model's skeleton and blocks and knows no model class.)
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn


BlockFactory = Callable[[], nn.Module]


def skeleton(factory: BlockFactory) -> nn.Module:
    """``factory()`` built on the meta device, its parameters replaced by shape-carrying CPU placeholders.

    The default generator is left where it was (meta tensors draw no numbers, and the state is restored anyway),
    so the blocks built afterwards draw exactly what the ordinary constructor would have drawn."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = factory()
    placeholders: dict[int, nn.Parameter] = {}  # a tied parameter stays one parameter
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in placeholders:
                holder = nn.Parameter(torch.empty(0, dtype=param.dtype), requires_grad=param.requires_grad)
                holder.zero_shape = param.shape
                placeholders[id(param)] = holder
            module._parameters[name] = placeholders[id(param)]
    return model


class BlockMaterializer:
    """Builds the blocks of a skeleton on demand, strictly in order, holding at most one at a time.

    ``blocks``: (qualified module name in the skeleton, factory) in construction order. ``value(name)`` returns the
    initial value of parameter ``name`` (a full tensor of its block); asking for a parameter of a later block
    builds every block up to it (and drops the one before), asking for an earlier one is an error: its block is
    gone, and building it again would draw other random numbers.
    """

    def __init__(self, model: nn.Module, blocks: Sequence[tuple[str, BlockFactory]]) -> None:
        self.model = model
        self.blocks = list(blocks)
        self.next_block = 0
        self.current: dict[str, torch.Tensor] = {}
        self.current_block: str | None = None
        self.peak_block_bytes = 0  # the largest block held whole (the construction's bound)
        self.built: list[str] = []
        names = [name for name, _ in model.named_parameters()]
        uncovered = [name for name in names if self._block_of(name) is None]
        if uncovered:
            raise ValueError(f"parameters {uncovered[:5]} belong to no block; blocks are {[b for b, _ in blocks]}")

    def _block_of(self, name: str) -> int | None:
        for index, (prefix, _) in enumerate(self.blocks):
            if name == prefix or name.startswith(prefix + "."):
                return index
        return None

    def _build_next(self) -> None:
        prefix, factory = self.blocks[self.next_block]
        self.current = {}  # drop the previous block before building this one
        block = factory()
        target = self.model.get_submodule(prefix)
        for name, param in block.named_parameters():
            expected = getattr(target.get_parameter(name), "zero_shape", None)
            if expected is not None and tuple(expected) != tuple(param.shape):
                raise ValueError(f"block {prefix!r} built {name} with shape {tuple(param.shape)}, the skeleton has "
                                 f"{tuple(expected)}: the block factory does not match the model")
            self.current[f"{prefix}.{name}"] = param.detach()
        for name, buffer in block.named_buffers():  # buffers are small and stay whole
            owner, _, leaf = f"{prefix}.{name}".rpartition(".")
            self.model.get_submodule(owner).register_buffer(leaf, buffer)
        self.peak_block_bytes = max(self.peak_block_bytes,
                                    sum(t.numel() * t.element_size() for t in self.current.values()))
        self.current_block = prefix
        self.built.append(prefix)
        self.next_block += 1

    def value(self, name: str) -> torch.Tensor:
        """The initial value of parameter ``name`` (qualified, as in ``model.named_parameters()``)."""
        index = self._block_of(name)
        if index is None:
            raise KeyError(f"parameter {name!r} belongs to no block")
        if index < self.next_block - 1 or (index == self.next_block - 1 and name not in self.current):
            raise RuntimeError(f"parameter {name!r} was asked for after its block {self.blocks[index][0]!r} was "
                               "dropped: blocks are built once, in construction order")
        while self.next_block <= index:
            self._build_next()
        return self.current[name]

    def finish(self) -> None:
        """Build the blocks nobody asked for (so the generator ends where the ordinary constructor leaves it) and
        drop the last one."""
        while self.next_block < len(self.blocks):
            self._build_next()
        self.current = {}
        self.current_block = None
