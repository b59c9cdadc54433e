"""MT-NLG 530B: parameter count, the 8 x 35 x dp layout, memory per GPU and per-GPU throughput at 280/350/420
DGX A100 nodes from the analytic model (``repro.perfmodel.mtnlg``; one constant fitted on the 280-node
iteration time, the 350/420-node rows are predictions). MT-NLG's throughput numbers are ``secondary`` rows of
paper_claims.csv (quoted by third parties), not read in the paper itself.

Also emitted: the configuration the suite runs (layers, hidden, heads, sequence, global batch, tp, pp, nodes from
``repro.perfmodel.mtnlg``; Adam betas / eps, weight decay and clipping from the settings of the tiny 3-D run,
``repro.experiments.mtnlg_3d_tiny``), and the paper's derived quantities: GPUs = tp x pp x dp, bytes per parameter
of mixed-precision Adam, tokens per step, tokens per parameter.

Evidence, decided where each row is computed from what its inputs are (:func:`repro.paper.evidence_from`,
stored in the row's ``evidence``): the layout (tp 8, pp 35, 8 GPUs per node, the node counts) and the model's shape
are the paper's printed numbers, so the layout, the closed-form parameter count and what follows from them (model
state, tokens per parameter, TFLOP/s from the paper's iteration time) are the paper's own arithmetic
(``consistency``), whichever experiment computes them (``mtnlg_3d_tiny`` computes the layout with its rank grid).
The parameter count of an instantiated module is ``parameter_counts``' (``derived``), which speaks for ``params``.
"""

from __future__ import annotations

from repro.verdicts import check_value
from repro.experiments import mtnlg_3d_tiny
from repro.experiments.base import Experiment, Point, RunContext
from repro.experiments.parameter_counts import params_basis
from repro.vocabulary import ClaimCheck, Null
from repro.experiments.mtnlg_3d_tiny import GPUS_PER_NODE, MTNLG_NODES, MTNLG_PP, MTNLG_TP
from repro.paper import evidence_from, paper_value, printed
from repro.perfmodel.mtnlg import (
    BYTES_PER_PARAM, GLOBAL_BATCH, MTNLG_530B, PP_SIZE, SELENE_NODES, TP_SIZE, calibrate_a100, layout_for_nodes,
    memory_per_gpu_530b, mixed_precision_adam_bytes_per_param, predict_iteration, predict_tflops_per_gpu,
    tflops_from_iteration_time, tokens_per_parameter, tokens_per_step, total_gpus,
)
from repro.perfmodel.zero_memory import K_ADAM

PAPER = "mt_nlg_2022"
NODES = (280, 350, 420)
#: The node count whose iteration time the throughput model's one constant is fitted on.
FIT_NODES = 280
#: The inputs of the closed-form parameter count 12 l h^2 + 13 l h + (V + s) h + 2 h as the paper prints them
#: (sec 3): layers, hidden size, sequence length, and the padded GPT-2 vocabulary the claims table's recomputation
#: (``params_repro``) states; the suite's model (``MTNLG_530B``) is this configuration.
MODEL_INPUTS = (printed(MTNLG_530B.num_layers, PAPER, "layers"), printed(MTNLG_530B.hidden_size, PAPER, "hidden"),
                printed(MTNLG_530B.seq_length, PAPER, "seq_len"), printed(MTNLG_530B.vocab_size, PAPER, "params_repro"))
GLOBAL_BATCH_PRINTED = printed(GLOBAL_BATCH, PAPER, "global_batch")
#: Mixed-precision Adam's bytes per parameter (sec 2.1 prints only the total): the 2 + 2 of fp16 weights and
#: gradients and the 4 of the fp32 gradient copy are the widths of the formats, not something the suite built or
#: counted; the one number with content is Adam's K = 12 (fp32 master weights, momentum, variance) as ZeRO prints it.
BYTES_INPUTS = (printed(K_ADAM, "zero_2019", "K_adam"),)
#: The parameter count's basis (the same key as ``parameter_counts``' count of the instantiated 530B model): the
#: paper's 530B and the claims table's recomputation state one quantity, and the report counts it once.
PARAMS_BASIS = params_basis(layers=MTNLG_530B.num_layers, hidden=MTNLG_530B.hidden_size, seq=MTNLG_530B.seq_length)


