"""ZeRO-Infinity (Rajbhandari et al. 2021) memory requirements and bandwidth-efficiency relation, sec 3-4.

Symbols as in the paper: ``nl`` layers, ``hd`` hidden size, ``bsz`` batch, ``seq`` sequence length, ``ci``
layers between activation checkpoints, ``peak_tp`` achievable peak FLOP/s of one GPU, ``bw`` bandwidth between
GPU and where the data lives, ``ait`` arithmetic intensity (FLOPs per byte moved).

Provenance: the paper's body was read only through a secondary transcription (paper_claims.csv rows marked
``secondary``, source ZINF-SEC); the formulas below are those rows. Model-state bytes use 16 B/param (ZeRO sec
3.1); a second secondary source says 20 B/param (``model_state_bytes(..., bytes_per_param=20)``).
"""

from __future__ import annotations


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def block_weight_shapes(hd: int) -> dict[str, tuple[int, int]]:
    """The weight matrices of one transformer block (sec 3, ZINF-SEC notes): QKV, attention output, MLP."""
    _positive(hd=hd)
    return {"qkv": (hd, 3 * hd), "attn_out": (hd, hd), "mlp_in": (hd, 4 * hd), "mlp_out": (4 * hd, hd)}


def params_per_block(hd: int) -> float:
    """Parameters of one transformer block, the sum of :func:`block_weight_shapes` (biases and layer norms,
    O(hd), are left out as in the paper): ``3 hd^2 + hd^2 + 4 hd^2 + 4 hd^2 = 12 hd^2``."""
    return float(sum(rows * cols for rows, cols in block_weight_shapes(hd).values()))


def model_state_bytes(*, nl: int, hd: int, bytes_per_param: float = 16.0) -> float:
    """Model states (fp16 params and grads, fp32 Adam states): ``16 x 12 nl hd^2 = 192 nl hd^2`` bytes."""
    _positive(nl=nl, hd=hd, bytes_per_param=bytes_per_param)
    return bytes_per_param * nl * params_per_block(hd)


def activation_checkpoint_bytes(*, bsz: int, seq: int, hd: int, nl: int, ci: int = 1) -> float:
    """Activation checkpoints: one fp16 ``bsz x seq x hd`` tensor every ``ci`` layers, ``2 bsz seq hd nl / ci``."""
    _positive(bsz=bsz, seq=seq, hd=hd, nl=nl, ci=ci)
    return 2.0 * bsz * seq * hd * nl / ci


def model_state_working_memory(hd: int) -> float:
    """MSWM: fp32 parameters + gradients of the largest operator (the hd x 4hd linear), ``4 x hd x 4hd`` bytes."""
    _positive(hd=hd)
    return 4.0 * hd * 4 * hd


def activation_working_memory(*, bsz: int, seq: int, hd: int, attn_heads: int, ci: int = 1) -> float:
    """AWM: activations recomputed between two checkpoints, ``bsz seq ci (16 hd + 2 attn_heads seq)`` bytes."""
    _positive(bsz=bsz, seq=seq, hd=hd, attn_heads=attn_heads, ci=ci)
    return float(bsz * seq * ci * (16 * hd + 2 * attn_heads * seq))


def flops_per_iteration(*, bsz: int, seq: int, nl: int, hd: int) -> float:
    """Computation per iteration with activation checkpointing (sec 4): 2 FLOPs per multiply-add, for every
    token and every block parameter, over 4 passes (forward, recompute forward, backward = 2 forwards):
    ``2 x 4 x bsz seq nl x params_per_block = 2 x 4 x 12 bsz seq nl hd^2`` (attention scores left out)."""
    _positive(bsz=bsz, seq=seq, nl=nl, hd=hd)
    return 2.0 * 4 * bsz * seq * nl * params_per_block(hd)


def bytes_moved_params_grads(num_params: float) -> float:
    """Parameter and gradient traffic per iteration (sec 4, ZINF-SEC): ``2 x 4 x params`` bytes."""
    _positive(num_params=num_params)
    return 2.0 * 4 * num_params


def bytes_moved_optimizer_states(num_params: float) -> float:
    """Optimizer-state traffic per iteration (sec 4, ZINF-SEC): ``2 x 16 x params`` bytes (read and write)."""
    _positive(num_params=num_params)
    return 2.0 * 16 * num_params


def bytes_moved_activation_checkpoints(*, nl: int, hd: int, seq: int, bsz: int, ci: int = 1) -> float:
    """Activation-checkpoint traffic per iteration (sec 4, ZINF-SEC): ``4 (nl / ci) hd seq bsz`` bytes, i.e.
    each fp16 checkpoint (:func:`activation_checkpoint_bytes`) written once and read once."""
    return 2.0 * activation_checkpoint_bytes(bsz=bsz, seq=seq, hd=hd, nl=nl, ci=ci)


def arithmetic_intensity(*, flops: float, bytes_moved: float) -> float:
    """AIT (sec 4): computation per iteration over the bytes moved per iteration, FLOPs per byte."""
    _positive(flops=flops, bytes_moved=bytes_moved)
    return flops / bytes_moved


def ait_params_grads(*, bsz: int, seq: int) -> float:
    """AIT w.r.t. parameters and gradients (moved 2 x 4 x params bytes per iteration): ``seq x bsz``."""
    _positive(bsz=bsz, seq=seq)
    return float(seq * bsz)


def ait_optimizer_states(*, bsz: int, seq: int) -> float:
    """AIT w.r.t. optimizer states (moved 2 x 16 x params bytes per iteration): ``seq x bsz / 4``."""
    return ait_params_grads(bsz=bsz, seq=seq) / 4.0


def ait_activation_checkpoints(*, hd: int, ci: int = 1) -> float:
    """AIT w.r.t. activation checkpoints (moved 4 (nl/ci) hd seq bsz bytes): ``24 hd ci``."""
    _positive(hd=hd, ci=ci)
    return 24.0 * hd * ci


def efficiency(*, ait: float, bandwidth: float, peak_flops: float) -> float:
    """Fraction of peak with no compute/communication overlap: ``ait bw / (ait bw + peak_tp)`` (sec 4).

    compute_time = flops / peak_tp and communication_time = flops / (ait bw), so
    efficiency = compute / (compute + communication)."""
    _positive(ait=ait, bandwidth=bandwidth, peak_flops=peak_flops)
    return ait * bandwidth / (ait * bandwidth + peak_flops)


def bandwidth_for_efficiency(*, target: float, ait: float, peak_flops: float) -> float:
    """The bandwidth at which :func:`efficiency` equals ``target``: ``bw = target peak / ((1 - target) ait)``."""
    if not 0 < target < 1:
        raise ValueError(f"target efficiency must be in (0, 1), got {target}")
    _positive(ait=ait, peak_flops=peak_flops)
    return target * peak_flops / ((1 - target) * ait)
