"""Memory per GPU of tp x pp x dp GPT training: model states (ZeRO sec 3.1/5) plus activations.

Model states: the ``num_params / (tp * pp)`` parameters of one rank at ``bytes_per_param`` bytes each, or, with
ZeRO, partitioned over the data-parallel group by ``repro.perfmodel.zero_memory``. MT-NLG sec 2.1 counts 20 bytes
per parameter ("Adam, mixed precision": 16 for the ZeRO accounting plus 4 for fp32 gradients).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation", eq. 2 with tensor parallelism and no
sequence parallelism): one layer's stored activations are ``s b h (10 + 24/t + 5 a s / (h t))`` bytes. With full
recomputation a layer keeps only its ``2 s b h``-byte input; the 1F1B schedule keeps up to ``pp`` micro-batches in
flight on the first stage, and one layer's full activations exist during its recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.perfmodel.zero_memory import model_state_bytes

from .step_time import GPTConfig, Layout


def layer_activation_bytes(*, micro_batch_size: int, seq_length: int, hidden_size: int, num_heads: int,
                           tp_size: int = 1) -> float:
    """Stored activations of one transformer layer without recomputation (Korthikanti et al. 2022, eq. 2)."""
    s, b, h, a, t = seq_length, micro_batch_size, hidden_size, num_heads, tp_size
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def checkpoint_bytes(*, micro_batch_size: int, seq_length: int, hidden_size: int) -> float:
    """The layer-input checkpoint kept under full recomputation: ``2 s b h`` bytes (fp16)."""
    return 2.0 * micro_batch_size * seq_length * hidden_size


@dataclass(frozen=True)
class MemoryPerGPU:
    """Bytes per GPU, by kind."""

    model_states: float
    activation_checkpoints: float
    working_activations: float

    @property
    def total(self) -> float:
        return self.model_states + self.activation_checkpoints + self.working_activations


def memory_per_gpu(model: GPTConfig, layout: Layout, *, bytes_per_param: float = 16.0,
                   zero_stage: int = 0) -> MemoryPerGPU:
    """Peak memory of the first pipeline stage (the one with the most micro-batches in flight).

    ``bytes_per_param`` is the model-state bytes per parameter before ZeRO partitioning; ZeRO's stages keep
    (4 of fp16 weights + gradients) and partition the rest (``bytes_per_param - 4``, ``K`` in ZeRO's notation).
    """
    if bytes_per_param < 4:
        raise ValueError(f"bytes_per_param must be >= 4 (fp16 weights + grads), got {bytes_per_param}")
    params_per_rank = model.num_params / (layout.tp_size * layout.pp_size)
    states = model_state_bytes(num_params=params_per_rank, stage=zero_stage, dp_size=layout.dp_size,
                               k=bytes_per_param - 4)
    layers_per_stage = model.num_layers // layout.pp_size
    in_flight = min(layout.pp_size, layout.num_micro_batches)
    full_layer = layer_activation_bytes(micro_batch_size=layout.micro_batch_size, seq_length=model.seq_length,
                                        hidden_size=model.hidden_size, num_heads=model.num_heads,
                                        tp_size=layout.tp_size)
    if layout.activation_recompute:
        checkpoints = in_flight * layers_per_stage * checkpoint_bytes(
            micro_batch_size=layout.micro_batch_size, seq_length=model.seq_length, hidden_size=model.hidden_size)
        working = full_layer
    else:
        checkpoints = 0.0
        working = in_flight * layers_per_stage * full_layer
    return MemoryPerGPU(model_states=states, activation_checkpoints=checkpoints, working_activations=working)
