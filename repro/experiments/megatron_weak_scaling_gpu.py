"""Megatron-LM weak scaling measured on GPUs (paper sec. 5.1, Table 1, Fig. 5) and the 1-GPU baseline (sec. 5.1.1).

Each point trains Table 1's GPT configuration on ``tp x dp`` GPUs with repro's tensor-parallel layers and trainer
(:class:`repro.training.trainer.PipelineTrainer`: bf16 autocast with fp32 masters, fused AdamW, activation
checkpointing after every layer as in the paper, each layer compiled in the role of Megatron's fused kernels) and
reports iteration time, tokens/s and model TFLOP/s per GPU by the paper's formula. Weak-scaling efficiency is a
point's per-GPU TFLOP/s over the 1-GPU point's (Fig. 5), so it needs the 1-GPU point of the same run or scale.

The 1-GPU baseline (``1p2B_1gpu``) measures repro with compiled layers against a plain single-GPU GPT of the same
configuration compiled whole with ``torch.compile`` (:mod:`repro.models.plain_gpt`), so the suite's own overhead is
visible beside what a user would write for one GPU: both are built in one process, then timed in turn, A B A B A B,
and each row is the median of the three repetitions with their range (``value_min``, ``value_max``); the ratio is the
ratio of the medians, and the share of peak is given by the paper's formula and by the FLOPs a forward and a
backward execute (without the recomputation credit). Repro eager is a point of its own (``1p2B_1gpu_eager``). Rows
are written as they come (each variant's setup, each repetition), so a time limit keeps what was measured.

Scales: ``smoke`` (toy GPT on CPU ranks, the same code, in CI), ``node`` (1/2/4/8 GPUs on one node) and ``paper``
(also 64/128/256/512 GPUs: 64-way data parallelism over the 1/2/4/8-way model-parallel configurations).
"""

from __future__ import annotations

import math

import torch

from repro.verdicts import needs_gpu
from repro.cross_hardware import ABSOLUTE, NORMALISED, compare
from repro.experiments.base import Experiment, Point, Resources, RunContext
from repro.vocabulary import ClaimCheck
from repro.experiments.megatron_one_gpu import (METRICS, UNITS, VARIANTS, measure_plain, measure_repro,
                                                run_alternated, runnable_variants)
from repro.perfmodel.megatron import MP_BATCH, PADDED_VOCAB, SECONDS_PER_DAY, SEQ_LENGTH, TABLE1, TABLE2

PAPER = "megatron_lm_2019"


def _device(ctx: RunContext) -> torch.device:
    from repro.dist.device import rank_device

    return rank_device(ctx.device, ctx.rank)


def _config(params):
    from repro.models import GPTConfig

    return GPTConfig(vocab_size=params["vocab"], hidden_size=params["hidden"], num_layers=params["layers"],
                     num_attention_heads=params["heads"], max_position_embeddings=params["seq_len"],
                     hidden_dropout=0.1, attention_dropout=0.1)


def run_point(point: Point, ctx: RunContext) -> list[dict]:
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


#: Table 2 counts an epoch as 68,507 iterations of 512 x 1024 tokens (its setting, used as given).
ITERATIONS_PER_EPOCH = 68_507


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
_MP = [("1p2B", 1), ("2p5B", 2), ("4p2B", 4), ("8p3B", 8)]
#: Table 2's training runs: 64-way data parallelism (global batch 512) over 1/2/8-way model parallelism.
_T2_MP = {"355M": 1, "2p5B": 2, "8p3B": 8}
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
    _gpu_point(run.label, _T2_MP[run.label], run.gpus // _T2_MP[run.label], table="t2",
               name=f"t2_{run.label}_{run.gpus}gpu") for run in TABLE2)

_SMOKE = dict(model="toy", layers=2, hidden=64, heads=4, vocab=512, seq_len=32, micro_batch_size=2,
              precision="bf16", checkpointing=True, warmup=1, iters=2)
