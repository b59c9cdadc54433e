"""MT-NLG's 3-D parallelism (sec. 2.4: tensor within a node, pipeline across nodes, data parallelism with ZeRO-1
across replicas) run at tiny scale on CPU: tp=2 x pp=2 x dp=1 (4 ranks) and tp=2 x pp=2 x dp=2 (8 ranks).

A small GPT with MT-NLG's recipe where it fits a tiny run (Adam betas 0.9/0.95, eps 1e-8, gradient clipping at
1.0, weight decay 0.1, init std sqrt(1/(3h)); the learning rate is raised so that 20 steps visibly learn) is
trained on a synthetic learnable token stream under the 3-D layout: layers split evenly over the stages, 1F1B over
micro-batches with p2p activations and gradients, the tied embedding's gradient summed over first and last stage,
and ZeRO-1 (repro.zero) over dp. Rank 0 then trains the same model in one process (tp = pp = dp = 1) on the same
batches and reports the largest loss difference, together with the communication each group carried (ledger) and
the stages' measured idle share next to the 1F1B bubble (p-1)/(m+p-1).

The 530B model itself (8 x 35 x 8 on 2240 A100s) needs GPUs: its throughput claims are marked "needs GPU" here;
its layout arithmetic (GPUs per replica, dp per node count) is computed with the same rank grid the tiny run uses.
That grid is built from the paper's printed tp, pp, GPUs per node and node counts alone, so its rows are the paper's
own arithmetic (evidence ``consistency``), as ``mtnlg_layout``'s rows of the same quantities are.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from repro.verdicts import check_value, needs_gpu
from repro.experiments.base import Experiment, Point, RunContext
from repro.vocabulary import ClaimCheck
from repro.models import GPTConfig
from repro.paper import evidence_from, printed
from repro.pipeline.partition import layers_per_stage
from repro.pipeline.schedule import bubble_fraction

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    import torch

    from repro.training import TrainSettings

PAPER = "mt_nlg_2022"
#: MT-NLG 530B's layout as the paper prints it (sec 2.4, 3; secondary sources in paper_claims.csv): 8-way tensor
#: parallelism inside a DGX A100 node of 8 GPUs (the "560 x 8" of ``gpus_total``), 35-way pipeline parallelism over
#: 105 layers, and the node counts of its throughput runs and of Selene. The layout rows are computed from these
#: alone, so :func:`repro.paper.evidence_from` makes them the paper's arithmetic (``consistency``).
MTNLG_TP, MTNLG_PP = printed(8, PAPER, "tp"), printed(35, PAPER, "pp")
MTNLG_LAYERS = printed(105, PAPER, "layers")
GPUS_PER_NODE = printed(8, PAPER, "gpus_total")
MTNLG_NODES = {280: printed(280, PAPER, "iter_time_280n"), 350: printed(350, PAPER, "iter_time_350n"),
               420: printed(420, PAPER, "iter_time_420n"), 560: printed(560, PAPER, "nodes")}


def tiny_config(params: dict) -> GPTConfig:
    hidden = params["hidden"]
    return GPTConfig(vocab_size=params["vocab"], hidden_size=hidden, num_layers=params["layers"],
                     num_attention_heads=params["heads"], max_position_embeddings=params["seq_len"],
                     hidden_dropout=0.0, attention_dropout=0.0, init_std=math.sqrt(1.0 / (3 * hidden)))


def settings_for(params: dict, micro_batches: int, micro_batch_size: int, zero_stage: int) -> TrainSettings:
    from repro.training import TrainSettings

    return TrainSettings(steps=params["steps"], micro_batches=micro_batches, micro_batch_size=micro_batch_size,
                         seq_len=params["seq_len"], lr=params["lr"], betas=(0.9, 0.95), eps=1e-8,
                         weight_decay=0.1, clip_grad=1.0, zero_stage=zero_stage, seed=params["seed"])


def _train(config: GPTConfig, groups, settings: TrainSettings, data: torch.Tensor) -> tuple[list[float], object]:
    from repro.training import PipelineTrainer

    trainer = PipelineTrainer(config, groups, settings)
    return [trainer.step(batch) for batch in data], trainer


def layout_rows() -> list[dict]:
    """MT-NLG 530B's layout through the rank grid and partition code the tiny run uses, each row with the evidence
    class its inputs give (all printed in the paper: ``consistency``)."""
    from repro.dist.groups import GridCoord, resolve_grid

    tp, pp, per_node = int(MTNLG_TP), int(MTNLG_PP), int(GPUS_PER_NODE)
    rows = [{"metric": "layers_per_stage", "value": float(layers_per_stage(int(MTNLG_LAYERS), pp)),
             "unit": "layers", "claim_id": None, "model": "530B", "evidence": evidence_from(MTNLG_LAYERS, MTNLG_PP)}]
    for nodes, printed_nodes in MTNLG_NODES.items():
        grid = resolve_grid(nodes * per_node, tp=tp, pp=pp)
        replica = {grid.rank(GridCoord(t, 0, p)) for t in range(grid.tp) for p in range(grid.pp)}
        tp_on_one_node = all(max(g) // per_node == min(g) // per_node for g in grid.tp_groups())
        claim = "dp_full" if nodes == 560 else f"dp_{nodes}n"
        rows += [
            {"metric": "dp_size", "value": float(grid.dp), "unit": "way", "claim_id": claim, "nodes": nodes,
             "evidence": evidence_from(MTNLG_TP, MTNLG_PP, GPUS_PER_NODE, printed_nodes)},
            {"metric": "gpus_per_replica", "value": float(len(replica)), "unit": "GPUs",
             "claim_id": "gpus_per_replica" if nodes == 280 else None, "nodes": nodes,
             "evidence": evidence_from(MTNLG_TP, MTNLG_PP)},
            {"metric": "tp_group_within_node", "value": float(tp_on_one_node), "unit": "bool", "claim_id": None,
             "nodes": nodes, "evidence": evidence_from(MTNLG_TP, GPUS_PER_NODE)},
        ]
    return rows


def _layout_evidence(row) -> str:
    """The evidence class of a layout row: the one it carries; older rows have none, and since the layout rows
    depend on nothing the run measured, the class :func:`layout_rows` gives the same row now."""
    evidence = row.get("evidence")
    if isinstance(evidence, str) and evidence:
        return evidence
    same = [r["evidence"] for r in layout_rows() if r["metric"] == row["metric"] and r["claim_id"] == row["claim_id"]]
    if not same:
        raise ValueError(f"row {row['metric']}/{row['claim_id']} is not a layout row of mtnlg_3d_tiny")
    return same[0]


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.training import synthetic_tokens
    from repro.pipeline.tied import check_tied_embedding_equal
    from repro.pipeline.measure import measure_idle
    from repro.dist.groups import init_parallel

    params = dict(point.params)
    tp, pp, dp = params["tp"], params["pp"], params["dp"]
    if ctx.world_size != tp * pp * dp:
        raise ValueError(f"point {point.name} needs tp x pp x dp = {tp * pp * dp} ranks, got {ctx.world_size}")
    config = tiny_config(params)
    m, mbs = params["micro_batches"], params["micro_batch_size"]
    global_batch = m * mbs * dp
    data = synthetic_tokens(vocab_size=config.vocab_size, seq_len=params["seq_len"], batch_size=global_batch,
                            steps=params["steps"], seed=params["seed"])
    groups = init_parallel(tp=tp, pp=pp, dp=dp)
    start = time.perf_counter()
    losses, trainer = _train(config, groups, settings_for(params, m, mbs, params["zero_stage"]), data)
    train_s = time.perf_counter() - start
    ledger = groups.ledger.snapshot()
    tied_diff = check_tied_embedding_equal(trainer.stage, groups.embedding, atol=1e-5)
    idle = measure_idle(lambda: (trainer.step(data[-1]), trainer.last_result)[1], groups.pp, steps=3, warmup=1)
    if ctx.rank != 0:
        return []
    # The reference: the same model and batches in one process, tp = pp = dp = 1, all micro-batches on one rank.
    single = init_parallel() if ctx.world_size == 1 else _single_groups()
    reference, _ = _train(config, single, settings_for(params, m * dp, mbs, 0), data)
    layout = {"tp": tp, "pp": pp, "dp": dp, "micro_batches": m, "zero_stage": params["zero_stage"]}
    rows = [{"metric": "loss", "value": loss, "unit": "nats", "step": i, **layout} for i, loss in enumerate(losses)]
    rows += [{"metric": "loss_reference", "value": loss, "unit": "nats", "step": i, **layout}
             for i, loss in enumerate(reference)]
    rows += [
        {"metric": "max_abs_loss_diff", "value": max(abs(a - b) for a, b in zip(losses, reference)),
         "unit": "nats", **layout},
        {"metric": "loss_drop", "value": losses[0] - losses[-1], "unit": "nats", **layout},
        {"metric": "tied_embedding_max_diff", "value": tied_diff, "unit": "abs", **layout},
        {"metric": "train_time", "value": train_s / params["steps"], "unit": "s/step", **layout},
        {"metric": "idle_fraction_mean", "value": idle.mean_idle, "unit": "fraction", **layout},
        {"metric": "bubble_formula", "value": bubble_fraction(pp, m), "unit": "fraction", **layout},
    ]
    for (kind, group), entry in sorted(ledger.items()):  # rank 0: first stage, tp rank 0, dp rank 0
        rows.append({"metric": "comm_calls_per_step", "value": entry.calls / params["steps"], "unit": "calls",
                     "kind": kind, "group": group, **layout})
        rows.append({"metric": "comm_bytes_per_step", "value": entry.bytes / params["steps"], "unit": "bytes",
                     "kind": kind, "group": group, **layout})
    return rows + layout_rows()


def _single_groups():
    """Groups of one for the in-process reference while torch.distributed is initialised for the 3-D job."""
    from repro.dist.comm import CommGroup
    from repro.dist.groups import ParallelGroups, RankGrid
    from repro.dist.ledger import CollectiveLedger

    ledger = CollectiveLedger()
    one = {name: CommGroup.single(name, ledger) for name in ("tp", "dp", "pp", "embedding", "world")}
    return ParallelGroups(grid=RankGrid(1, 1, 1), rank=0, ledger=ledger, **one)


def _point(tp: int, pp: int, dp: int, **params) -> Point:
    base = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": 1, "seed": 0, "vocab": 256, "heads": 4}
    return Point(f"tp{tp}-pp{pp}-dp{dp}", {**base, **params}, world_size=tp * pp * dp, memory_gib=0.5)


TINY = dict(layers=4, hidden=64, seq_len=32, steps=20, micro_batches=4, micro_batch_size=2, lr=1e-3)
SMALL = dict(layers=8, hidden=128, seq_len=64, steps=60, micro_batches=8, micro_batch_size=2, lr=1e-3)
POINTS = {
    "ci": (_point(2, 2, 1, **TINY), _point(2, 2, 2, **TINY)),
    "paper": (_point(2, 2, 1, **SMALL), _point(2, 2, 2, **SMALL)),
}
MEASURED_ON_GPUS = ("iter_time_280n", "iter_time_350n", "iter_time_420n", "tflops_280n", "tflops_350n",
                    "tflops_420n")


def claims(rows) -> list[ClaimCheck]:
    """Layout arithmetic of the rank grid (exact) and, as GPU work, the 530B run's measured throughput."""
    checks: list[ClaimCheck] = []
    if rows is not None and len(rows) and "claim_id" in rows:
        mapped = rows[rows["claim_id"].notna()].drop_duplicates("claim_id", keep="last")
        for _, row in mapped.iterrows():
            checks.append(check_value(PAPER, row["claim_id"], row["value"],
                                      note="rank grid of repro.dist (tp innermost), as used by the tiny 3-D run, "
                                           "built from the paper's printed tp, pp, GPUs per node and nodes",
                                      evidence=_layout_evidence(row)))
    checks += [needs_gpu(PAPER, claim, note="the 530B model under 8 x 35 x dp needs 2240+ A100s; the tiny run "
                         "checks the 3-D mechanics (losses equal to one process) on CPU")
               for claim in MEASURED_ON_GPUS]
    return checks


METRICS = ("loss", "loss_reference", "max_abs_loss_diff", "loss_drop", "tied_embedding_max_diff", "train_time",
           "idle_fraction_mean", "bubble_formula", "comm_calls_per_step", "comm_bytes_per_step", "layers_per_stage",
           "dp_size", "gpus_per_replica", "tp_group_within_node")

EXPERIMENT = Experiment(
    name="mtnlg_3d_tiny",
    paper=PAPER,
    title="MT-NLG 3-D parallelism (tp x pp x dp, ZeRO-1) at tiny scale on CPU: losses equal to one process",
    points=POINTS,
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"ci": 60.0, "paper": 1800.0},
    metrics=METRICS,
)
