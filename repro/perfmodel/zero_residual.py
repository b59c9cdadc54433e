"""ZeRO-R's closed forms (Rajbhandari et al. 2019, sec 3.2, 4.2.1, 6 and 8): residual memory (activations,
activation checkpoints, fused buffers) and the communication of partitioned activation checkpointing (P_a).

Symbols as in the paper's text: ``num_layers`` transformer blocks of ``hidden_size``, ``batch_size`` sequences
of ``seq_length`` tokens, ``mp_size`` the Megatron-LM model-parallel degree. Activations are fp16 (sec 3.1:
mixed precision stores parameters and activations as fp16), so one element is 2 bytes. Communication volumes
are in elements, counted as the paper does: an all-reduce moves twice its message, an all-gather its message
(sec 7.1 / 8).
"""

from __future__ import annotations

import math

from repro.perfmodel.flops import gpt_layer_forward_flops
from repro.perfmodel.parallel_comm import tp_allreduces_per_layer, zero_communication_volume
from repro.perfmodel.zero_infinity import params_per_block

ACTIVATION_COEFF = 12  # sec 3.2 footnote: total activations ~ 12 x hidden x batch x seq x layers (GPT-2-like)
FP16_BYTES = 2
FP32_BYTES = 4


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def activation_bytes(*, num_layers: int, hidden_size: int, batch_size: int, seq_length: int,
                     coeff: float = ACTIVATION_COEFF, bytes_per_element: int = FP16_BYTES) -> float:
    """Activations of a whole training step without checkpointing (sec 3.2 and its footnote):
    ``coeff x hidden x batch x seq x layers`` fp16 elements, ``coeff`` = 12 for a GPT-2-like block."""
    _positive(num_layers=num_layers, hidden_size=hidden_size, batch_size=batch_size, seq_length=seq_length,
              coeff=coeff, bytes_per_element=bytes_per_element)
    return float(coeff * hidden_size * batch_size * seq_length * num_layers * bytes_per_element)


def sqrt_checkpointed_activation_bytes(*, num_layers: int, hidden_size: int, batch_size: int,
                                       seq_length: int) -> float:
    """Activation memory under checkpointing as sec 3.2 states it: Chen et al. 2016's sqrt(n) rule, which
    "reduces the activation memory by approximately the square root" -- the total of :func:`activation_bytes`
    divided by ``sqrt(num_layers)`` (segments of sqrt(n) layers; the checkpoints themselves are not counted)."""
    total = activation_bytes(num_layers=num_layers, hidden_size=hidden_size, batch_size=batch_size,
                             seq_length=seq_length)
    return total / math.sqrt(num_layers)


def recompute_overhead(*, hidden_size: int, batch_size: int, seq_length: int, backward_to_forward: float = 2.0
                       ) -> float:
    """Extra compute of activation checkpointing (sec 3.2, after Chen et al. 2016): one more forward pass of
    every layer over the forward + backward of a step. The backward pass runs two GEMMs (input and weight
    gradient) per forward GEMM, hence ``backward_to_forward`` = 2 and an overhead of 1/3."""
    _positive(backward_to_forward=backward_to_forward)
    forward = gpt_layer_forward_flops(batch_size=batch_size, seq_length=seq_length, hidden_size=hidden_size)
    return forward / (forward + backward_to_forward * forward)


def checkpoint_bytes_per_gpu(*, num_layers: int, hidden_size: int, batch_size: int, seq_length: int,
                             mp_size: int = 1, partitioned: bool = False, ckpt_interval: int = 1) -> float:
    """Activation checkpoints held by one GPU (sec 6.1): one fp16 ``batch x seq x hidden`` block input every
    ``ckpt_interval`` layers. Megatron-LM replicates it on each of the ``mp_size`` model-parallel GPUs
    (sec 4.2.1, insight 1); P_a partitions it, dividing the footprint by ``mp_size``."""
    _positive(num_layers=num_layers, hidden_size=hidden_size, batch_size=batch_size, seq_length=seq_length,
              mp_size=mp_size, ckpt_interval=ckpt_interval)
    replicated = FP16_BYTES * batch_size * seq_length * hidden_size * num_layers / ckpt_interval
    return replicated / mp_size if partitioned else float(replicated)


