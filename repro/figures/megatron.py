"""Megatron-LM figures: weak-scaling efficiency (Fig. 5) and the parameter-count table (Tables 1-2, with the
MT-NLG and ZeRO configurations whose counts follow the same closed form)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro.figures.common import (MEASURED_COLOR, MODEL_COLOR, PAPER_COLOR, FigureContext, caption, legend_below,
                                  mark_missing, not_run_text, numeric, save)

WEAK = "megatron_weak_scaling"


def _gpus(claim_id: str) -> int:
    return int(re.search(r"_(\d+)gpu$", claim_id).group(1))


def _measured_axis(frame: pd.DataFrame) -> str | None:
    for column in ("gpus", "tp", "world_size", "tp_size", "ranks"):
        if column in frame.columns and numeric(frame[column]).notna().any():
            return column
    return None


CPU = "megatron_weak_scaling_cpu"


def efficiency_rows(rows: pd.DataFrame) -> list[dict]:
    """Weak-scaling efficiency per tp from ``megatron_weak_scaling_cpu``'s rows, measured and predicted: the FLOP
    rate per rank at tp, over the rate at tp 1 (Megatron-LM sec. 5.1, Fig. 5's definition)."""
    out = []
    for source, metric in (("measured", "step_time_s"), ("predicted", "predicted_step_time_s")):
        hits = rows[rows["metric"] == metric]
        if hits.empty or 1 not in set(hits["tp"].astype(int)):
            continue
        base = hits[hits["tp"].astype(int) == 1].iloc[-1]
        base_rate = float(base["step_flops"]) / float(base["value"])
        for _, row in hits.iterrows():
            tp = int(row["tp"])
            rate = float(row["step_flops"]) / tp / float(row["value"])
            out.append({"source": source, "tp": tp, "efficiency": rate / base_rate})
    return out


def _measured_rows(ctx: FigureContext) -> pd.DataFrame:
    """Efficiencies measured on this machine: ``megatron_weak_scaling_cpu``'s step times turned into efficiency
    (measured and step-time-model predicted) by :func:`efficiency_rows`, plus any Megatron experiment's rows whose
    metric says measured efficiency."""
    if ctx.rows.empty:
        return ctx.rows
    frames = []
    if ctx.has_rows(CPU):
        derived = pd.DataFrame(efficiency_rows(ctx.rows_of(CPU)))
        if len(derived):
            frames.append(pd.DataFrame({"experiment": CPU, "metric": derived["source"] + " efficiency",
                                        "value": 100 * derived["efficiency"], "tp": derived["tp"]}))
    names = sorted(n for n in set(ctx.rows["experiment"]) if n.startswith("megatron") and n != CPU)
    frames += [ctx.rows_of(n, pattern=r"measured.*efficiency|efficiency.*measured") for n in names]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _fit_inputs(ctx: FigureContext, claim_ids) -> tuple[set[str], set[str]]:
    """(fitted, by definition): the Fig. 5 bars the performance model was fitted on, and the baseline that is
    100 % by definition, from the claim checks' evidence column (none marked where no check has run)."""
    if not len(ctx.checks) or "evidence" not in ctx.checks.columns:
        return set(), set()
    mine = ctx.checks[(ctx.checks["paper"] == "megatron_lm_2019") & ctx.checks["claim_id"].isin(set(claim_ids))]
    return (set(mine.loc[mine["evidence"] == "fitted", "claim_id"]),
            set(mine.loc[mine["evidence"] == "configuration", "claim_id"]))


def weak_scaling(ctx: FigureContext) -> list[Path]:
    """Fig. 5: paper bars (MP, MP+DP) beside the performance model's prediction (its fit inputs hatched), and the
    measured efficiency of the scale that was run (CPU ranks at ci scale, so the shape, not the V100 numbers, is
    what compares)."""
    paper = ctx.paper("megatron_lm_2019", r"fig5_eff_(mp|mpdp)_\d+gpu")
    model = ctx.reproduced("megatron_lm_2019", paper["claim_id"])
    fitted, defined = _fit_inputs(ctx, paper["claim_id"])
    fig, (ax_paper, ax_measured) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1.7, 1]})
    fig.subplots_adjust(wspace=0.25)
    labels, x = [], np.arange(len(paper))
    kinds_drawn: set[str] = set()
    model_kinds = {"predicted": ("", "performance model: predicted (held out from the fit)"),
                   "fitted": ("///", "performance model: fit input (equal by construction)"),
                   "defined": ("..", "1-GPU baseline: 100 % by definition")}
    for i, row in enumerate(paper.itertuples()):
        mode = "MP+DP" if "_mpdp_" in row.claim_id else "MP"
        labels.append(f"{_gpus(row.claim_id)}\n{mode}")
        ax_paper.bar(i - 0.2, row.value_num, 0.4, color=PAPER_COLOR, label="paper (Fig. 5, V100)" if i == 0 else None)
        ax_paper.text(i - 0.2, row.value_num + 1, f"{row.value_num:.0f}", ha="center", fontsize=9)
        if row.claim_id in model:
            kind = "fitted" if row.claim_id in fitted else "defined" if row.claim_id in defined else "predicted"
            hatch, label = model_kinds[kind]
            ax_paper.bar(i + 0.2, model[row.claim_id], 0.4, color=MODEL_COLOR, hatch=hatch, edgecolor="white",
                         label=None if kind in kinds_drawn else label)
            kinds_drawn.add(kind)
            ax_paper.text(i + 0.2, model[row.claim_id] + 1, f"{model[row.claim_id]:.0f}", ha="center", fontsize=9)
    if not model:
        mark_missing(ax_paper, not_run_text(WEAK, ctx), y=0.25)
    ax_paper.set_xticks(x, labels)
    ax_paper.set_ylim(0, 110)
    ax_paper.set_ylabel("weak-scaling efficiency vs 1 GPU (%)")
    ax_paper.set_xlabel("GPUs and parallelism (8.3B model at 8-way MP; MP+DP adds 64-way data parallelism)")
    ax_paper.set_title("Paper (Fig. 5) vs performance model (hatched bars: fit inputs)")
    legend_below(ax_paper, ncol=2)

    measured = _measured_rows(ctx)
    axis = _measured_axis(measured) if len(measured) else None
    if axis is not None:
        styles = iter([("o", "-", 6), ("s", "--", 12), ("^", ":", 9), ("D", "-.", 14)])
        for (exp, metric), group in measured.groupby(["experiment", "metric"]):
            group = group.assign(_x=numeric(group[axis]), _y=numeric(group["value"])).dropna(subset=["_x", "_y"])
            group = group.sort_values("_x")
            marker, line, size = next(styles, ("o", "-", 6))
            color = MODEL_COLOR if "predicted" in metric else MEASURED_COLOR
            # measured and predicted nearly coincide: open markers on a dashed line keep both visible
            ax_measured.plot(group["_x"], group["_y"], marker=marker, ls=line, ms=size, color=color,
                             mfc=color if line == "-" else "none", mew=1.5,
                             label=f"{exp}: {metric.replace('_', ' ')}")
        ticks = sorted(set(numeric(measured[axis]).dropna().astype(int)))
        ax_measured.set_xlabel(_AXIS_WORDS.get(axis, axis.replace("_", " ")))
        ax_measured.set_xscale("log", base=2)
        ax_measured.set_xticks(ticks, [str(t) for t in ticks])
        ax_measured.set_xlim(min(ticks) / 1.3, max(ticks) * 1.3)
        ax_measured.set_ylim(0, 110)
        legend_below(ax_measured, ncol=1)
    else:
        mark_missing(ax_measured, "measured: not yet run\n(no Megatron experiment has measured\nweak scaling on "
                                  "this machine)")
    ax_measured.set_ylabel("weak-scaling efficiency vs 1 rank (%)")
    ax_measured.set_title(f"Measured on CPU ranks ({ctx.scale} scale, one core per rank)")
    caption(fig, "Megatron-LM weak scaling. Paper: Shoeybi et al. 2019, Fig. 5 bar labels (V100 DGX-2H, 1.2B-8.3B "
                 "configs of Table 1; results/paper/megatron_lm_2019/figure_5.csv). Reproduced: "
                 f"{ctx.status(WEAK)}: the analytic performance model (repro/perfmodel/megatron.py) at the paper's "
                 "configuration. Fitted, not predicted: the model's three constants are fitted on the 1-GPU "
                 "baseline's 39 TFLOP/s (sec. 5.1; GEMM efficiency), the 64-GPU pure data-parallel bar (96 %) and "
                 "the 4-way MP bar (82 %), so the hatched bars agree by construction; the 1-GPU bar is 100 % by "
                 "definition; the other bars, the 8-way and 512-GPU ones included, are predictions held out from "
                 "the fit. "
                 f"Right: {ctx.status(CPU)}, Table 1's growth of the model with the model-parallel "
                 "degree at CPU size, measured, and predicted by the same step-time model calibrated on this machine "
                 "(both are 100 % at 1 rank by definition).")
    return save(fig, ctx, "megatron_weak_scaling")


