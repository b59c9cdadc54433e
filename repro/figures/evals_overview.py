"""Evaluation results against Megatron-LM Tables 3 and 5, and MT-NLG throughput from iteration times (the overview
of every claim is :mod:`repro.figures.claims_overview`)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro.figures.common import (MEASURED_COLOR, MODEL_COLOR, PAPER_COLOR, FigureContext, caption,
                                  legend_below, mark_missing, not_run_text, numeric, save)

WIKI, RACE, MTNLG = "eval_wikitext_lambada", "eval_race", "mtnlg_layout"


def _paired_bars(ax: plt.Axes, ctx: FigureContext, paper: pd.DataFrame, labels: list[str], title: str,
                 ylabel: str) -> bool:
    """Paper bars beside reproduced ones (the colours are explained by the figure's shared legend); when nothing
    is reproduced the title says so, instead of a box over the bars."""
    got = ctx.reproduced("megatron_lm_2019", paper["claim_id"])
    x = np.arange(len(paper))
    ax.bar(x - 0.2, paper["value_num"], 0.4, color=PAPER_COLOR, label="paper")
    rep = [got.get(c, np.nan) for c in paper["claim_id"]]
    if any(np.isfinite(rep)):
        ax.bar(x + 0.2, rep, 0.4, color=MODEL_COLOR, label="reproduced")
    else:
        title += "\nreproduced: not run (the paper's models are not public)"
    for i, (p, r) in enumerate(zip(paper["value_num"], rep)):
        ax.text(i - 0.2, p, _short(p), ha="center", va="bottom", fontsize=9)
        if np.isfinite(r):
            ax.text(i + 0.2, r, _short(r), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, float(np.nanmax([*paper["value_num"], *rep])) * 1.15)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    return any(np.isfinite(rep))


def _short(value: float) -> str:
    """A bar label that fits over its bar: 19.31, 245,566 -> 245.6k."""
    return f"{value / 1e3:.1f}k" if abs(value) >= 1e4 else f"{value:.4g}"


def _measured_rows(ctx: FigureContext, experiments: tuple[str, ...]) -> pd.DataFrame:
    frames = [ctx.rows_of(e).assign(_exp=e) for e in experiments if ctx.has_rows(e)]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        return rows
    rows = rows.assign(_value=numeric(rows["value"])).dropna(subset=["_value"])
    parts = [rows[c].astype(str) for c in ("task", "definition") if c in rows.columns]
    label = rows["point"].astype(str)
    for part in parts:
        label = label + " " + part.where(~part.isin(["nan", "None"]), "")
    metric = rows["metric"].str.replace("_perplexity", " ppl").str.replace("_", " ")
    return rows.assign(_label=label.str.strip() + ": " + metric)


def _measured_bars(ax: plt.Axes, rows: pd.DataFrame, pattern: str, title: str, missing: str, *, xlabel: str,
                   log: bool = False, xlim: tuple[float, float] | None = None) -> None:
    """Horizontal bars of the measured rows whose metric matches ``pattern``."""
    rows = rows[rows["metric"].str.contains(pattern, regex=True)] if len(rows) else rows
    if rows.empty:
        mark_missing(ax, missing)
    else:
        if rows["point"].nunique() == 1:  # one point: its name goes in the title, not on every bar
            rows = rows.assign(_label=[lab.removeprefix(f"{pt} ") for lab, pt in zip(rows["_label"], rows["point"])])
            title += f" [{rows['point'].iloc[0]}]"
        if rows["metric"].nunique() == 1:  # one metric: say it once, in the title (unless the title already does)
            rows = rows.assign(_label=[lab.rsplit(": ", 1)[0] or "-" for lab in rows["_label"]])
            words = rows["metric"].iloc[0].replace("_perplexity", " ppl").replace("_", " ")
            if words.lower() not in title.lower():
                title += f": {words}"
        rows = rows.assign(_label=rows["_label"].str.replace("_", " "))
        y = np.arange(len(rows))
        ax.barh(y, rows["_value"], color=MEASURED_COLOR)
        ax.set_yticks(y, rows["_label"])
        ax.invert_yaxis()  # first row on top, as read
        for i, v in enumerate(rows["_value"]):
            ax.text(v, i, f" {v:.4g}", va="center", fontsize=9)
        if log and (rows["_value"] > 0).all():
            ax.set_xscale("log")
            ax.set_xlim(right=float(rows["_value"].max()) * 30)  # room for the value labels
        if xlim is not None:
            ax.set_xlim(*xlim)
    ax.set_xlabel(xlabel)
    ax.set_title(title)


def _labels(claim_ids, prefix: str, suffix: str) -> list[str]:
    """``t3_2p5B_wt103_ppl`` -> ``2.5B``; ``prev_sota`` -> ``prev. SOTA``."""
    out = []
    for claim_id in claim_ids:
        core = claim_id.removeprefix(prefix).removesuffix(suffix)
        core = re.sub(r"(\d)p(\d)", r"\1.\2", core).replace("prev_sota", "prev. SOTA").replace("_", " ")
        out.append(re.sub(r"(\d)([mb])\b", lambda m: m.group(1) + m.group(2).upper(), core))
    return out


def evals(ctx: FigureContext) -> list[Path]:
    """Top: WikiText-103 perplexity and LAMBADA accuracy (Table 3) and RACE accuracy (Table 5), paper vs
    reproduced. Bottom: what the eval experiments measured at the scale that was run, and App. E.1's token counts."""
    fig = plt.figure(figsize=(18, 11))
    top = fig.add_gridspec(1, 3, left=0.05, right=0.98, top=0.93, bottom=0.64, wspace=0.25)
    # the measured panels' bar labels are long ("toy-bert race megatron finetune test middle"): room on their left
    bottom = fig.add_gridspec(1, 3, left=0.21, right=0.98, top=0.5, bottom=0.06, wspace=1.05,
                              width_ratios=[1, 1, 0.9])
    axes_top = [fig.add_subplot(top[0, i]) for i in range(3)]
    axes_bottom = [fig.add_subplot(bottom[0, i]) for i in range(3)]
    ppl = ctx.paper("megatron_lm_2019", r"t3_(355M|2p5B|8p3B|prev_sota)_wt103_ppl")
    lam = ctx.paper("megatron_lm_2019", r"t3_(355M|2p5B|8p3B|prev_sota)_lambada_acc")
    race = ctx.paper("megatron_lm_2019", r"t5_megatron_(336m|1p3b|3p9b|3p9b_ensemble)_race")
    _paired_bars(axes_top[0], ctx, ppl, _labels(ppl["claim_id"], "t3_", "_wt103_ppl"),
                 "WikiText-103 perplexity (Table 3)", "perplexity (lower is better)")
    _paired_bars(axes_top[1], ctx, lam, _labels(lam["claim_id"], "t3_", "_lambada_acc"), "LAMBADA accuracy (Table 3)",
                 "accuracy (%)")
    _paired_bars(axes_top[2], ctx, race, _labels(race["claim_id"], "t5_megatron_", "_race"),
                 "RACE test accuracy (Table 5)", "accuracy (%)")
    for ax in axes_top:
        ax.set_xlabel("model (parameters)")
    rows = _measured_rows(ctx, (WIKI, RACE))
    missing = "\n".join(not_run_text(e, ctx) for e in (WIKI, RACE))
    _measured_bars(axes_bottom[0], rows, r"perplexity|ppl", f"Measured here ({ctx.scale} scale): perplexity", missing,
                   xlabel="perplexity (log scale; lower is better)", log=True)
    _measured_bars(axes_bottom[1], rows, r"^acc|accuracy", f"Measured here ({ctx.scale} scale): accuracy", missing,
                   xlabel="accuracy (%)", xlim=(0, 100))
    counts = ctx.paper("megatron_lm_2019", r"wt103_T0|wt103_T")
    _paired_bars(axes_bottom[2], ctx, counts, ["$T_o$\n(words)", "$T$\n(BPE targets)"],
                 "WikiText-103 test-set size (App. E.1)", "tokens")
    handles = [plt.Rectangle((0, 0), 1, 1, color=PAPER_COLOR), plt.Rectangle((0, 0), 1, 1, color=MODEL_COLOR),
               plt.Rectangle((0, 0), 1, 1, color=MEASURED_COLOR)]
    fig.legend(handles, ["paper", "reproduced (same quantity, this suite)", "measured here (tiny models)"],
               loc="lower center", bbox_to_anchor=(0.5, 0.965), ncol=3, frameon=False)
    used = sorted(set(rows["_exp"])) if len(rows) else []
    caption(fig, "Evaluations. Paper: Shoeybi et al. 2019, Table 3 (GPT-2 355M/2.5B/8.3B, previous SOTA), Table 5 "
                 "(BERT-style Megatron 336M/1.3B/3.9B) and App. E.1; results/paper/megatron_lm_2019/. Reproduced: "
                 f"{ctx.status(WIKI)}; {ctx.status(RACE)}. The paper's checkpoints are not public: at ci scale the "
                 "measured values come from the tiny models the eval experiments train here"
                 + (f" ({', '.join(used)})" if used else "") + ", so they test the harness, not the paper's numbers.")
    return save(fig, ctx, "evals")


def mtnlg_throughput(ctx: FigureContext) -> list[Path]:
    """MT-NLG per-GPU TFLOP/s at 280/350/420 nodes: the paper's numbers and the ones recomputed from iteration
    times with 96*B*s*L*h^2*(1 + s/6h + V/16Lh)."""
    fig, ax = plt.subplots(figsize=(9, 5))
    paper = ctx.paper("mt_nlg_2022", r"tflops_(280|350|420)n")
    got = ctx.reproduced("mt_nlg_2022", [f"{c}_repro" for c in paper["claim_id"]] + list(paper["claim_id"]))
    x = np.arange(len(paper))
    ax.bar(x - 0.2, paper["value_num"], 0.4, color=PAPER_COLOR, label="paper (sec. 2.4, secondary)")
    rep = [got.get(f"{c}_repro", got.get(c, np.nan)) for c in paper["claim_id"]]
    if any(np.isfinite(rep)):
        ax.bar(x + 0.2, rep, 0.4, color=MODEL_COLOR, label="recomputed from the paper's iteration times (arithmetic)")
    else:
        mark_missing(ax, not_run_text(MTNLG, ctx), y=0.3)
    for i, (p, r) in enumerate(zip(paper["value_num"], rep)):
        ax.text(i - 0.2, p, f"{p:.0f}", ha="center", va="bottom", fontsize=9)
        if np.isfinite(r):
            ax.text(i + 0.2, r, f"{r:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, [c.split("_")[1].replace("n", " nodes") for c in paper["claim_id"]])
    ax.set_xlabel("DGX A100 nodes (8 GPUs each; data parallelism grows with them)")
    ax.set_ylabel("throughput per A100 (TFLOP/s)")
    ax.set_ylim(0, float(np.nanmax([*paper["value_num"], *rep])) * 1.12)
    legend_below(ax, ncol=2)
    ax.set_title("MT-NLG 530B throughput (8-way TP x 35-way PP)")
    caption(fig, "MT-NLG 530B. Paper: Smith et al. 2022 sec. 2.4 as quoted by MTNLG-SEC1/SEC2 (not the primary text): "
                 f"60.1/50.2/44.4 s per iteration. Reproduced: {ctx.status(MTNLG)}: arithmetic on the paper's own "
                 "iteration times with 96*B*s*L*h^2*(1 + s/6h + V/16Lh) FLOPs per iteration, not a measurement.")
    return save(fig, ctx, "mtnlg_throughput")