#: The 1-GPU baseline's structure at toy size (compiled on the CPU too), and tensor parallelism over 2 ranks.
SMOKE_POINTS = (
    Point("toy_1rank", dict(_SMOKE, tp=1, dp=1, variants=ALTERNATED, repetitions=REPETITIONS), memory_gib=1.0),
    Point("toy_1rank_eager", dict(_SMOKE, tp=1, dp=1, variants=["repro_eager"]), memory_gib=1.0),
    Point("toy_tp2", dict(_SMOKE, tp=2, dp=1, variants=["repro_eager"]), world_size=2, memory_gib=1.0),
)


def _value(rows, metric: str, **where):
    if rows is None or not len(rows) or "metric" not in rows:
        return None
    sel = rows[rows["metric"] == metric]
    for key, value in where.items():
        if key not in sel:
            return None
        sel = sel[sel[key] == value]
    return None if sel.empty else float(sel["value"].iloc[-1])


def claims(rows) -> list[ClaimCheck]:
    """The 1-GPU baseline (sec. 5.1.1: 39 TFLOP/s, 30 % of a V100's peak), Fig. 5's efficiencies, Table 8's strong
    scaling, Table 2's days per epoch, by the cross-hardware rule (:mod:`repro.cross_hardware`): TFLOP/s, days and
    PFLOP/s are absolute (decided on V100s only, else "needs GPU" with the measured value); the share of peak and the
    efficiencies and speedups (ratios of runs on one GPU model) are compared on any GPU, counted apart off a V100."""
    gpu = _gpu(rows)
    note = "the 1.2B model on 1 GPU, bf16 autocast, activation checkpointing per layer, model FLOPs by the 96-formula"
    tflops = _value(rows, "model_tflops_per_gpu", model="1p2B", gpus=1, variant="repro", checkpointing=True)
    share = _value(rows, "share_of_peak", model="1p2B", gpus=1, variant="repro", checkpointing=True)
    run = "run megatron_weak_scaling_gpu's 1p2B_1gpu point"
    checks = [
        compare(PAPER, "baseline_tflops_1gpu", _rounded(tflops, 1), gpu=gpu, kind=ABSOLUTE, rel=0.10, unit=" TFLOP/s",
                note=note if tflops is not None else run),
        compare(PAPER, "baseline_pct_peak", _rounded(share, 1), gpu=gpu, kind=NORMALISED, abs=5,
                note=(f"{share:.1f}% of the {gpu}'s datasheet bf16 peak ({note})" + plain_comparison(rows))
                if share is not None else run),
    ]
    base = tflops
    for label, mp in _MP:
        for dp, claim in ((1, f"fig5_eff_mp_{mp}gpu"), (64, f"fig5_eff_mpdp_{64 * mp}gpu")):
            value = _value(rows, "model_tflops_per_gpu", model=label, tp=mp, dp=dp, variant="repro")
            if value is None or base is None or (mp == 1 and dp == 1):
                why = "the 1-GPU point is the reference (100 % by definition)" if (mp, dp) == (1, 1) else (
                    f"run megatron_weak_scaling_gpu's {label}_{mp * dp}gpu point and the 1p2B_1gpu point")
                checks.append(needs_gpu(PAPER, claim, why))
                continue
            checks.append(compare(PAPER, claim, round(100 * value / base, 1), gpu=gpu, kind=NORMALISED, abs=5,
                                  note=f"per-GPU TFLOP/s of {label} on {mp * dp} {gpu} over the 1-GPU 1.2B point"))
    checks += _strong_scaling(rows, gpu) + _days_per_epoch(rows, gpu)
    per_gpu = _value(rows, "model_tflops_per_gpu", model="8p3B", tp=8, dp=64, variant="repro")
    checks.append(compare(PAPER, "agg_pflops_from_74pct", _rounded(per_gpu * 512 / 1e3 if per_gpu else None, 2),
                          gpu=gpu, kind=ABSOLUTE, rel=0.10, unit=" PFLOP/s",
                          note="8p3B_512gpu: 512 x per-GPU TFLOP/s / 1000" if per_gpu else
                          "run megatron_weak_scaling_gpu's 8p3B_512gpu point"))
    return checks


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _gpu(rows) -> str | None:
    """The GPU the rows were measured on (the newest row's ``gpu``), or None."""
    if rows is None or not len(rows) or "gpu" not in rows:
        return None
    names = rows["gpu"].dropna()
    return str(names.iloc[-1]) if len(names) else None