_AXIS_WORDS = {"tp": "tensor-parallel ranks (model grows with them, Table 1)", "gpus": "GPUs",
               "world_size": "ranks", "tp_size": "tensor-parallel ranks", "ranks": "ranks"}


#: (label, paper id (verbatim), paper id (recomputed from the config), paper key, config ids)
_COUNT_ROWS = [
    ("GPT-2 1.2B (T1)", "megatron_lm_2019", "t1_1p2B_params", "t1_1p2B_params_recomputed", "t1_1p2B"),
    ("GPT-2 2.5B (T1)", "megatron_lm_2019", "t1_2p5B_params", "t1_2p5B_params_recomputed", "t1_2p5B"),
    ("GPT-2 4.2B (T1)", "megatron_lm_2019", "t1_4p2B_params", "t1_4p2B_params_recomputed", "t1_4p2B"),
    ("GPT-2 8.3B (T1)", "megatron_lm_2019", "t1_8p3B_params", "t1_8p3B_params_recomputed", "t1_8p3B"),
    ("GPT-2 355M (T2)", "megatron_lm_2019", None, "t2_355M_params_recomputed", "t2_355M"),
    ("ZeRO 60B (T4)", "zero_2019", None, "t4_check_60B", None),
    ("ZeRO 170B (T4)", "zero_2019", None, "t4_check_170B", None),
    ("MT-NLG 530B", "mt_nlg_2022", "params", "params_repro", None),
]