def iteration_basis(nodes: int) -> str:
    """The model's iteration time at ``nodes`` nodes: the quantity a node count's iteration time and TFLOP/s per GPU
    (its FLOPs over that time) both state."""
    return f"mtnlg_layout:iteration:{nodes}n"


def linear_scaling_nulls(nodes: int, fit_time_s: float) -> tuple[Null, Null]:
    """The null of ``nodes``' iteration time and TFLOP/s per GPU: plain linear scaling of the fitted 280-node run
    (its time x 280 / nodes; its TFLOP/s per GPU unchanged), with none of the model's pipeline and all-reduce terms."""
    return (Null(f"linear scaling of the fitted {FIT_NODES}-node time ({fit_time_s:g} s x {FIT_NODES} / nodes)",
                 fit_time_s * FIT_NODES / nodes),
            Null(f"linear scaling: the fitted {FIT_NODES}-node TFLOP/s per GPU unchanged",
                 tflops_from_iteration_time(FIT_NODES, fit_time_s)))


def _row(metric, value, unit, claim_id=None, *, evidence: str, **config) -> dict:
    return {"metric": metric, "value": float(value), "unit": unit, "claim_id": claim_id, "evidence": evidence,
            **config}


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    fit_time = paper_value(PAPER, f"iter_time_{FIT_NODES}n")
    eff = calibrate_a100(num_nodes=FIT_NODES, iteration_time_s=fit_time)
    rows = [_row("fitted_gemm", eff.gemm, "fraction", None, evidence="fitted", fitted_on=eff.fitted_on)]
    for nodes in NODES:
        step = predict_iteration(nodes, eff=eff)
        time_null, tflops_null = linear_scaling_nulls(nodes, fit_time)
        rows += [
            _row("iteration_time", step.total, "s", f"iter_time_{nodes}n", evidence=_model_evidence(nodes),
                 nodes=nodes, pipeline_s=step.pipeline, dp_comm_s=step.dp_comm_exposed, optimizer_s=step.optimizer,
                 basis=iteration_basis(nodes), null_model=time_null.name, null_value=time_null.value),
            _row("tflops_per_gpu", predict_tflops_per_gpu(nodes, eff=eff), "TFLOP/s", f"tflops_{nodes}n",
                 evidence=_model_evidence(nodes), nodes=nodes, basis=iteration_basis(nodes),
                 null_model=tflops_null.name, null_value=tflops_null.value),
        ]
    return rows + static_rows()


def _model_evidence(nodes: int) -> str:
    """The throughput model's rows: ``fitted`` at the node count its constant is fitted on, else ``predicted``."""
    return "fitted" if nodes == FIT_NODES else "predicted"


def static_rows() -> list[dict]:
    """Every row that does not depend on the fitted constant: the parameter count, the layout, memory, the paper's
    iteration times through its FLOP formula, the configuration and the derived quantities."""
    params = MTNLG_530B.num_params
    rows = [
        _row("num_params", params / 1e9, "billion params", "params_repro", evidence=evidence_from(*MODEL_INPUTS)),
        _row("num_params", params / 1e9, "billion params", "params", evidence=evidence_from(*MODEL_INPUTS)),
        _row("gpus_per_replica", TP_SIZE * PP_SIZE, "GPUs", "gpus_per_replica",
             evidence=evidence_from(MTNLG_TP, MTNLG_PP)),
        _layout_row(SELENE_NODES, "dp_full"),
        _row("model_state_tb", params * BYTES_PER_PARAM / 1e12, "TB", "model_state_tb",
             evidence=evidence_from(*MODEL_INPUTS, *BYTES_INPUTS)),
    ]
    memory = memory_per_gpu_530b()  # the suite's memory model (activations: Korthikanti et al.); no claim
    rows += [_row(f"memory_{kind}_gb", getattr(memory, kind) / 1e9, "GB", None, evidence="derived", nodes=280)
             for kind in ("model_states", "activation_checkpoints", "working_activations", "total")]
    for nodes in NODES:
        iteration = paper_value(PAPER, f"iter_time_{nodes}n")
        rows += [
            _layout_row(nodes, f"dp_{nodes}n"),
            _row("tflops_from_paper_time", tflops_from_iteration_time(nodes, iteration), "TFLOP/s",
                 f"tflops_{nodes}n_repro", evidence=evidence_from(iteration, MTNLG_NODES[nodes], GPUS_PER_NODE,
                                                                  *MODEL_INPUTS, GLOBAL_BATCH_PRINTED), nodes=nodes),
        ]
    return rows + config_rows() + derived_rows()


