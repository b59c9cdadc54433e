"""Which layers each pipeline stage owns, and the checks a pipeline configuration must pass.

MT-NLG sec. 2.4 / Megatron (Narayanan et al. 2021, sec. 2.2): the ``L`` transformer layers are split evenly across
``p`` stages, stage ``r`` holding layers ``[r L/p, (r+1) L/p)``; the first stage also holds the input embedding and
the last the final layer norm and the output layer tied to the embedding. MT-NLG 530B: 105 layers / 35 stages = 3.
"""

from __future__ import annotations


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def layers_per_stage(num_layers: int, pp_size: int) -> int:
    """``L / p``; pipeline parallelism needs ``p`` to divide ``L`` so that every stage does equal work."""
    _positive("num_layers", num_layers)
    _positive("pp_size", pp_size)
    if num_layers % pp_size != 0:
        raise ValueError(
            f"num_layers={num_layers} is not divisible by the pipeline-parallel size pp={pp_size}: "
            "every stage must hold the same number of layers"
        )
    return num_layers // pp_size


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Global indices of the layers stage ``pp_rank`` holds."""
    per_stage = layers_per_stage(num_layers, pp_size)
    if not isinstance(pp_rank, int) or not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank={pp_rank!r} is outside [0, pp_size={pp_size})")
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def check_micro_batches(num_micro_batches: int, pp_size: int) -> None:
    """1F1B fills the pipeline with ``p`` micro-batches before its steady state; fewer than ``p`` is refused
    (the pipeline would never fill, and the bubble (p-1)/(m+p-1) would exceed one half)."""
    _positive("num_micro_batches", num_micro_batches)
    _positive("pp_size", pp_size)
    if num_micro_batches < pp_size:
        raise ValueError(
            f"num_micro_batches={num_micro_batches} is fewer than the pipeline stages pp={pp_size}: "
            "1F1B needs at least one micro-batch per stage (m >= p)"
        )
