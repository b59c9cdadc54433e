"""Megatron-LM weak scaling measured on GPUs (paper sec. 5.1, Table 1, Fig. 5) and the 1-GPU baseline (sec. 5.1.1).

Each point trains Table 1's GPT configuration on ``tp x dp`` GPUs with repro's tensor-parallel layers and trainer
(:class:`repro.training.trainer.PipelineTrainer`: bf16 autocast with fp32 masters, fused AdamW, activation
checkpointing after every layer as in the paper, each layer compiled in the role of Megatron's fused kernels) and
reports iteration time, tokens/s and model TFLOP/s per GPU by the paper's formula. Weak-scaling efficiency is a
point's per-GPU TFLOP/s over the 1-GPU point's (Fig. 5), so it needs the 1-GPU point of the same run or scale.

The 1-GPU baseline (``1p2B_1gpu``) measures repro with compiled layers against a plain single-GPU GPT of the same
configuration compiled whole with ``torch.compile`` (the same GPT with no parallel step applied:
:func:`repro.training.parallelize.build_plain_gpt`), so the suite's own overhead is
visible beside what a user would write for one GPU: both are built in one process, then timed in turn, A B A B A B,
and each row is the median of the three repetitions with their range (``value_min``, ``value_max``); the ratio is the
ratio of the medians, and the share of peak is given by the paper's formula and by the FLOPs a forward and a
backward execute (without the recomputation credit). Repro eager is a point of its own (``1p2B_1gpu_eager``). Rows
are written as they come (each variant's setup, each repetition), so a time limit keeps what was measured.
The claims these rows decide, each with its null model, are in
:mod:`repro.experiments.megatron_weak_scaling_gpu_claims`.

Scales: ``smoke`` (toy GPT on CPU ranks, the same code, in CI), ``node`` (1/2/4/8 GPUs on one node) and ``paper``
(also 64/128/256/512 GPUs: 64-way data parallelism over the 1/2/4/8-way model-parallel configurations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

from repro.experiments.base import Experiment, Point, Resources, RunContext
from repro.experiments.megatron_one_gpu import (METRICS, UNITS, VARIANTS, measure_plain, measure_repro,
                                                run_alternated, runnable_variants)
from repro.experiments.megatron_weak_scaling_gpu_claims import MP_CONFIGS, PAPER, claims, plain_comparison
from repro.perfmodel.megatron import MP_BATCH, PADDED_VOCAB, SEQ_LENGTH, TABLE1, TABLE2

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    import torch

__all__ = ["EXPERIMENT", "VARIANTS", "claims", "plain_comparison", "runnable_variants"]


def _device(ctx: RunContext) -> torch.device:
    from repro.dist.device import rank_device

    return rank_device(ctx.device, ctx.rank)


def _config(params):
    from repro.models import GPTConfig

    return GPTConfig(vocab_size=params["vocab"], hidden_size=params["hidden"], num_layers=params["layers"],
                     num_attention_heads=params["heads"], max_position_embeddings=params["seq_len"],
                     hidden_dropout=0.1, attention_dropout=0.1)


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    import torch
    from repro.dist.device import describe
    from repro.dist.groups import init_parallel
    from repro.perfmodel.gpus import gpu_peak
    from repro.training.throughput import release

    params = point.params
    device = _device(ctx)
    groups = init_parallel(tp=params["tp"], pp=1, dp=params["dp"])
    config = _config(params)
    peak = gpu_peak(device) if device.type == "cuda" else None
    info = describe(device)
    fixed = dict(model=params["model"], tp=params["tp"], dp=params["dp"], gpus=params["tp"] * params["dp"],
                 precision=params["precision"], checkpointing=params["checkpointing"],
                 gpu=info.get("name") if device.type == "cuda" else None,
                 peak_tflops=peak.peak_flops / 1e12 if peak else None, peak_source=peak.source if peak else None,
                 driver=info.get("driver"), cuda=info.get("cuda"))
    if params.get("repetitions", 1) > 1:
        return run_alternated(point, ctx, params, config, device, groups, fixed, peak)
    rows, measured = [], {}
    for variant in params["variants"]:
        if variant.startswith("plain") and ctx.world_size > 1:
            raise ValueError(f"variant {variant!r} is single-GPU; point {point.name!r} has {ctx.world_size} ranks")
        if variant not in runnable_variants([variant]):  # compiled layers need torch >= 2.5: one line, no row
            print(f"[{point.name}] variant 'repro' not run: compiled transformer layers need torch >= 2.5 "
                  f"(this torch is {torch.__version__}); 'repro_eager' still runs", flush=True)
            continue
        if variant in ("repro", "repro_eager"):
            result = measure_repro(params, config, device, groups, compiled=variant == "repro")
        elif variant in ("plain_compiled", "plain_eager"):
            result = measure_plain(params, config, device, compiled=variant == "plain_compiled")
        else:
            raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
        release(device)
        measured[variant] = result
        values = {"iteration_s": result.iteration_s, "tokens_per_s": result.tokens_per_s,
                  "model_tflops_per_gpu": result.model_tflops_per_gpu, "setup_s": result.setup_s,
                  "loss": result.last_loss}
        if peak is not None:
            values["share_of_peak"] = 100 * result.model_tflops_per_gpu * 1e12 / peak.peak_flops
        if result.peak_memory_gib is not None:
            values["peak_memory_gib"] = result.peak_memory_gib
        done = [dict(metric=name, value=float(value), unit=UNITS[name], variant=variant, **fixed)
                for name, value in values.items()]
        ctx.emit_rows(done)  # on disk now: a time limit hit in a later variant keeps this one's numbers
        rows += done
    if "plain_compiled" in measured:
        for variant, result in measured.items():
            ratio = result.tokens_per_s / measured["plain_compiled"].tokens_per_s
            rows.append(dict(metric="tokens_per_s_vs_plain_compiled", value=ratio, unit="x", variant=variant,
                             **fixed))
    return rows


def _config_params(label: str, table: str = "t1") -> dict:
    rows = TABLE1 if table == "t1" else TABLE2
    config = next(c for c in rows if c.label == label)
    name = label if table == "t1" else f"t2_{label}"
    return dict(model=name, layers=config.num_layers, hidden=config.hidden_size, heads=config.num_heads,
                vocab=PADDED_VOCAB, seq_len=SEQ_LENGTH, micro_batch_size=MP_BATCH)


def _gpu_point(label: str, tp: int, dp: int, *, name: str | None = None, table: str = "t1", **extra) -> Point:
    gpus = tp * dp
    per_node = min(gpus, 8)
    params = dict(_config_params(label, table), tp=tp, dp=dp, precision="bf16", checkpointing=True, warmup=3, iters=10,
                  variants=["repro"])
    params.update(extra)
    return Point(name or f"{label}_{gpus}gpu", params, world_size=gpus, needs_gpu=True, memory_gib=24.0,
                 resources=Resources(nodes=math.ceil(gpus / per_node), gpus_per_node=per_node, cpus_per_task=8,
                                     mem_gib=float(min(24 * per_node, 480)), time_min=30))


#: The 1-GPU baseline (with and without checkpointing): repro with compiled layers against the plain GPT compiled
#: whole, both built in one process and timed in turn (A B A B A B: ``repetitions``), each row the median and the
#: range of the repetitions; repro eager apart (``*_eager``). The ``*_plain`` points measure the plain GPT alone, as
#: the sessions before the alternation did (paired with the repro point of the same run).
ALTERNATED, REPETITIONS = ["repro", "plain_compiled"], 3
REPRO_VARIANTS, PLAIN_VARIANTS = ["repro", "repro_eager"], ["plain_compiled"]
_MP = MP_CONFIGS
NODE_POINTS = (
    _gpu_point("1p2B", 1, 1, variants=ALTERNATED, repetitions=REPETITIONS),
    _gpu_point("1p2B", 1, 1, name="1p2B_1gpu_eager", variants=["repro_eager"]),
    _gpu_point("1p2B", 1, 1, name="1p2B_1gpu_plain", variants=PLAIN_VARIANTS),
    _gpu_point("1p2B", 1, 1, name="1p2B_1gpu_no_ckpt", checkpointing=False, variants=ALTERNATED,
               repetitions=REPETITIONS),
    _gpu_point("1p2B", 1, 1, name="1p2B_1gpu_no_ckpt_plain", checkpointing=False, variants=PLAIN_VARIANTS),
    *(_gpu_point(label, tp, 1) for label, tp in _MP[1:]),
    # Table 8: strong scaling of the 1.2B model at a fixed batch of 8 over 2/4/8-way model parallelism.
    *(_gpu_point("1p2B", tp, 1, name=f"1p2B_{tp}gpu_strong") for tp in (2, 4, 8)),
)
PAPER_POINTS = NODE_POINTS + tuple(_gpu_point(label, tp, 64) for label, tp in _MP) + tuple(
    _gpu_point(run.label, run.mp_size, run.gpus // run.mp_size, table="t2",
               name=f"t2_{run.label}_{run.gpus}gpu") for run in TABLE2)

_SMOKE = dict(model="toy", layers=2, hidden=64, heads=4, vocab=512, seq_len=32, micro_batch_size=2,
              precision="bf16", checkpointing=True, warmup=1, iters=2)
#: The 1-GPU baseline's structure at toy size (compiled on the CPU too), and tensor parallelism over 2 ranks.
SMOKE_POINTS = (
    Point("toy_1rank", dict(_SMOKE, tp=1, dp=1, variants=ALTERNATED, repetitions=REPETITIONS), memory_gib=1.0),
    Point("toy_1rank_eager", dict(_SMOKE, tp=1, dp=1, variants=["repro_eager"]), memory_gib=1.0),
    Point("toy_tp2", dict(_SMOKE, tp=2, dp=1, variants=["repro_eager"]), world_size=2, memory_gib=1.0),
)


EXPERIMENT = Experiment(
    name="megatron_weak_scaling_gpu",
    paper=PAPER,
    title="Megatron-LM weak scaling on GPUs: per-GPU TFLOP/s of Table 1's models on 1-512 GPUs (Fig. 5)",
    points={"smoke": SMOKE_POINTS, "node": NODE_POINTS, "paper": PAPER_POINTS},
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"smoke": 150.0, "node": 1800.0, "paper": 3600.0},
    metrics=METRICS,
)