def _layout_row(nodes: int, claim_id: str) -> dict:
    """dp of the 8 x 35 x dp layout on ``nodes`` nodes: GPUs / (tp x pp), on the paper's printed numbers."""
    return _row("dp_size", layout_for_nodes(nodes).dp_size, "way", claim_id, nodes=nodes,
                evidence=evidence_from(MTNLG_TP, MTNLG_PP, GPUS_PER_NODE, MTNLG_NODES[nodes]))


def config_rows() -> list[dict]:
    """The configuration the suite runs: the 530B model and layout, and the tiny 3-D run's optimizer settings."""
    model = MTNLG_530B
    rows = [_row("config", value, unit, claim_id, evidence="configuration") for value, unit, claim_id in (
        (model.num_layers, "count", "layers"), (model.hidden_size, "count", "hidden"),
        (model.num_heads, "count", "heads"), (model.seq_length, "tokens", "seq_len"),
        (GLOBAL_BATCH, "sequences", "global_batch"), (TP_SIZE, "way", "tp"), (PP_SIZE, "way", "pp"),
        (SELENE_NODES, "nodes", "nodes"))]
    point = mtnlg_3d_tiny.POINTS["ci"][0]
    settings = mtnlg_3d_tiny.settings_for(dict(point.params), point.params["micro_batches"],
                                          point.params["micro_batch_size"], point.params["zero_stage"])
    rows += [_row("tiny_run_setting", value, "-", claim_id, evidence="configuration", tiny_point=point.name)
             for value, claim_id in (
                 (settings.betas[0], "adam_b1"), (settings.betas[1], "adam_b2"), (settings.eps, "adam_eps"),
                 (settings.weight_decay, "weight_decay"), (settings.clip_grad, "grad_clip"))]
    return rows


def derived_rows() -> list[dict]:
    """Quantities the paper derives from its configuration (sec 2.1, 2.4, 3), each from the printed numbers."""
    train_tokens = paper_value(PAPER, "train_tokens")
    return [
        _row("gpus_total", total_gpus(SELENE_NODES), "GPUs", "gpus_total", nodes=SELENE_NODES,
             evidence=evidence_from(MTNLG_TP, MTNLG_PP, GPUS_PER_NODE, MTNLG_NODES[SELENE_NODES])),
        _row("bytes_per_param", mixed_precision_adam_bytes_per_param(), "bytes/param", "bytes_per_param",
             evidence=evidence_from(*BYTES_INPUTS)),
        _row("tokens_per_step", tokens_per_step() / 1e6, "million tokens", "tokens_per_step",
             evidence=evidence_from(GLOBAL_BATCH_PRINTED, MODEL_INPUTS[2])),
        _row("tokens_per_param", tokens_per_parameter(train_tokens * 1e9), "tokens/param", "tokens_per_param",
             evidence=evidence_from(train_tokens, *MODEL_INPUTS)),
    ]


#: Beside these, every comparison allows half a unit of the paper's last printed digit (repro.verdicts): the
#: paper's rounding of 125.7 TFLOP/s, 3.93 M tokens or 0.51 tokens per parameter needs no rule of its own.
TOLERANCE = {"tflops_per_gpu": {"rel": 0.05}, "iteration_time": {"rel": 0.05}, "num_params": {"rel": 0.001},
             "model_state_tb": {"rel": 0.01}}
