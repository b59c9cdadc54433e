"""The null models of Megatron-LM's performance-model rows (``megatron_weak_scaling``): what a reviewer gets from the
model's three fit inputs alone (39 TFLOP/s on one GPU, 96 % on 64 GPUs of pure data parallelism, 82 % on the 4-way
model-parallel bar), with none of the op-level model's mechanism (DESIGN: "a claim beats its null"):

* a Fig. 5 model-parallel bar: a straight line through the fit inputs against log2(GPUs), the bars' axis (each bar
  doubles the GPUs): 100 % at 1 GPU and the fitted 82 % at 4 give 91 % at 2 and 73 % at 8;
* an MP+DP bar: that line's MP value x the fitted 64-GPU data-parallel factor (0.96), the bare product of the fit
  inputs (70.1 % at 512 GPUs); the sustained PFLOP/s: that product x 512 x 39 TFLOP/s;
* Table 7 (heads): no heads effect: every head count at the model's own 32-head value;
* Table 8 (strong scaling): perfect scaling, ``g`` GPUs run ``g`` times as fast;
* Table 2 (days per epoch): the iteration's model FLOPs at 39 TFLOP/s x the DP factor x the line's MP factor per GPU,
  the same product of the fit inputs as a time.

The nulls are fixed before any comparison and use the same tolerance as the model's value; the report decides
(``repro.verdicts``). A per-doubling (geometric) line through the same inputs is the other simple extrapolation a
reviewer might draw; :func:`geometric_mp_line` gives it for the rows' notes.
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
    """The same two points joined by a constant factor per doubling of the GPUs (for notes only)."""
    return 100 * (inputs.mp_efficiency / 100) ** (math.log2(gpus) / math.log2(inputs.mp_size))


def _line_name(inputs: FitInputs) -> str:
    return (f"a straight line through the fit inputs against log2 GPUs (100 % at 1 GPU, {inputs.mp_efficiency:g} % "
            f"at {inputs.mp_size})")


def mp_bar_null(mp: int, inputs: FitInputs) -> Null:
    """The null of the ``mp``-way model-parallel bar."""
    return Null(_line_name(inputs), straight_mp_line(mp, inputs))


def mpdp_bar_null(mp: int, inputs: FitInputs) -> Null:
    """The null of the ``mp``-way MP x 64-way DP bar: the line's MP value x the fitted DP factor."""
    return Null(f"the product of the fit inputs: {_line_name(inputs)} x the 64-GPU data-parallel factor "
                f"({inputs.dp64_efficiency:g} %)", straight_mp_line(mp, inputs) * inputs.dp64_efficiency / 100)


def sustained_null(inputs: FitInputs, *, mp: int = 8, gpus: int = 512) -> Null:
    """The null of the 512-GPU run's PFLOP/s: the 512-GPU bar's null x 512 x the 1-GPU TFLOP/s."""
    value = mpdp_bar_null(mp, inputs).value / 100 * gpus * inputs.baseline_tflops / 1e3
    return Null(f"the product of the fit inputs x {gpus} GPUs x {inputs.baseline_tflops:g} TFLOP/s", value)


def heads_null(value_at_reference: float, reference_heads: int) -> Null:
    """Table 7's null: the heads make no difference, every head count at the model's value for the reference
    configuration (Table 1's 8.3B with ``reference_heads`` heads)."""
    return Null(f"no heads effect: the model's own {reference_heads}-head value", value_at_reference)


def days_null(run: TrainingRun, inputs: FitInputs, iterations_per_epoch: float) -> Null:
    """Table 2's null: an epoch at the fit inputs' product per GPU (39 TFLOP/s x the DP factor x the line's MP
    factor), with the paper's FLOPs per iteration (96 B s l h^2 (1 + s/6h + V/16lh))."""
    model = run.model()
    flops = gpt_flops_per_iteration(batch_size=GPT2_GLOBAL_BATCH, seq_length=model.seq_length,
                                    num_layers=model.num_layers, hidden_size=model.hidden_size,
                                    vocab_size=model.vocab_size)
    rate = (inputs.baseline_tflops * 1e12 * inputs.dp64_efficiency / 100
            * straight_mp_line(run.mp_size, inputs) / 100)
    days = iterations_per_epoch * flops / (run.gpus * rate) / SECONDS_PER_DAY
    return Null(f"the product of the fit inputs as a time: FLOPs at {inputs.baseline_tflops:g} TFLOP/s x the "
                f"{inputs.dp64_efficiency:g} % DP factor x the straight line's {run.mp_size}-way MP factor per GPU",
                days)
