"""Pipeline parallelism (1F1B / PipeDream-flush) and the GPT stages of a tp x pp x dp layout (MT-NLG sec. 2.4).

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (the experiments' declarations, which `repro list` and the Slurm planning step import) does not import torch
through this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.lazy import lazy_names

#: name -> the module that defines it, imported at the name's first use
_HOMES = {
    **dict.fromkeys(("Schedule1F1B", "StepResult", "run_1f1b"), "repro.pipeline.engine"),
    **dict.fromkeys(("FixedCostStage",), "repro.pipeline.fixed_cost"),
    **dict.fromkeys(("IdleMeasurement", "fixed_cost_step", "measure_idle"), "repro.pipeline.measure"),
    **dict.fromkeys(("check_micro_batches", "layers_per_stage", "stage_layers"), "repro.pipeline.partition"),
    **dict.fromkeys(("Action", "bubble_fraction", "max_in_flight", "one_f_one_b"), "repro.pipeline.schedule"),
    **dict.fromkeys(("cut_to_stage", "stage_state_dict"), "repro.pipeline.stage"),
    **dict.fromkeys(("allreduce_tied_embedding_grad", "check_tied_embedding_equal"), "repro.pipeline.tied"),
    **dict.fromkeys(("StageEvent", "idle_fractions", "simulate_1f1b"), "repro.pipeline.timeline"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from repro.pipeline.engine import Schedule1F1B, StepResult, run_1f1b
    from repro.pipeline.fixed_cost import FixedCostStage
    from repro.pipeline.measure import IdleMeasurement, fixed_cost_step, measure_idle
    from repro.pipeline.partition import check_micro_batches, layers_per_stage, stage_layers
    from repro.pipeline.schedule import Action, bubble_fraction, max_in_flight, one_f_one_b
    from repro.pipeline.stage import cut_to_stage, stage_state_dict
    from repro.pipeline.tied import allreduce_tied_embedding_grad, check_tied_embedding_equal
    from repro.pipeline.timeline import StageEvent, idle_fractions, simulate_1f1b


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
