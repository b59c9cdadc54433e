"""Closed-form FLOP and parameter counts for GPT-style transformers.

Symbols as in the papers: B global batch (sequences), s sequence length, l layers, h hidden size, V vocabulary.
"""

from __future__ import annotations


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def gpt_flops_per_iteration(
    *, batch_size: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int,
    activation_recompute: bool = True,
) -> float:
    """Model FLOPs of one training iteration (forward + backward [+ recompute forward]).

    Narayanan et al. 2021 (the formula MT-NLG sec 2.4 and Megatron use to report TFLOP/s):
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` with full activation recomputation. Without recomputation the
    transformer-layer part is 3/4 of that (72 instead of 96); the logit layer (``6 B s h V``) is never recomputed.
    Only matrix multiplications are counted (2 FLOPs per multiply-add).
    """
    _check_positive(batch_size=batch_size, seq_length=seq_length, num_layers=num_layers,
                    hidden_size=hidden_size, vocab_size=vocab_size)
    b, s, l, h, v = batch_size, seq_length, num_layers, hidden_size, vocab_size
    layer_passes = 4 if activation_recompute else 3  # fwd (+ recompute fwd) + bwd (2x fwd)
    layers = layer_passes * 24 * b * s * l * h * h * (1 + s / (6 * h))
    logits = 6 * b * s * h * v
    return float(layers + logits)


def gpt_layer_forward_flops(*, batch_size: int, seq_length: int, hidden_size: int) -> float:
    """Forward GEMM FLOPs of one transformer layer: ``24 b s h^2 + 4 b s^2 h`` (QKV 6bsh^2, scores 2bs^2h,
    context 2bs^2h, projection 2bsh^2, MLP 16bsh^2). Narayanan et al. 2021, appendix."""
    _check_positive(batch_size=batch_size, seq_length=seq_length, hidden_size=hidden_size)
    b, s, h = batch_size, seq_length, hidden_size
    return float(24 * b * s * h * h + 4 * b * s * s * h)


def gpt_param_count(*, num_layers: int, hidden_size: int, vocab_size: int, seq_length: int) -> float:
    """Parameters of a GPT with learned position embeddings and tied input/output embedding.

    MT-NLG sec 3 / Narayanan et al. 2021: ``12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))``, i.e. per layer
    12h^2 weights + 13h biases and layer-norm parameters, plus (V + s) h embeddings. (Megatron-LM's own count,
    with the final layer norm's 2h, is the integrator's ``repro.models.params``.)
    """
    _check_positive(num_layers=num_layers, hidden_size=hidden_size, vocab_size=vocab_size, seq_length=seq_length)
    l, h, v, s = num_layers, hidden_size, vocab_size, seq_length
    return float(12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h)))


def achieved_flops_per_device(*, flops_per_iteration: float, iteration_time_s: float, num_devices: int) -> float:
    """Per-device throughput as the papers report it: model FLOPs / (time x devices)."""
    _check_positive(flops_per_iteration=flops_per_iteration, iteration_time_s=iteration_time_s,
                    num_devices=num_devices)
    return flops_per_iteration / (iteration_time_s * num_devices)
