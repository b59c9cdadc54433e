"""MT-NLG 530B: parameter count, the 8 x 35 x dp layout, memory per GPU and per-GPU throughput at 280/350/420
DGX A100 nodes from the analytic model (``repro.perfmodel.mtnlg``; one constant fitted on the 280-node
iteration time, the 350/420-node rows are predictions). MT-NLG's throughput numbers are ``secondary`` rows of
paper_claims.csv (quoted by third parties), not read in the paper itself.
"""

from __future__ import annotations

from repro.claims import check_value
from repro.experiments.base import ClaimCheck, Experiment, Point, RunContext
from repro.paper import paper_value
from repro.perfmodel.mtnlg import (
    BYTES_PER_PARAM, MTNLG_530B, PP_SIZE, TP_SIZE, calibrate_a100, layout_for_nodes, memory_per_gpu_530b,
    predict_iteration, predict_tflops_per_gpu, tflops_from_iteration_time,
)

PAPER = "mt_nlg_2022"
NODES = (280, 350, 420)


def _row(metric, value, unit, claim_id=None, **config) -> dict:
    return {"metric": metric, "value": float(value), "unit": unit, "claim_id": claim_id, **config}


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    eff = calibrate_a100(num_nodes=280, iteration_time_s=paper_value(PAPER, "iter_time_280n"))
    params = MTNLG_530B.num_params
    rows = [
        _row("fitted_gemm", eff.gemm, "fraction", None, fitted_on=eff.fitted_on),
        _row("num_params", params / 1e9, "billion params", "params_repro"),
        _row("num_params", params / 1e9, "billion params", "params"),
        _row("gpus_per_replica", TP_SIZE * PP_SIZE, "GPUs", "gpus_per_replica"),
        _row("dp_size", 560 * 8 // (TP_SIZE * PP_SIZE), "way", "dp_full", nodes=560),
        _row("model_state_tb", params * BYTES_PER_PARAM / 1e12, "TB", "model_state_tb"),
    ]
    memory = memory_per_gpu_530b()
    rows += [_row(f"memory_{kind}_gb", getattr(memory, kind) / 1e9, "GB", None, nodes=280)
             for kind in ("model_states", "activation_checkpoints", "working_activations", "total")]
    for nodes in NODES:
        step = predict_iteration(nodes, eff=eff)
        rows += [
            _row("dp_size", layout_for_nodes(nodes).dp_size, "way", f"dp_{nodes}n", nodes=nodes),
            _row("iteration_time", step.total, "s", f"iter_time_{nodes}n", nodes=nodes,
                 pipeline_s=step.pipeline, dp_comm_s=step.dp_comm_exposed, optimizer_s=step.optimizer),
            _row("tflops_per_gpu", predict_tflops_per_gpu(nodes, eff=eff), "TFLOP/s", f"tflops_{nodes}n",
                 nodes=nodes),
            _row("tflops_from_paper_time", tflops_from_iteration_time(nodes, paper_value(PAPER,
                 f"iter_time_{nodes}n")), "TFLOP/s", f"tflops_{nodes}n_repro", nodes=nodes),
        ]
    return rows


TOLERANCE = {"tflops_per_gpu": {"rel": 0.05}, "iteration_time": {"rel": 0.05}, "num_params": {"rel": 0.001},
             "tflops_from_paper_time": {"abs": 0.06}, "model_state_tb": {"rel": 0.01}}


def claims(rows) -> list[ClaimCheck]:
    checks: list[ClaimCheck] = []
    if rows is None or len(rows) == 0 or "claim_id" not in rows:
        return checks
    for _, row in rows[rows["claim_id"].notna()].iterrows():
        note = "secondary source in paper_claims.csv"
        if row["metric"] in ("tflops_per_gpu", "iteration_time"):
            note = ("fitted on this claim" if row.get("nodes") == 280 else "predicted (held out)") + "; " + note
        if row["metric"] == "tflops_from_paper_time":
            note = "the paper's iteration time through 96 B s l h^2 (1 + s/6h + V/16lh)"
        checks.append(check_value(PAPER, row["claim_id"], row["value"], note=note,
                                  **TOLERANCE.get(row["metric"], {})))
    return checks


EXPERIMENT = Experiment(
    name="mtnlg_layout",
    paper=PAPER,
    title="MT-NLG 530B: parameters, 8x35 layout memory, per-GPU TFLOP/s at 280/350/420 nodes (model)",
    points={"ci": (Point("analytic-model", {"hardware": "DGX-A100"}),),
            "paper": (Point("analytic-model", {"hardware": "DGX-A100"}),)},
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
)
