"""The GPU measurements beside the papers': Megatron's 1-GPU baseline and GNA's speedup against its tile bound.

Both name the GPU that measured (legend and caption) and the paper's: a share of a GPU's own peak and a speedup over
dense attention on the same GPU are the hardware-normalised quantities the cross-hardware rule compares
(:mod:`repro.cross_hardware`); absolute TFLOP/s are shown on their own axis, never set against the paper's GPU.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro.cross_hardware import PAPER_GPUS
from repro.figures.common import (MEASURED_COLOR, MODEL_COLOR, PAPER_COLOR, FigureContext, caption, legend_below,
                                  mark_missing, save)
from repro.paper import paper_value

MEGATRON, GNA = "megatron_lm_2019", "gna_2025"
#: (variant, checkpointing) -> bar label, in drawing order
_VARIANTS = ((("repro", True), "repro\ncompiled"), (("repro_eager", True), "repro\neager"),
             (("plain_compiled", True), "plain GPT\ncompiled"), (("repro", False), "repro\ncompiled\nno ckpt"),
             (("repro_eager", False), "repro\neager\nno ckpt"), (("plain_compiled", False), "plain GPT\ncompiled\nno ckpt"))


def _gpu_names(rows: pd.DataFrame) -> str:
    names = sorted({str(g) for g in rows.get("gpu", pd.Series(dtype=str)).dropna() if g})
    return " / ".join(names) if names else "no GPU"


def _metric(rows: pd.DataFrame, metric: str, variant: str, checkpointing: bool) -> float | None:
    sel = rows[(rows["metric"] == metric) & (rows["variant"] == variant)
               & (rows["checkpointing"].astype(bool) == checkpointing) & (rows["model"] == "1p2B")]
    return float(sel["value"].iloc[-1]) if len(sel) else None


def megatron_1gpu(ctx: FigureContext) -> list[Path]:
    """Share of peak (paper's V100 bar beside the measured GPU's variants) and measured tokens/s with the repro /
    plain GPT ratio."""
    from matplotlib.patches import Patch

    rows = ctx.rows_of("megatron_weak_scaling_gpu")
    rows = rows[rows["gpus"] == 1] if len(rows) and "gpus" in rows else rows
    gpu = _gpu_names(rows) if len(rows) else "no GPU"
    paper_gpu = PAPER_GPUS[MEGATRON]
    fig, (share_ax, speed_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    bars = {"share_of_peak": [(f"paper\n({paper_gpu})", float(paper_value(MEGATRON, "baseline_pct_peak")),
                               PAPER_COLOR)], "tokens_per_s": []}
    for (variant, ckpt), label in _VARIANTS:
        for metric in bars:
            value = _metric(rows, metric, variant, ckpt) if len(rows) else None
            if value is not None:
                bars[metric].append((label, value, MODEL_COLOR if variant.startswith("plain") else MEASURED_COLOR))
    handles = [Patch(color=MEASURED_COLOR, label=f"repro, measured on {gpu}"),
               Patch(color=MODEL_COLOR, label=f"plain GPT (repro.models.plain_gpt), measured on {gpu}")]
    for ax, metric, fmt in ((share_ax, "share_of_peak", "{:.1f}%"), (speed_ax, "tokens_per_s", "{:.0f}")):
        drawn = bars[metric]
        ax.bar(range(len(drawn)), [v for _, v, _ in drawn], color=[c for _, _, c in drawn])
        ax.set_xticks(range(len(drawn)), [label for label, _, _ in drawn], fontsize=9)
        for x, (_, value, _) in enumerate(drawn):
            ax.text(x, value * 1.01, fmt.format(value), ha="center", va="bottom", fontsize=9)
        if not any(c != PAPER_COLOR for _, _, c in drawn):
            mark_missing(ax, "no GPU run yet\n(python -m repro.gpu_session)")
    share_ax.legend(handles=[Patch(color=PAPER_COLOR, label=f"paper: the 1.2B model on one {paper_gpu} "
                                                           "(39 TFLOP/s)")] + handles,
                    loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)
    share_ax.set_ylabel("model FLOP/s, % of the GPU's own peak")
    share_ax.set_title("1-GPU baseline (Megatron-LM sec. 5.1.1): share of peak")
    ours = {label: value for label, value, _ in bars["tokens_per_s"]}
    ratio = ours.get("repro\ncompiled", 0) / ours.get("plain GPT\ncompiled", np.inf)
    speed_ax.set_title(f"tokens/s on {gpu}" + (f": repro / plain GPT = {ratio:.2f}x (checkpointing)" if ratio else ""))
    speed_ax.set_ylabel("tokens/s (absolute: this GPU only)")
    speed_ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)
    runs = sorted(set(rows["run_id"])) if len(rows) else []
    caption(fig, f"Measured on {gpu}; the paper measured on one {paper_gpu} (32 GB, DGX-2H). By the cross-hardware "
                 "rule only the share of each GPU's own peak is set beside the paper's (left); tokens/s (right) are "
                 "this GPU's alone. 1.2B GPT: 40 layers, hidden 1536, seq 1024, micro-batch 8, bf16; ckpt = "
                 "activation checkpointing per layer. "
                 + (f"The bars come from {len(runs)} runs (sessions) on the same GPU model, so the repro / plain ratio "
                    "is across sessions, not one." if len(runs) > 1 else ""))
    return save(fig, ctx, "megatron_1gpu_baseline")


def gna_gpu(ctx: FigureContext) -> list[Path]:
    """Measured kernel and op speedup over the fastest dense SDPA, beside the tile simulator's bound, per point."""
    rows = ctx.rows_of("gna_speedup_gpu")
    fig, ax = plt.subplots(figsize=(11, 4.8))
    if not len(rows) or "passes" not in rows:
        mark_missing(ax, "no GPU run yet (repro run gna_speedup_gpu --scale paper --device cuda)")
        caption(fig, f"The paper measured on a {PAPER_GPUS[GNA]}.")
        return save(fig, ctx, "gna_speedup_gpu")
    gpu = _gpu_names(rows)
    wide = rows.pivot_table(index=["model", "window", "stride", "passes"], columns="metric", values="value",
                            aggfunc="last").reset_index()
    wide = wide.dropna(subset=["speedup", "bound"])
    x = np.arange(len(wide))
    ax.bar(x - 0.2, wide["speedup"], width=0.4, color=MEASURED_COLOR, label=f"GNA kernel (Flex) on {gpu}")
    if "op_speedup" in wide:
        ax.bar(x + 0.2, wide["op_speedup"], width=0.4, color=MODEL_COLOR,
               label=f"GNA op with token permutation on {gpu}")
    ax.scatter(x, wide["bound"], marker="_", s=900, color=PAPER_COLOR, zorder=3,
               label=f"tile bound (simulator; the paper's kernel reaches it in block-sparse cases on a {PAPER_GPUS[GNA]})")
    for xi, (speed, bound) in enumerate(zip(wide["speedup"], wide["bound"])):
        ax.text(xi - 0.2, speed + 0.15, f"{speed / bound:.0%}\nof bound", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, [f"{r.model}\nw{r.window} s{r.stride}\n{r.passes}" for r in wide.itertuples()], fontsize=9)
    ax.set_ylabel("speedup over the fastest dense SDPA (same GPU)")
    ax.set_title(f"GNA on {gpu}: measured speedup against the tile bound")
    legend_below(ax, ncol=1)
    caption(fig, f"Measured on {gpu}, bf16, against the fastest dense SDPA backend of the same GPU; the paper's "
                 f"kernel ran on a {PAPER_GPUS[GNA]}. A speedup over dense on one GPU and its fraction of the tile "
                 "bound are hardware-normalised (cross-hardware rule); the bound is the simulator's for these tiles.")
    return save(fig, ctx, "gna_speedup_gpu")