def pa_cpu_transfer_bytes(partition_bytes: float) -> float:
    """P_a+cpu data movement (sec 8): each partitioned checkpoint goes to CPU memory after the forward pass and
    comes back before its recomputation, twice the bytes P_a keeps on the GPU."""
    if partition_bytes < 0:
        raise ValueError(f"partition_bytes must be >= 0, got {partition_bytes}")
    return 2.0 * partition_bytes


def fused_buffer_bytes(num_params: float, bytes_per_element: int = FP32_BYTES) -> float:
    """A flattened buffer of all gradients or parameters (sec 3.2 temporary buffers, sec 6.2 C_B):
    ``num_params`` elements, fp32 (4 bytes) for gradient all-reduce or norm computation."""
    _positive(num_params=num_params, bytes_per_element=bytes_per_element)
    return float(num_params * bytes_per_element)


def mp_allreduce_volume_per_block(*, batch_size: int, seq_length: int, hidden_size: int) -> float:
    """Megatron-LM model-parallel communication of one transformer block per step with checkpointing (sec 8):
    six all-reduces (2 forward, 2 forward recompute, 2 backward) of a ``batch x seq x hidden`` message, each
    moving twice its message: ``12 x batch x seq x hidden`` elements."""
    _positive(batch_size=batch_size, seq_length=seq_length, hidden_size=hidden_size)
    message = batch_size * seq_length * hidden_size
    return float(tp_allreduces_per_layer(activation_recompute=True) * 2 * message)


def pa_allgather_volume_per_block(*, batch_size: int, seq_length: int, hidden_size: int) -> float:
    """P_a's extra communication per block (sec 8): one all-gather of the block's input checkpoint before its
    recomputation, moving its message, ``batch x seq x hidden`` elements."""
    _positive(batch_size=batch_size, seq_length=seq_length, hidden_size=hidden_size)
    return float(batch_size * seq_length * hidden_size)


def pa_overhead_fraction(*, batch_size: int, seq_length: int, hidden_size: int) -> float:
    """P_a's all-gather over Megatron-LM's model-parallel volume per block (sec 8: "less than 10 %")."""
    sizes = dict(batch_size=batch_size, seq_length=seq_length, hidden_size=hidden_size)
    return pa_allgather_volume_per_block(**sizes) / mp_allreduce_volume_per_block(**sizes)


def mp_to_zero_dp_comm_ratio(*, batch_size: int, seq_length: int, hidden_size: int, num_layers: int) -> float:
    """Model-parallel over ZeRO-DP communication per step (SC20 version, sec VII-C): MP moves
    ``12 batch seq hidden`` per block, ZeRO-DP at most 3 psi (P_os+g+p, sec 7.2.2) with psi = 12 hidden^2 per
    block (4 hidden^2 for QKV and output, 8 hidden^2 for the MLP)."""
    _positive(num_layers=num_layers)
    mp = num_layers * mp_allreduce_volume_per_block(batch_size=batch_size, seq_length=seq_length,
                                                    hidden_size=hidden_size)
    psi = params_per_block(hidden_size) * num_layers
    return mp / zero_communication_volume(stage=3, num_params=psi)


def checkpoint_arithmetic_intensity(*, hidden_size: int, batch_size: int, seq_length: int) -> float:
    """Computation per iteration over activation checkpoints per iteration (sec 4.2.1), in FLOPs per checkpoint
    byte, per layer: forward + recompute + backward (4 forward passes) of the layer's GEMMs over its fp16
    ``batch x seq x hidden`` checkpoint, ``48 hidden + 8 seq``: linear in the hidden size."""
    forward = gpt_layer_forward_flops(batch_size=batch_size, seq_length=seq_length, hidden_size=hidden_size)
    checkpoint = checkpoint_bytes_per_gpu(num_layers=1, hidden_size=hidden_size, batch_size=batch_size,
                                          seq_length=seq_length)
    return 4 * forward / checkpoint
