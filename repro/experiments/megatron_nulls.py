"""The null models of Megatron-LM's performance-model rows (``megatron_weak_scaling``): what a reviewer gets from the
model's three fit inputs alone (39 TFLOP/s on one GPU, 96 % on 64 GPUs of pure data parallelism, 82 % on the 4-way
model-parallel bar), with none of the op-level model's mechanism (DESIGN: "a claim beats its null"):

* a Fig. 5 model-parallel bar: the two simple extrapolations through the fit inputs against log2(GPUs), the bars'
  axis (each bar doubles the GPUs): a straight line (100 % at 1 GPU and the fitted 82 % at 4 give 91 % at 2 and
  73 % at 8) and a constant factor per doubling (90.6 % at 2, 74.3 % at 8); a row is decisive only when both miss;
* an MP+DP bar: each line's MP value x the fitted 64-GPU data-parallel factor (0.96), the bare product of the fit
  inputs (70.1 % and 71.3 % at 512 GPUs); the sustained PFLOP/s: that product x 512 x 39 TFLOP/s;
* Table 7 (heads): no heads effect: every head count at the model's own 32-head value, and at Table 7's own 32-head
  row (the paper's 77 %: a head count whose efficiency is within the tolerance of it shows no effect to decide);
* Table 8 (strong scaling): perfect scaling, ``g`` GPUs run ``g`` times as fast;
* Table 2 (days per epoch): the iteration's model FLOPs at 39 TFLOP/s x the DP factor x each line's MP factor per
  GPU, the same products of the fit inputs as a time.

The nulls are fixed before any comparison and use the same tolerance as the model's value; the report decides
(``repro.verdicts``: with several nulls, any one within the tolerance makes the row not decisive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from repro.perfmodel.flops import gpt_flops_per_iteration
from repro.perfmodel.megatron import GPT2_GLOBAL_BATCH, SECONDS_PER_DAY, TrainingRun
from repro.vocabulary import Null


@dataclass(frozen=True)
class FitInputs:
    """The paper numbers the model is fitted on: TFLOP/s on one GPU, the 64-GPU pure data-parallel efficiency (%)
    and the efficiency (%) of the ``mp_size``-way model-parallel bar."""

    baseline_tflops: float
    dp64_efficiency: float
    mp_efficiency: float
    mp_size: int

    def __post_init__(self) -> None:
        if self.mp_size < 2 or not 0 < self.mp_efficiency <= 100 or not 0 < self.dp64_efficiency <= 100:
            raise ValueError(f"fit inputs must be an MP bar of >= 2 GPUs and efficiencies in (0, 100]: {self}")


def basis_key(*, layers: int, hidden: int, heads: int, mp: int, dp: int) -> str:
    """The independent quantity a model row is computed from: the model's iteration time of one GPT shape on one
    layout (batch 8 per model-parallel replica). A Fig. 5 bar, its PFLOP/s and a Table 2 run of the same shape and
    layout share it, so the report counts it once."""
    return f"megatron_weak_scaling:iteration:l{layers}:h{hidden}:a{heads}:mp{mp}:dp{dp}"


def straight_mp_line(gpus: int, inputs: FitInputs) -> float:
    """Efficiency (%) of ``gpus``-way model parallelism on the straight line through (1 GPU, 100 %) and the fitted
    bar, against log2(GPUs)."""
    return 100 + (inputs.mp_efficiency - 100) * math.log2(gpus) / math.log2(inputs.mp_size)


def geometric_mp_line(gpus: int, inputs: FitInputs) -> float:
    """The same two points joined by a constant factor per doubling of the GPUs."""
    return 100 * (inputs.mp_efficiency / 100) ** (math.log2(gpus) / math.log2(inputs.mp_size))


#: The two lines through the fit inputs: (name, function of (gpus, inputs)).
LINES = (("a straight line", straight_mp_line), ("a constant factor per doubling", geometric_mp_line))


def _line_name(kind: str, inputs: FitInputs) -> str:
    return (f"{kind} through the fit inputs against log2 GPUs (100 % at 1 GPU, {inputs.mp_efficiency:g} % "
            f"at {inputs.mp_size})")


def mp_bar_null(mp: int, inputs: FitInputs) -> tuple[Null, ...]:
    """The nulls of the ``mp``-way model-parallel bar: each line's value."""
    return tuple(Null(_line_name(kind, inputs), line(mp, inputs)) for kind, line in LINES)


def mpdp_bar_null(mp: int, inputs: FitInputs) -> tuple[Null, ...]:
    """The nulls of the ``mp``-way MP x 64-way DP bar: each line's MP value x the fitted DP factor."""
    return tuple(Null(f"the product of the fit inputs: {_line_name(kind, inputs)} x the 64-GPU data-parallel "
                      f"factor ({inputs.dp64_efficiency:g} %)", line(mp, inputs) * inputs.dp64_efficiency / 100)
                 for kind, line in LINES)


def sustained_null(inputs: FitInputs, *, mp: int = 8, gpus: int = 512) -> tuple[Null, ...]:
    """The nulls of the 512-GPU run's PFLOP/s: the 512-GPU bar's nulls x 512 x the 1-GPU TFLOP/s."""
    return tuple(Null(f"{bar.name} x {gpus} GPUs x {inputs.baseline_tflops:g} TFLOP/s",
                      bar.value / 100 * gpus * inputs.baseline_tflops / 1e3) for bar in mpdp_bar_null(mp, inputs))


def heads_null(value_at_reference: float, reference_heads: int, paper_at_reference: float) -> tuple[Null, ...]:
    """Table 7's nulls: the heads make no difference, every head count at the model's value for the reference
    configuration (Table 1's 8.3B with ``reference_heads`` heads), or at the paper's own row for it."""
    return (Null(f"no heads effect: the model's own {reference_heads}-head value", value_at_reference),
            Null(f"no heads effect: Table 7's own {reference_heads}-head row", float(paper_at_reference)))


def days_null(run: TrainingRun, inputs: FitInputs, iterations_per_epoch: float) -> tuple[Null, ...]:
    """Table 2's nulls: an epoch at the fit inputs' product per GPU (39 TFLOP/s x the DP factor x each line's MP
    factor), with the paper's FLOPs per iteration (96 B s l h^2 (1 + s/6h + V/16lh))."""
    model = run.model()
    flops = gpt_flops_per_iteration(batch_size=GPT2_GLOBAL_BATCH, seq_length=model.seq_length,
                                    num_layers=model.num_layers, hidden_size=model.hidden_size,
                                    vocab_size=model.vocab_size)
    nulls = []
    for kind, line in LINES:
        rate = inputs.baseline_tflops * 1e12 * inputs.dp64_efficiency / 100 * line(run.mp_size, inputs) / 100
        days = iterations_per_epoch * flops / (run.gpus * rate) / SECONDS_PER_DAY
        nulls.append(Null(f"the product of the fit inputs as a time: FLOPs at {inputs.baseline_tflops:g} TFLOP/s x "
                          f"the {inputs.dp64_efficiency:g} % DP factor x {kind}'s {run.mp_size}-way MP factor per GPU",
                          days))
    return tuple(nulls)
