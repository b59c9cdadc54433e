"""Swap the four T3 sublayers of a tensor-parallel model to their overlapped twins.

T3 (Pati et al., ASPLOS'24, sec. 2-3) targets the GEMMs whose output feeds a tensor-parallel collective:

=====================  ==========================  ============================  =====================
sublayer (T3 name)     module here                 collective overlapped          pass
=====================  ==========================  ============================  =====================
OP  (attn output proj)  ``attention.dense``         all-reduce of the output       forward
FC-2                   ``mlp.fc2``                 all-reduce of the output       forward
IP  (input/QKV proj)   ``attention.qkv``           all-reduce of dX               backward
FC-1                   ``mlp.fc1``                 all-reduce of dX               backward
=====================  ==========================  ============================  =====================

The swapped modules share the original parameter tensors, so a model (and its optimizer) is unchanged apart from
the schedule of its communication.
"""

from __future__ import annotations

from torch import nn

from repro.overlap.chunking import check_num_chunks
from repro.overlap.column_parallel import OverlappedColumnParallelLinear
from repro.overlap.row_parallel import OverlappedRowParallelLinear
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear

#: (attribute path inside a transformer layer, T3 sublayer name)
T3_SUBLAYERS = (("attention.dense", "OP"), ("mlp.fc2", "FC-2"), ("attention.qkv", "IP"), ("mlp.fc1", "FC-1"))


def overlapped_twin(layer: nn.Module, *, num_chunks: int) -> nn.Module:
    """The overlapped twin of a plain column- or row-parallel linear (sharing its parameters)."""
    if isinstance(layer, (OverlappedRowParallelLinear, OverlappedColumnParallelLinear)):
        raise ValueError(f"{type(layer).__name__} is already overlapped")
    if isinstance(layer, RowParallelLinear):
        return OverlappedRowParallelLinear.from_plain(layer, num_chunks=num_chunks)
    if isinstance(layer, ColumnParallelLinear):
        return OverlappedColumnParallelLinear.from_plain(layer, num_chunks=num_chunks)
    raise ValueError(
        f"cannot overlap a {type(layer).__name__}: only ColumnParallelLinear and RowParallelLinear have twins"
    )


def overlap_sublayers(module: nn.Module, *, num_chunks: int = 4) -> list[str]:
    """Replace, in place, every plain column/row-parallel linear at a T3 sublayer position inside ``module``
    (a model, a transformer layer, an MLP or an attention block) by its overlapped twin. Returns the swapped
    module names. Raises ValueError when nothing was found to swap."""
    check_num_chunks(num_chunks)
    suffixes = {path.split(".")[-1]: path for path, _ in T3_SUBLAYERS}
    targets = []
    for name, child in module.named_modules():
        if not isinstance(child, (ColumnParallelLinear, RowParallelLinear)):
            continue
        if isinstance(child, (OverlappedRowParallelLinear, OverlappedColumnParallelLinear)):
            continue
        leaf = name.split(".")[-1]
        if leaf in suffixes and (name.endswith(suffixes[leaf]) or "." not in name):
            targets.append(name)
    if not targets:
        raise ValueError(
            f"no T3 sublayer ({', '.join(p for p, _ in T3_SUBLAYERS)}) found in {type(module).__name__}"
        )
    for name in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, leaf, overlapped_twin(getattr(parent, leaf), num_chunks=num_chunks))
    return targets
