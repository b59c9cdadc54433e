"""Evaluation results against Megatron-LM Tables 3 and 5, MT-NLG throughput from iteration times, and an
overview of every checked claim (paper vs reproduced, coloured by verdict)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro.figures.common import (MEASURED_COLOR, MODEL_COLOR, PAPER_COLOR, VERDICT_COLORS, FigureContext, caption,
                                  mark_missing, not_run_text, numeric, save)
from repro.paper import PAPER_TITLES

WIKI, RACE, MTNLG = "eval_wikitext_lambada", "eval_race", "mtnlg_layout"


def _paired_bars(ax: plt.Axes, ctx: FigureContext, paper: pd.DataFrame, labels: list[str], title: str,
                 ylabel: str) -> bool:
    got = ctx.reproduced("megatron_lm_2019", paper["claim_id"])
    x = np.arange(len(paper))
    ax.bar(x - 0.2, paper["value_num"], 0.4, color=PAPER_COLOR, label="paper")
    rep = [got.get(c, np.nan) for c in paper["claim_id"]]
    if any(np.isfinite(rep)):
        ax.bar(x + 0.2, rep, 0.4, color=MODEL_COLOR, label="reproduced")
    else:
        mark_missing(ax, "reproduced: not yet run\n(the paper's models are not public;\nsee the panels below)", y=0.25)
    for i, (p, r) in enumerate(zip(paper["value_num"], rep)):
        ax.text(i - 0.2, p, f"{p:.4g}", ha="center", va="bottom", fontsize=6)
        if np.isfinite(r):
            ax.text(i + 0.2, r, f"{r:.4g}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(x, labels, fontsize=7, rotation=20)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return any(np.isfinite(rep))


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


def _measured_bars(ax: plt.Axes, rows: pd.DataFrame, pattern: str, title: str, missing: str, *,
                   log: bool = False, xlim: tuple[float, float] | None = None) -> None:
    """Horizontal bars of the measured rows whose metric matches ``pattern``."""
    rows = rows[rows["metric"].str.contains(pattern, regex=True)] if len(rows) else rows
    if rows.empty:
        mark_missing(ax, missing)
    else:
        if rows["point"].nunique() == 1:  # one point: its name goes in the title, not on every bar
            rows = rows.assign(_label=[lab.removeprefix(f"{pt} ") for lab, pt in zip(rows["_label"], rows["point"])])
            title += f" [{rows['point'].iloc[0]}]"
        if rows["metric"].nunique() == 1:  # one metric: say it once, in the title
            rows = rows.assign(_label=[lab.rsplit(": ", 1)[0] or "-" for lab in rows["_label"]])
            title += " " + rows["metric"].iloc[0].replace("_perplexity", " ppl").replace("_", " ")
        rows = rows.assign(_label=rows["_label"].str.replace("_", " "))
        y = np.arange(len(rows))
        ax.barh(y, rows["_value"], color=MEASURED_COLOR)
        ax.set_yticks(y, rows["_label"], fontsize=6)
        for i, v in enumerate(rows["_value"]):
            ax.text(v, i, f" {v:.4g}", va="center", fontsize=6)
        if log and (rows["_value"] > 0).all():
            ax.set_xscale("log")
        if xlim is not None:
            ax.set_xlim(*xlim)
    ax.set_title(title, fontsize=9)


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
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    fig.subplots_adjust(hspace=0.45, wspace=0.6, left=0.13, right=0.97)
    ppl = ctx.paper("megatron_lm_2019", r"t3_(355M|2p5B|8p3B|prev_sota)_wt103_ppl")
    lam = ctx.paper("megatron_lm_2019", r"t3_(355M|2p5B|8p3B|prev_sota)_lambada_acc")
    race = ctx.paper("megatron_lm_2019", r"t5_megatron_(336m|1p3b|3p9b|3p9b_ensemble)_race")
    _paired_bars(axes[0, 0], ctx, ppl, _labels(ppl["claim_id"], "t3_", "_wt103_ppl"),
                 "WikiText-103 perplexity (Table 3)", "perplexity")
    _paired_bars(axes[0, 1], ctx, lam, _labels(lam["claim_id"], "t3_", "_lambada_acc"), "LAMBADA accuracy (Table 3)",
                 "accuracy (%)")
    _paired_bars(axes[0, 2], ctx, race, _labels(race["claim_id"], "t5_megatron_", "_race"),
                 "RACE test accuracy (Table 5)", "accuracy (%)")
    rows = _measured_rows(ctx, (WIKI, RACE))
    missing = "\n".join(not_run_text(e, ctx) for e in (WIKI, RACE))
    _measured_bars(axes[1, 0], rows, r"perplexity|ppl", f"Measured here ({ctx.scale}): perplexity", missing, log=True)
    _measured_bars(axes[1, 1], rows, r"^acc|accuracy", f"Measured here ({ctx.scale}): accuracy (%)", missing,
                   xlim=(0, 100))
    counts = ctx.paper("megatron_lm_2019", r"wt103_T0|wt103_T")
    _paired_bars(axes[1, 2], ctx, counts, ["$T_o$ (words)", "$T$ (BPE targets)"], "WikiText-103 token counts "
                 "(App. E.1)", "tokens")
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
    fig, ax = plt.subplots(figsize=(8, 4.6))
    paper = ctx.paper("mt_nlg_2022", r"tflops_(280|350|420)n")
    got = ctx.reproduced("mt_nlg_2022", [f"{c}_repro" for c in paper["claim_id"]] + list(paper["claim_id"]))
    x = np.arange(len(paper))
    ax.bar(x - 0.2, paper["value_num"], 0.4, color=PAPER_COLOR, label="paper (sec. 2.4, secondary)")
    rep = [got.get(f"{c}_repro", got.get(c, np.nan)) for c in paper["claim_id"]]
    if any(np.isfinite(rep)):
        ax.bar(x + 0.2, rep, 0.4, color=MODEL_COLOR, label="reproduced from iteration time")
    else:
        mark_missing(ax, not_run_text(MTNLG, ctx), y=0.3)
    ax.set_xticks(x, [c.split("_")[1].replace("n", " nodes") for c in paper["claim_id"]])
    ax.set_ylabel("TFLOP/s per A100")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("MT-NLG 530B throughput (8-way TP x 35-way PP)")
    caption(fig, "MT-NLG 530B. Paper: Smith et al. 2022 sec. 2.4 as quoted by MTNLG-SEC1/SEC2 (not the primary text): "
                 f"60.1/50.2/44.4 s per iteration. Reproduced: {ctx.status(MTNLG)}.")
    return save(fig, ctx, "mtnlg_throughput")


def claims_overview(ctx: FigureContext) -> list[Path]:
    """Every claim an experiment checked with a number: paper value vs reproduced value, one panel per paper."""
    checks = ctx.checks[ctx.checks["reproduced_value"].notna()] if len(ctx.checks) else ctx.checks
    papers = list(PAPER_TITLES)
    fig, axes = plt.subplots(2, 3, figsize=(14, 9))
    fig.subplots_adjust(hspace=0.4, wspace=0.3)
    values = ctx.claims.set_index(["paper", "claim_id"])["value_num"]
    for ax, paper in zip(axes.flat, papers):
        mine = checks[checks["paper"] == paper] if len(checks) else checks
        pts = [(values.get((paper, r.claim_id), np.nan), float(r.reproduced_value), r.verdict) for r in
               mine.itertuples() if _is_number(r.reproduced_value)]
        pts = [p for p in pts if np.isfinite(p[0]) and p[0] > 0 and p[1] > 0]
        if pts:
            for verdict, color in VERDICT_COLORS.items():
                sel = [p for p in pts if p[2] == verdict]
                if sel:
                    ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=14, color=color, label=f"{verdict} ({len(sel)})")
            lo = min(min(p[0], p[1]) for p in pts) / 1.5
            hi = max(max(p[0], p[1]) for p in pts) * 1.5
            ax.plot([lo, hi], [lo, hi], "--", color="#888888", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        else:
            mark_missing(ax, "no claim of this paper checked yet")
        ax.set_title(PAPER_TITLES[paper], fontsize=9)
        ax.set_xlabel("paper value")
        ax.set_ylabel("reproduced value")
    caption(fig, "All numerically checked claims, paper (x) vs reproduced (y), log-log, coloured by verdict. Paper: "
                 "results/paper/paper_claims.csv. Reproduced: the experiments' claim mappings on their newest rows "
                 f"(scale '{ctx.scale}'); see results/claims.md for tolerances and the command behind each point.")
    return save(fig, ctx, "claims_overview")


def _is_number(value: object) -> bool:
    try:
        return np.isfinite(float(value))
    except (TypeError, ValueError):
        return False