def _claim(ctx: FigureContext, paper: str, claim_id: str | None) -> float:
    if claim_id is None:
        return float("nan")
    hit = ctx.claims[(ctx.claims["paper"] == paper) & (ctx.claims["claim_id"] == claim_id)]
    return float(hit["value_num"].iloc[0]) if len(hit) else float("nan")


def parameter_counts(ctx: FigureContext) -> list[Path]:
    """Parameter counts: the paper's rounded number, the closed form 12Lh^2+13Lh+(V+s)h+2h evaluated on the
    paper's config (the claims table's derived value), and the count this suite reproduced (any experiment)."""
    table = []
    for label, paper, verbatim, derived, config in _COUNT_ROWS:
        ids = [c for c in (derived, verbatim) if c]
        got = ctx.reproduced(paper, ids)
        value = next((got[c] for c in ids if c in got), float("nan"))
        dims = ""
        if config:
            h, a, layers = (_claim(ctx, paper, f"{config}_{k}") for k in ("hidden", "heads", "layers"))
            dims = f"L={layers:.0f}, h={h:.0f}, a={a:.0f}"
        table.append({"model": label, "config": dims, "paper": _claim(ctx, paper, verbatim),
                      "recomputed": _claim(ctx, paper, derived), "reproduced": value})
    frame = pd.DataFrame(table)
    fig, (ax_bar, ax_table) = plt.subplots(2, 1, figsize=(12, 8), gridspec_kw={"height_ratios": [1.2, 1]})
    x = np.arange(len(frame))
    ax_bar.bar(x - 0.2, frame["recomputed"].fillna(frame["paper"]), 0.4, color=PAPER_COLOR,
               label="paper (config -> closed form)")
    have = frame["reproduced"].notna()
    ax_bar.bar(x[have] + 0.2, frame.loc[have, "reproduced"], 0.4, color=MODEL_COLOR, label="reproduced")
    if not have.any():
        mark_missing(ax_bar, "reproduced: not yet run (no experiment has checked a parameter count)")
    ax_bar.set_yscale("log")
    ax_bar.set_xticks(x, [label.replace(" (", "\n(") for label in frame["model"]])
    ax_bar.set_ylabel("parameters (billions, log scale)")
    legend_below(ax_bar, ncol=2)
    ax_bar.set_title("Parameter counts: paper vs reproduced")
    ax_table.axis("off")
    cells = []
    for row in frame.itertuples():
        ref = row.recomputed if pd.notna(row.recomputed) else row.paper
        rel = (row.reproduced / ref - 1) * 100 if pd.notna(row.reproduced) and pd.notna(ref) else float("nan")
        cells.append([row.model, row.config, _fmt(row.paper), _fmt(row.recomputed), _fmt(row.reproduced),
                      "" if np.isnan(rel) else f"{rel:+.2f}%"])
    tab = ax_table.table(cellText=cells, colLabels=["model", "config", "paper (B)", "paper, recomputed (B)",
                                                    "reproduced (B)", "diff"], loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(9)
    tab.auto_set_column_width(list(range(len(cells[0]))))
    tab.scale(1, 1.4)
    experiments = sorted(set(ctx.checks.loc[ctx.checks["claim_id"].isin(
        [c for r in _COUNT_ROWS for c in r[2:4] if c]), "experiment"])) if len(ctx.checks) else []
    source = ", ".join(ctx.status(e) for e in experiments) or "no experiment has run"
    caption(fig, "Parameter counts. Paper: Megatron-LM Tables 1-2 (V=51,200 padded vocabulary, s=1024), ZeRO Table 4, "
                 "MT-NLG (105 layers, h=20480); 'recomputed' is the claims table's closed-form value from the "
                 f"paper's config (results/paper/*). Reproduced: {source} (scale '{ctx.scale}').")
    return save(fig, ctx, "parameter_counts")


def _fmt(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.4g}"
