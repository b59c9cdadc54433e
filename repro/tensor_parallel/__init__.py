"""Megatron-LM tensor parallelism: f/g mappings, column/row/vocab-parallel layers, parallel cross-entropy, RNG.

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (the experiments' declarations, which `repro list` and the Slurm planning step import) does not import torch
through this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.lazy import lazy_names

#: name -> the module that defines it, imported at the name's first use
_HOMES = {
    **dict.fromkeys(("vocab_parallel_cross_entropy",), "repro.tensor_parallel.cross_entropy"),
    **dict.fromkeys(("VocabParallelEmbedding", "vocab_range"), "repro.tensor_parallel.embedding"),
    **dict.fromkeys(("pad_vocab_size",), "repro.tensor_parallel.vocab"),
    **dict.fromkeys((
        "ColumnParallelLinear", "RowParallelLinear", "normal_init", "scaled_normal_init"
    ), "repro.tensor_parallel.layers"),
    **dict.fromkeys((
        "copy_to_tensor_parallel", "gather_from_tensor_parallel", "reduce_from_tensor_parallel",
        "scatter_to_tensor_parallel"
    ), "repro.tensor_parallel.mappings"),
    **dict.fromkeys(("RNGTracker", "seed_everything"), "repro.tensor_parallel.random"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from repro.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
    from repro.tensor_parallel.embedding import VocabParallelEmbedding, vocab_range
    from repro.tensor_parallel.vocab import pad_vocab_size
    from repro.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, normal_init, scaled_normal_init
    from repro.tensor_parallel.mappings import (
        copy_to_tensor_parallel,
        gather_from_tensor_parallel,
        reduce_from_tensor_parallel,
        scatter_to_tensor_parallel,
    )
    from repro.tensor_parallel.random import RNGTracker, seed_everything


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
