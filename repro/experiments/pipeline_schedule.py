"""The 1F1B pipeline bubble: measured idle share of each stage against (p-1)/(m+p-1) (Narayanan et al. 2021
sec. 2.2.1, the schedule MT-NLG trains with, sec. 2.4).

Two kinds of stages run the real schedule (``repro.pipeline.engine``: p2p isend/irecv over the pipeline group):

* ``fixed``: :class:`~repro.pipeline.fixed_cost.FixedCostStage`, a linear layer plus a fixed 30 ms forward /
  60 ms backward wait, so every stage does the same work per micro-batch however loaded the CPU is; this isolates
  the schedule, and is what the bubble formula describes;
* ``gpt``: GPT stages (``repro.pipeline.stage``) doing real compute on the CPU; stages compete for cores, so their
  work per micro-batch is not equal and the idle share moves away from the formula (reported as measured).

Idle share of a stage = 1 - (its forward+backward time) / (step span over all stages), median of 3 steps after a
warm-up step. Every point also carries the schedule simulator's value (equal to the formula) and, for scale, the
bubble of MT-NLG 530B's own pipeline (35 stages; 1920 sequences / dp 8 = 240 micro-batches of 1 per step).
No row of paper_claims.csv states a bubble, so this experiment maps no claim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.dist.ledger import CollectiveLedger
from repro.experiments.base import Experiment, Point, RunContext
from repro.models import GPTConfig
from repro.pipeline.schedule import bubble_fraction
from repro.pipeline.timeline import idle_fractions, simulate_1f1b

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    from repro.dist.comm import CommGroup

FORWARD_S, BACKWARD_S = 0.03, 0.06
MTNLG_PP, MTNLG_MICRO_BATCHES = 35, 240


def _pipeline_group(world_size: int) -> CommGroup:
    """All ranks form one pipeline (tp = dp = 1): the pipeline group is the world."""
    from repro.dist.comm import new_comm_group

    return new_comm_group("pp", list(range(world_size)), CollectiveLedger())


def _gpt_step(pp_size: int, params: dict):
    """A ``run_step`` training a small GPT split into ``pp_size`` stages (real compute), and its pipeline group."""
    from repro.training import PipelineTrainer, TrainSettings, synthetic_tokens
    from repro.dist.groups import init_parallel

    groups = init_parallel(pp=pp_size)
    config = GPTConfig(vocab_size=256, hidden_size=params["hidden"], num_layers=params["layers"],
                       num_attention_heads=4, max_position_embeddings=params["seq_len"], hidden_dropout=0.0,
                       attention_dropout=0.0)
    trainer = PipelineTrainer(config, groups, TrainSettings(steps=1, micro_batches=params["m"], micro_batch_size=2,
                                                            seq_len=params["seq_len"]))
    batch = synthetic_tokens(vocab_size=256, seq_len=params["seq_len"], batch_size=trainer.global_batch_size,
                             steps=1)[0]

    def run_step():
        trainer.step(batch)
        return trainer.last_result

    return run_step, groups.pp


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.pipeline.measure import IdleMeasurement, fixed_cost_step, measure_idle
    from repro.dist.comm import CommGroup

    params = dict(point.params)
    pp_size, m = params["pp"], params["m"]
    if ctx.world_size != pp_size:
        raise ValueError(f"point {point.name} needs world size = pp = {pp_size}, got {ctx.world_size}")
    if params["stage"] == "fixed":
        group = _pipeline_group(pp_size) if pp_size > 1 else CommGroup.single("pp")
        run_step = fixed_cost_step(group, num_micro_batches=m, forward_s=FORWARD_S, backward_s=BACKWARD_S)
    else:
        run_step, group = _gpt_step(pp_size, params)
    measured: IdleMeasurement = measure_idle(run_step, group, steps=3, warmup=1)
    formula = bubble_fraction(pp_size, m)
    simulated = idle_fractions(simulate_1f1b(pp_size, m), pp_size)[0]
    config = {"pp": pp_size, "micro_batches": m, "stage_kind": params["stage"]}
    rows = [
        {"metric": "idle_fraction", "value": idle, "unit": "fraction", "stage": r, **config}
        for r, idle in enumerate(measured.idle_per_stage)
    ]
    rows += [
        {"metric": "recv_wait_fraction", "value": wait, "unit": "fraction", "stage": r, **config}
        for r, wait in enumerate(measured.recv_wait_per_stage)
    ]
    rows += [
        {"metric": "idle_fraction_mean", "value": measured.mean_idle, "unit": "fraction", **config},
        {"metric": "bubble_formula", "value": formula, "unit": "fraction", **config},
        {"metric": "bubble_simulated", "value": simulated, "unit": "fraction", **config},
        {"metric": "idle_minus_formula", "value": measured.mean_idle - formula, "unit": "fraction", **config},
        {"metric": "step_time", "value": measured.step_s, "unit": "s", **config},
        {"metric": "bubble_formula_mtnlg_530b", "value": bubble_fraction(MTNLG_PP, MTNLG_MICRO_BATCHES),
         "unit": "fraction", "pp": MTNLG_PP, "micro_batches": MTNLG_MICRO_BATCHES},
    ]
    if params["stage"] == "fixed":
        rows.append({"metric": "step_time_ideal", "value": (m + pp_size - 1) * (FORWARD_S + BACKWARD_S),
                     "unit": "s", **config})
    return rows


def _fixed(pp_size: int, m: int) -> Point:
    return Point(f"fixed-pp{pp_size}-m{m}", {"stage": "fixed", "pp": pp_size, "m": m}, world_size=pp_size,
                 memory_gib=0.4)


def _gpt(pp_size: int, m: int, *, layers: int, hidden: int, seq_len: int) -> Point:
    return Point(f"gpt-pp{pp_size}-m{m}", {"stage": "gpt", "pp": pp_size, "m": m, "layers": layers,
                                           "hidden": hidden, "seq_len": seq_len}, world_size=pp_size, memory_gib=0.5)


# pp > 2 GPT points wait for init_parallel to give middle stages an embedding group (see the pipeline report);
# fixed-cost points build their pipeline group directly.
POINTS = {
    "ci": (
        _fixed(2, 2), _fixed(2, 4), _fixed(2, 8), _fixed(4, 4), _fixed(4, 8),
        _gpt(2, 4, layers=4, hidden=256, seq_len=128), _gpt(2, 8, layers=4, hidden=256, seq_len=128),
    ),
    "paper": (
        *(_fixed(p, k * p) for p in (2, 4, 8) for k in (1, 2, 4, 8)),
        _gpt(2, 4, layers=8, hidden=256, seq_len=128), _gpt(2, 16, layers=8, hidden=256, seq_len=128),
    ),
}

METRICS = ("idle_fraction", "recv_wait_fraction", "idle_fraction_mean", "bubble_formula", "bubble_simulated",
           "idle_minus_formula", "step_time", "step_time_ideal", "bubble_formula_mtnlg_530b")


def _no_claims(rows) -> list:
    """No paper claim is decided here; a module-level function (not a lambda) so that the experiment can be pickled
    to ranks started from a forkserver (a GPU build of torch)."""
    return []


EXPERIMENT = Experiment(
    name="pipeline_schedule",
    paper="mt_nlg_2022",
    title="1F1B pipeline bubble: measured idle share per stage vs (p-1)/(m+p-1)",
    points=POINTS,
    run_point=run_point,
    claims=_no_claims,
    description=__doc__ or "",
    budget_s={"ci": 40.0, "paper": 1800.0},
    metrics=METRICS,
)
