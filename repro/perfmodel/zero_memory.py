"""ZeRO's closed-form model-state memory (Rajbhandari et al. 2019, sec 3.1 and 5, Tables 1 and 2).

Mixed-precision Adam keeps, per parameter, 2 bytes of fp16 weights, 2 of fp16 gradients and ``K`` = 12 of
optimizer state (fp32 weights, momentum, variance): ``(2 + 2 + K) psi`` bytes (sec 3.1). With ``N_d``-way data
parallelism the stages partition more of it (sec 5.1-5.3):

==========  ==============================  ==================
stage        name                            bytes per device
==========  ==============================  ==================
0            baseline data parallelism       (2 + 2 + K) psi
1            P_os                            4 psi + K psi / N_d
2            P_os+g                          2 psi + (2 + K) psi / N_d
3            P_os+g+p                        (2 + 2 + K) psi / N_d
==========  ==============================  ==================
"""

from __future__ import annotations

K_ADAM = 12  # sec 3.1: optimizer-state bytes per parameter for mixed-precision Adam
STAGE_NAMES = {0: "baseline", 1: "Pos", 2: "Pos+g", 3: "Pos+g+p"}


def _check(num_params: float, stage: int, dp_size: int, k: float) -> None:
    if num_params < 0:
        raise ValueError(f"num_params must be >= 0, got {num_params}")
    if stage not in STAGE_NAMES:
        raise ValueError(f"ZeRO stage must be one of {sorted(STAGE_NAMES)}, got {stage!r}")
    if dp_size < 1:
        raise ValueError(f"dp_size (N_d) must be >= 1, got {dp_size}")
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")


def model_state_bytes(*, num_params: float, stage: int, dp_size: int, k: float = K_ADAM) -> float:
    """Model-state bytes per device for ZeRO ``stage`` (0 = plain DP) on ``dp_size`` ranks (table above)."""
    _check(num_params, stage, dp_size, k)
    psi, nd = num_params, dp_size
    if stage == 0:
        return (2 + 2 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / nd
    if stage == 2:
        return 2 * psi + (2 + k) * psi / nd
    return (2 + 2 + k) * psi / nd


def bytes_per_param(*, stage: int, dp_size: int, k: float = K_ADAM) -> float:
    """Model-state bytes per parameter per device (``model_state_bytes`` with psi = 1)."""
    return model_state_bytes(num_params=1.0, stage=stage, dp_size=dp_size, k=k)


def max_params(*, device_bytes: float, stage: int, dp_size: int, mp_size: int = 1, k: float = K_ADAM) -> float:
    """Largest model whose model states fit: ``mp_size * device_bytes / bytes_per_param`` (Table 2, theoretical
    columns: ZeRO partitions across N_d, model parallelism divides the model ``mp_size`` ways on top)."""
    if device_bytes <= 0 or mp_size < 1:
        raise ValueError(f"device_bytes must be > 0 and mp_size >= 1, got {device_bytes}, {mp_size}")
    return mp_size * device_bytes / bytes_per_param(stage=stage, dp_size=dp_size, k=k)


def memory_reduction(*, stage: int, dp_size: int, mp_size: int = 1, k: float = K_ADAM) -> float:
    """Model-state memory of plain DP over ZeRO ``stage`` combined with ``mp_size``-way model parallelism, per
    device (sec 1: with all three stages, ``N_d x N_m``). Model parallelism splits the model ``mp_size`` ways,
    ZeRO then partitions each slice across the ``dp_size`` data-parallel ranks."""
    if mp_size < 1:
        raise ValueError(f"mp_size (N_m) must be >= 1, got {mp_size}")
    zero_mp = bytes_per_param(stage=stage, dp_size=dp_size, k=k) / mp_size
    return bytes_per_param(stage=0, dp_size=1, k=k) / zero_mp
