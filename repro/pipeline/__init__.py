"""Pipeline parallelism (1F1B / PipeDream-flush) and the GPT stages of a tp x pp x dp layout (MT-NLG sec. 2.4)."""

from repro.pipeline.engine import Schedule1F1B, StepResult, run_1f1b
from repro.pipeline.fixed_cost import FixedCostStage
from repro.pipeline.measure import IdleMeasurement, fixed_cost_step, measure_idle
from repro.pipeline.partition import check_micro_batches, layers_per_stage, stage_layers
from repro.pipeline.schedule import Action, bubble_fraction, max_in_flight, one_f_one_b
from repro.pipeline.stage import cut_to_stage, stage_state_dict
from repro.pipeline.tied import allreduce_tied_embedding_grad, check_tied_embedding_equal
from repro.pipeline.timeline import StageEvent, idle_fractions, simulate_1f1b

__all__ = [
    "Action", "FixedCostStage", "Schedule1F1B", "IdleMeasurement", "fixed_cost_step", "measure_idle", "StageEvent", "StepResult", "allreduce_tied_embedding_grad", "bubble_fraction",
    "check_micro_batches", "check_tied_embedding_equal", "cut_to_stage", "idle_fractions", "layers_per_stage", "max_in_flight",
    "one_f_one_b", "run_1f1b", "simulate_1f1b", "stage_layers", "stage_state_dict",
]