def plain_comparison(rows) -> str:
    """``; x.xx the tokens/s of the plain GPT compiled whole (...)``: repro's 1-GPU 1.2B tokens/s (compiled layers,
    checkpointing) over the plain GPT's, from one run (the ``1p2B_1gpu`` and ``1p2B_1gpu_plain`` points of one
    session, or one point measuring both) where there is one; else from two runs on the same GPU model, said so;
    empty without both."""
    if rows is None or not len(rows) or not {"metric", "variant", "run_id", "model", "gpus"} <= set(rows):
        return ""
    sel = rows[(rows["metric"] == "tokens_per_s") & (rows["model"] == "1p2B") & (rows["gpus"] == 1)]
    if "checkpointing" in sel:
        sel = sel[sel["checkpointing"] == True]  # noqa: E712 - a column of booleans
    for run_id in sorted(set(sel["run_id"]), reverse=True):
        mine = sel[sel["run_id"] == run_id].groupby("variant")["value"].last()
        if {"repro", "plain_compiled"} <= set(mine.index):
            ratio = mine["repro"] / mine["plain_compiled"]
            return (f"; {ratio:.2f}x the tokens/s of the plain GPT compiled whole in the same run ({run_id}: "
                    f"{mine['repro']:.0f} vs {mine['plain_compiled']:.0f} tokens/s; the goal is at least 1.0x)")
    ours, plain = sel[sel["variant"] == "repro"], sel[sel["variant"] == "plain_compiled"]
    if len(ours) and len(plain) and "gpu" in sel and ours["gpu"].iloc[-1] == plain["gpu"].iloc[-1]:
        ratio = ours["value"].iloc[-1] / plain["value"].iloc[-1]
        return (f"; {ratio:.2f}x the tokens/s of the plain GPT compiled whole, from two sessions on {ours['gpu'].iloc[-1]}"
                f" (runs {ours['run_id'].iloc[-1]} and {plain['run_id'].iloc[-1]}: {ours['value'].iloc[-1]:.0f} vs "
                f"{plain['value'].iloc[-1]:.0f} tokens/s; no session measured both; the goal is at least 1.0x)")
    return ""


def _strong_scaling(rows, gpu) -> list[ClaimCheck]:
    """Table 8: speedup = iteration time of the 1-GPU point / that of the 1.2B model on g GPUs (batch 8): a ratio of
    two runs on one GPU model."""
    checks = [needs_gpu(PAPER, "t8_strong_1gpu", "the 1-GPU point is the reference (1.0 by definition)")]
    base = _value(rows, "iteration_s", model="1p2B", gpus=1, variant="repro", checkpointing=True)
    for tp in (2, 4, 8):
        time = _value(rows, "iteration_s", model="1p2B", tp=tp, dp=1, variant="repro")
        what = f"1p2B_1gpu and 1p2B_{tp}gpu_strong: 1-GPU iteration time / {tp}-GPU"
        speedup = base / time if base is not None and time is not None else None
        checks.append(compare(PAPER, f"t8_strong_{tp}gpu", _rounded(speedup, 2), gpu=gpu, kind=NORMALISED, rel=0.10,
                              note=what if speedup is not None else f"run megatron_weak_scaling_gpu's {what}"))
    return checks


def _days_per_epoch(rows, gpu) -> list[ClaimCheck]:
    """Table 2: days per epoch = 68,507 iterations x the measured iteration time / 86,400 s (absolute)."""
    checks = []
    for run in TABLE2:
        time = _value(rows, "iteration_s", model=f"t2_{run.label}", variant="repro")
        what = f"t2_{run.label}_{run.gpus}gpu: 68,507 x iteration time / 86,400 s"
        days = ITERATIONS_PER_EPOCH * time / SECONDS_PER_DAY if time is not None else None
        checks.append(compare(PAPER, f"t2_{run.label}_days_per_epoch", _rounded(days, 2), gpu=gpu, kind=ABSOLUTE,
                              rel=0.10, unit=" days", note=what if days is not None else
                              f"run megatron_weak_scaling_gpu's {what}"))
    return checks


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
