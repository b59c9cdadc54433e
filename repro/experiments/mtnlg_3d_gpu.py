"""MT-NLG 530B's 3-D parallelism measured on GPUs (sec. 2.4: 126/121/113 TFLOP/s per GPU at 280/350/420 nodes).

Tensor parallelism 8 inside a DGX A100 node, pipeline parallelism across nodes (1F1B), data parallelism with ZeRO-1
across replicas: each point trains a GPT under ``tp x pp x dp`` with repro's trainer
(:class:`repro.training.trainer.PipelineTrainer`: bf16 autocast with fp32 masters, activation checkpointing per
layer, compiled layers on GPU) and reports iteration time, tokens/s, model TFLOP/s per GPU by the paper's formula
(``96 B s l h^2 (1 + s/6h + V/16lh)`` with the point's global batch and layers) and the 1F1B bubble share.

Three kinds of point:

* ``full``: the 530B layout itself (h 20480, 128 heads, 105 layers, seq 2048, tp 8 x pp 35 x dp 8/10/12 on
  280/350/420 nodes, micro-batch 1, global batch 1920, so 1920/dp micro-batches per pipeline): the paper's
  measurement, for users with such a cluster.
* ``proxy``: the same per-GPU work on a few nodes: the same layer shape and micro-batch, tp 8, 3 layers per stage
  (105/35) on pp 2 or 4 nodes, dp 1, and as many micro-batches as make the bubble share (p-1)/(m+p-1) equal to
  the 530B layout's at 280/350/420 nodes (nearest integer). Its TFLOP/s is a proxy: no data-parallel gradient
  reduction, a shorter pipeline whose first and last stages (embedding, logits) weigh more, so it is reported
  beside the claims, never as their reproduction.
* ``node``: the same layer shape on one node, tp 8, pp 1, 3 layers (no pipeline).

``smoke`` runs a toy GPT through the same ``run_point`` on CPU ranks (tp 2 x pp 2, and tp 1 x pp 2 x dp 2 with
ZeRO-1), with micro-batches matched to the 280-node bubble the same way, so the cluster path runs in CI.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from repro.verdicts import check_condition, needs_gpu
from repro.experiments.base import Experiment, Point, Resources, RunContext
from repro.vocabulary import ClaimCheck, Null
from repro.paper import paper_value
from repro.results import last_row
from repro.perfmodel.mtnlg import flops_per_iteration

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    import torch

PAPER = "mt_nlg_2022"
GPUS_PER_NODE = 8
#: MT-NLG 530B (sec. 2.4, 3): the model and its layout; vocabulary padded as in repro.perfmodel.mtnlg.
SHAPE = dict(hidden=20480, heads=128, vocab=51200, seq_len=2048, micro_batch_size=1)
LAYERS, TP, PP, GLOBAL_BATCH = 105, 8, 35, 1920
NODES_DP = {280: 8, 350: 10, 420: 12}  # nodes -> dp = nodes x 8 GPUs / (8 x 35 per replica)
_METRICS = ("iteration_s", "tokens_per_s", "model_tflops_per_gpu", "share_of_peak", "bubble_share",
            "layers_per_stage", "peak_memory_gib", "setup_s", "loss")
_UNITS = {"iteration_s": "s", "tokens_per_s": "tokens/s", "model_tflops_per_gpu": "TFLOP/s", "share_of_peak": "%",
          "bubble_share": "fraction", "layers_per_stage": "layers", "peak_memory_gib": "GiB", "setup_s": "s",
          "loss": "nats"}
#: Row classes other than ``measured``: the bubble (p-1)/(m+p-1) is a closed form on the point's pipeline, whose
#: micro-batches follow from the suite's micro-batch size 1 (not printed in the paper), so it is ``derived`` even at
#: the 530B layout; the layers per stage are the point's configuration. The 530B layout's own arithmetic (dp, GPUs
#: per replica) is mapped by mtnlg_layout and mtnlg_3d_tiny (``consistency``), not here.
_EVIDENCE = {"bubble_share": "derived", "layers_per_stage": "configuration"}


def full_micro_batches(nodes: int) -> int:
    """Micro-batches per pipeline of the 530B layout: global batch / dp (micro-batch 1)."""
    return GLOBAL_BATCH // NODES_DP[nodes]


def matched_micro_batches(pp: int, nodes: int) -> int:
    """Micro-batches that give a ``pp``-stage pipeline the 530B layout's bubble at ``nodes`` nodes.

    ``(p-1)/(m+p-1) = (P-1)/(M+P-1)``  <=>  ``m = (p-1) M / (P-1)``, rounded, and at least ``p`` (1F1B's fill).
    """
    if pp < 2:
        raise ValueError(f"pp={pp} has no bubble to match; give micro_batches explicitly")
    return max(pp, round((pp - 1) * full_micro_batches(nodes) / (PP - 1)))


def _device(ctx: RunContext) -> torch.device:
    from repro.dist.device import rank_device

    return rank_device(ctx.device, ctx.rank)


def _config(params):
    from repro.models import GPTConfig

    return GPTConfig(vocab_size=params["vocab"], hidden_size=params["hidden"], num_layers=params["layers"],
                     num_attention_heads=params["heads"], max_position_embeddings=params["seq_len"],
                     hidden_dropout=0.1, attention_dropout=0.1, init_std=math.sqrt(1.0 / (3 * params["hidden"])))


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.dist.device import describe
    from repro.dist.groups import init_parallel
    from repro.perfmodel.gpus import gpu_peak
    from repro.pipeline.partition import layers_per_stage
    from repro.pipeline.schedule import bubble_fraction
    from repro.training.throughput import measure_trainer, release
    from repro.training.trainer import TrainSettings

    params = point.params
    tp, pp, dp = params["tp"], params["pp"], params["dp"]
    if ctx.world_size != tp * pp * dp:
        raise ValueError(f"point {point.name!r} needs tp x pp x dp = {tp}x{pp}x{dp} = {tp * pp * dp} ranks, "
                         f"got world size {ctx.world_size}")
    device = _device(ctx)
    groups = init_parallel(tp=tp, pp=pp, dp=dp)
    config = _config(params)
    m, s = params["micro_batches"], params["seq_len"]
    settings = TrainSettings(steps=1, micro_batches=m, micro_batch_size=params["micro_batch_size"], seq_len=s,
                             lr=5e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip_grad=1.0,
                             zero_stage=params["zero_stage"], device=str(device), precision=params["precision"],
                             activation_checkpointing=params["checkpointing"],
                             compile_layers=params["compile_layers"] and device.type == "cuda")
    result = measure_trainer(config, groups, settings, device=device, warmup=params["warmup"],
                             iters=params["iters"])
    release(device)
    if ctx.rank != 0:
        return []
    peak = gpu_peak(device) if device.type == "cuda" else None
    info = describe(device)
    fixed = dict(kind=params["kind"], model=params["model"], target_nodes=params.get("target_nodes"),
                 layout=f"{tp}x{pp}x{dp}", tp=tp, pp=pp, dp=dp, nodes=params["nodes"], gpus=tp * pp * dp,
                 layers=config.num_layers, hidden=config.hidden_size, micro_batches=m,
                 micro_batch_size=params["micro_batch_size"], global_batch=m * params["micro_batch_size"] * dp,
                 zero_stage=params["zero_stage"], precision=params["precision"],
                 checkpointing=params["checkpointing"], device_type=device.type,
                 gpu=info.get("name") if device.type == "cuda" else None, gpu_memory_gib=info.get("memory_gib"),
                 peak_tflops=peak.peak_flops / 1e12 if peak else None, peak_source=peak.source if peak else None,
                 driver=info.get("driver"), cuda=info.get("cuda"))
    values = {"iteration_s": result.iteration_s, "tokens_per_s": result.tokens_per_s,
              "model_tflops_per_gpu": result.model_tflops_per_gpu, "setup_s": result.setup_s,
              "loss": result.last_loss, "bubble_share": bubble_fraction(pp, m),
              "layers_per_stage": layers_per_stage(config.num_layers, pp)}
    if peak is not None:
        values["share_of_peak"] = 100 * result.model_tflops_per_gpu * 1e12 / peak.peak_flops
    if result.peak_memory_gib is not None:
        values["peak_memory_gib"] = result.peak_memory_gib
    return [dict(metric=name, value=float(value), unit=_UNITS[name], evidence=_EVIDENCE.get(name, "measured"),
                 **fixed) for name, value in values.items()]


def _gpu_point(name: str, kind: str, *, layers: int, pp: int, dp: int, micro_batches: int,
               target_nodes: int | None, time_min: int, warmup: int, iters: int) -> Point:
    world = TP * pp * dp
    nodes = world // GPUS_PER_NODE
    params = dict(SHAPE, kind=kind, model="530B" if kind == "full" else f"530B-shape-{layers}L", layers=layers,
                  tp=TP, pp=pp, dp=dp, nodes=nodes, micro_batches=micro_batches, zero_stage=1, precision="bf16",
                  checkpointing=True, compile_layers=True, warmup=warmup, iters=iters, target_nodes=target_nodes)
    # Host memory per rank: the stage is built in fp32 on the CPU before it moves to its GPU (~2B params at tp 8).
    return Point(name, params, world_size=world, needs_gpu=True, memory_gib=16.0,
                 resources=Resources(nodes=nodes, gpus_per_node=GPUS_PER_NODE, cpus_per_task=8, mem_gib=480.0,
                                     time_min=time_min))


_PER_STAGE = LAYERS // PP  # 3 layers per stage, as in the 530B layout
NODE_POINTS = (
    _gpu_point("tp8_pp1_3layers", "node", layers=_PER_STAGE, pp=1, dp=1, micro_batches=8, target_nodes=None,
               time_min=30, warmup=2, iters=5),
)
PROXY_POINTS = tuple(
    _gpu_point(f"proxy_{nodes}n_pp{pp}", "proxy", layers=_PER_STAGE * pp, pp=pp, dp=1,
               micro_batches=matched_micro_batches(pp, nodes), target_nodes=nodes, time_min=30, warmup=2, iters=5)
    for nodes in NODES_DP for pp in (2, 4)
)
FULL_POINTS = tuple(
    _gpu_point(f"530b_{nodes}n", "full", layers=LAYERS, pp=PP, dp=dp, micro_batches=full_micro_batches(nodes),
               target_nodes=nodes, time_min=60, warmup=1, iters=3)
    for nodes, dp in NODES_DP.items()
)
PAPER_POINTS = NODE_POINTS + PROXY_POINTS + FULL_POINTS

_TOY = dict(kind="toy", model="toy", hidden=64, heads=4, vocab=256, seq_len=32, micro_batch_size=1, nodes=1,
            precision="bf16", checkpointing=True, compile_layers=False, warmup=1, iters=2, target_nodes=280)
SMOKE_POINTS = (
    Point("toy_tp2_pp2", dict(_TOY, layers=4, tp=2, pp=2, dp=1, zero_stage=1,
                              micro_batches=matched_micro_batches(2, 280)), world_size=4, memory_gib=0.5),
    Point("toy_pp2_dp2_zero1", dict(_TOY, layers=4, tp=1, pp=2, dp=2, zero_stage=1,
                                    micro_batches=matched_micro_batches(2, 280)), world_size=4, memory_gib=0.5),
)


def _field(row, key: str):
    """``row[key]``, or None when the column is missing or empty (NaN) in this row."""
    value = row.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _on_a100_80gb(row) -> bool:
    name, memory = str(_field(row, "gpu") or ""), _field(row, "gpu_memory_gib")
    return "A100" in name and ("80GB" in name or (memory is not None and float(memory) > 70))


def _where(row) -> str:
    return _field(row, "gpu") or f"{_field(row, 'device_type') or 'cpu'} ranks"


def _stand_in(rows, nodes: int) -> str | None:
    """What the few-node proxy (or else the toy smoke run) measured for ``nodes``, said as what it is."""
    for kind, what in (("proxy", "few-node proxy (same layer shape and micro-batch, 3 layers per stage, bubble "
                                 "matched)"), ("toy", "toy smoke run (mechanics only, not the 530B shape)")):
        row = last_row(rows, "model_tflops_per_gpu", kind=kind, target_nodes=nodes)
        if row is None:
            continue
        bubble = last_row(rows, "bubble_share", kind=kind, target_nodes=nodes, layout=row["layout"])
        bubble_text = f", bubble {bubble['value']:.3f}" if bubble is not None else ""
        return (f"{what} {row['layout']} on {_where(row)}: {row['value']:.3g} TFLOP/s per GPU{bubble_text}; "
                "a proxy, not the claim")
    return None


def _null(rows, metric: str, nodes: int) -> Null:
    """The null of a measured 530B row: linear scaling of the measured 280-node run (its time x 280 / nodes, its
    TFLOP/s per GPU unchanged) where one was measured on the same GPUs and ``nodes`` is another count; else every
    model FLOP at the A100's dense 16-bit peak (no losses at all)."""
    fit = min(NODES_DP)
    base = last_row(rows, metric, kind="full", target_nodes=fit) if nodes != fit else None
    if base is not None and _field(base, "device_type") == "cuda" and _on_a100_80gb(base):
        value = float(base["value"]) * (fit / nodes if metric == "iteration_s" else 1.0)
        return Null(f"linear scaling of the measured {fit}-node run", value)
    peak = paper_value(PAPER, "a100_peak")
    if metric == "iteration_s":
        return Null("every model FLOP at the A100's dense peak",
                    flops_per_iteration() / (nodes * GPUS_PER_NODE * peak * 1e12))
    return Null("every model FLOP at the A100's dense peak", peak)


def claims(rows) -> list[ClaimCheck]:
    """TFLOP/s per GPU (and iteration time) at 280/350/420 nodes from the matching points.

    A verdict needs the 530B layout itself run on A100 80GB GPUs (MT-NLG's DGX A100 nodes), within 10 %; on any
    other GPU the measured value is in the note and the claim stays "needs GPU". The few-node proxy (and the
    toy smoke run) never decide a claim: their values are reported in the note as what they are."""
    checks: list[ClaimCheck] = []
    for nodes in NODES_DP:
        for metric, claim, unit in (("model_tflops_per_gpu", f"tflops_{nodes}n", "TFLOP/s"),
                                    ("iteration_s", f"iter_time_{nodes}n", "s")):
            full = last_row(rows, metric, kind="full", target_nodes=nodes)
            if full is not None and _field(full, "device_type") == "cuda" and _on_a100_80gb(full):
                value, target = float(full["value"]), paper_value(PAPER, claim)
                null = _null(rows, metric, nodes)
                checks.append(check_condition(
                    PAPER, claim, value, holds=abs(value / target - 1) <= 0.1, tolerance="+-10%", evidence="measured",
                    null=Null(null.name, null.value, holds=abs(null.value / target - 1) <= 0.1),
                    basis=f"mtnlg_3d_gpu:530b_{nodes}n:iteration",
                    note=f"530B layout {full['layout']} on {nodes} nodes of {full['gpu']}, bf16, activation "
                         "checkpointing, ZeRO-1; model FLOPs by the 96-formula"))
                continue
            if full is not None:
                checks.append(needs_gpu(PAPER, claim, f"needs MT-NLG's A100 80GB; measured on {_where(full)} with "
                                                      f"the 530B layout {full['layout']}: {full['value']:.2f} {unit}"))
                continue
            stand_in = _stand_in(rows, nodes) if metric == "model_tflops_per_gpu" else None
            if stand_in is not None:
                checks.append(needs_gpu(PAPER, claim, f"run mtnlg_3d_gpu's 530b_{nodes}n point; {stand_in}"))
                continue
            checks.append(needs_gpu(PAPER, claim, f"run mtnlg_3d_gpu's 530b_{nodes}n point (tp 8 x pp 35 x dp "
                                                  f"{NODES_DP[nodes]} on {nodes} DGX A100 nodes)"))
    return checks


EXPERIMENT = Experiment(
    name="mtnlg_3d_gpu",
    paper=PAPER,
    title="MT-NLG 530B 3-D parallelism on GPUs: per-GPU TFLOP/s at 280/350/420 nodes and a few-node proxy",
    points={"smoke": SMOKE_POINTS, "node": NODE_POINTS, "paper": PAPER_POINTS},
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"smoke": 60.0, "node": 1800.0, "paper": 3 * 3600.0},
    metrics=_METRICS,
)
