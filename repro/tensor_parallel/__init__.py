"""Megatron-LM tensor parallelism: f/g mappings, column/row/vocab-parallel layers, parallel cross-entropy, RNG."""

from repro.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from repro.tensor_parallel.embedding import VocabParallelEmbedding, pad_vocab_size, vocab_range
from repro.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, normal_init, scaled_normal_init
from repro.tensor_parallel.mappings import (
    copy_to_tensor_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    scatter_to_tensor_parallel,
)
from repro.tensor_parallel.random import RNGTracker, seed_everything

__all__ = [
    "ColumnParallelLinear", "RNGTracker", "RowParallelLinear", "VocabParallelEmbedding", "copy_to_tensor_parallel",
    "gather_from_tensor_parallel", "normal_init", "pad_vocab_size", "reduce_from_tensor_parallel",
    "scaled_normal_init", "scatter_to_tensor_parallel", "seed_everything", "vocab_parallel_cross_entropy",
    "vocab_range",
]
