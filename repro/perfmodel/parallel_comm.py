"""Communication volume of each kind of parallelism, per iteration, as closed forms from the papers.

All volumes are *elements* or *bytes* per rank per iteration; ``bytes_per_element`` is 2 for fp16/bf16.
"""

from __future__ import annotations

from .collectives import allreduce_bytes_per_rank


# --- Tensor (intra-layer) parallelism: Megatron-LM sec 3 ---------------------------------------------------

def tp_allreduces_per_layer(*, activation_recompute: bool) -> int:
    """All-reduces per transformer layer and iteration.

    Megatron-LM sec 3 / Fig. 4: the ``g`` operator all-reduces after the attention and the MLP block in the
    forward pass (2), the ``f`` operator after them in the backward pass (2). With activation checkpointing the
    forward pass runs twice (ZeRO sec 8: "2 in forward recompute"), so 6.
    """
    return 6 if activation_recompute else 4


def tp_allreduce_message_bytes(*, micro_batch_size: int, seq_length: int, hidden_size: int,
                               bytes_per_element: int = 2) -> int:
    """Size of one tensor-parallel all-reduce: the ``b x s x h`` activation (Megatron-LM sec 3)."""
    return micro_batch_size * seq_length * hidden_size * bytes_per_element


def tp_bytes_per_layer(*, tp_size: int, micro_batch_size: int, seq_length: int, hidden_size: int,
                       activation_recompute: bool = True, bytes_per_element: int = 2) -> float:
    """Bytes each tensor-parallel rank sends per layer and micro-batch (ring all-reduce, 2(t-1)/t n each).

    As ``tp_size`` grows this approaches ZeRO sec 8's ``12 x batch x seq x hidden`` elements per block with
    recompute (6 all-reduces, each moving about twice its message).
    """
    message = tp_allreduce_message_bytes(micro_batch_size=micro_batch_size, seq_length=seq_length,
                                         hidden_size=hidden_size, bytes_per_element=bytes_per_element)
    count = tp_allreduces_per_layer(activation_recompute=activation_recompute)
    return count * allreduce_bytes_per_rank(tp_size, message)


# --- Pipeline parallelism: GPipe / PipeDream-1F1B (Narayanan et al. 2021, MT-NLG sec 2.3) --------------------

def pipeline_bubble_fraction(*, pp_size: int, num_micro_batches: int) -> float:
    """Bubble time over ideal compute time: ``(p - 1) / m`` (Narayanan et al. 2021 sec 2.2)."""
    if pp_size < 1 or num_micro_batches < 1:
        raise ValueError(f"pp_size and num_micro_batches must be >= 1, got {pp_size}, {num_micro_batches}")
    return (pp_size - 1) / num_micro_batches


def pipeline_idle_fraction(*, pp_size: int, num_micro_batches: int) -> float:
    """Fraction of the iteration each stage is idle: ``(p - 1) / (m + p - 1)``."""
    if pp_size < 1 or num_micro_batches < 1:
        raise ValueError(f"pp_size and num_micro_batches must be >= 1, got {pp_size}, {num_micro_batches}")
    return (pp_size - 1) / (num_micro_batches + pp_size - 1)


# --- Data parallelism and ZeRO: ZeRO sec 7 ------------------------------------------------------------------

def zero_communication_volume(*, stage: int, num_params: float) -> float:
    """Per-rank communication volume in elements per step (ZeRO sec 7), ``psi`` parameters, large ``N_d``.

    * stage 0 (plain DP), 1 (P_os) and 2 (P_os+g): reduce-scatter of gradients + all-gather of parameters
      = ``2 psi`` (sec 7.2.1, the same as the all-reduce of DP, sec 7.1);
    * stage 3 (P_os+g+p): parameter all-gather in forward and again in backward plus gradient reduce-scatter
      = ``3 psi``, a 1.5x increase (sec 7.2.2).
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if num_params < 0:
        raise ValueError(f"num_params must be >= 0, got {num_params}")
    return (3.0 if stage == 3 else 2.0) * num_params