#: Notes of the rows that are neither model predictions nor layout arithmetic.
NOTES = {
    "config": "configuration the suite runs (repro.perfmodel.mtnlg)",
    "tiny_run_setting": "the optimizer setting the tiny 3-D run (mtnlg_3d_tiny) trains with",
    "gpus_total": "tp x pp x dp of the layout on 560 nodes",
    "bytes_per_param": "2 fp16 weights + 2 fp16 grads + 12 fp32 master/momentum/variance + 4 fp32 grad copy; "
                       "the paper states only the total",
    "tokens_per_step": "global batch x sequence length of the suite's config",
    "tokens_per_param": "the paper's 270B training tokens over the closed-form 529.6B parameter count",
    "num_params": "closed form 12 l h^2 + 13 l h + (V + s) h + 2 h on the printed configuration",
    "gpus_per_replica": "tp x pp",
    "dp_size": "GPUs / (tp x pp) of the 8 x 35 x dp layout",
    "model_state_tb": "the closed-form parameter count x 20 bytes",
}


def _evidence(row) -> str:
    """The class the row carries; older rows have none: then the class the same row gets now (:func:`static_rows`
    depend on nothing the run computed; the model's rows on their node count)."""
    evidence = row.get("evidence")
    if isinstance(evidence, str) and evidence:
        return evidence
    if row["metric"] in ("tflops_per_gpu", "iteration_time"):
        return _model_evidence(int(row["nodes"]))
    same = [r["evidence"] for r in static_rows() if (r["metric"], r["claim_id"]) == (row["metric"], row["claim_id"])]
    if not same:
        raise ValueError(f"row {row['metric']}/{row['claim_id']} is not a row of mtnlg_layout")
    return same[0]


def _model_note(row) -> str:
    """What a throughput-model row is: the fit input, or a prediction with its pipeline / all-reduce breakdown."""
    if int(row["nodes"]) == FIT_NODES:
        return f"the model's one constant is fitted on the {FIT_NODES}-node iteration time"
    note = "predicted (held out from the fit); secondary source in paper_claims.csv"
    if row["metric"] == "iteration_time" and isinstance(row.get("pipeline_s"), float):
        note += (f"; the model's {row['value']:.1f} s is {row['pipeline_s']:.1f} s of 1F1B pipeline (bubble included), "
                 f"{row['dp_comm_s']:.2f} s of exposed data-parallel all-reduce and {row['optimizer_s']:.2f} s of "
                 "optimizer step: the pipeline's fill and drain (p - 1 stage passes) and the all-reduce do not shrink "
                 "as data parallelism grows, which linear scaling ignores")
    return note


def claims(rows) -> list[ClaimCheck]:
    checks: list[ClaimCheck] = []
    if rows is None or len(rows) == 0 or "claim_id" not in rows:
        return checks
    for _, row in rows[rows["claim_id"].notna()].iterrows():
        note, null, basis = "secondary source in paper_claims.csv", None, ""
        evidence = _evidence(row)
        if row["metric"] in ("tflops_per_gpu", "iteration_time"):
            note, basis = _model_note(row), iteration_basis(int(row["nodes"]))
            if evidence == "predicted":
                if not isinstance(row.get("null_model"), str):
                    raise ValueError(f"mtnlg_layout row {row['claim_id']} of run {row.get('run_id')} has no null "
                                     "model: written before rows carried one; rerun `repro run mtnlg_layout`")
                null = Null(row["null_model"], float(row["null_value"]))
        elif row["metric"] == "num_params":
            basis = PARAMS_BASIS
        if row["metric"] == "tflops_from_paper_time":
            note = "the paper's iteration time through 96 B s l h^2 (1 + s/6h + V/16lh)"
        note = NOTES.get(row["metric"], note)
        checks.append(check_value(PAPER, row["claim_id"], row["value"], note=note, evidence=evidence, null=null,
                                  basis=basis, **TOLERANCE.get(row["metric"], {})))
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
