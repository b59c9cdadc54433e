"""ZeRO figures: per-device model-state memory by stage and N_d (Table 1; formula vs measured ledger) and
communication volume by stage (sec. 7: DP 2psi, P_os+g 2psi, P_os+g+p 3psi)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro.figures.common import (MODEL_COLOR, PAPER_COLOR, FigureContext, caption, legend_below, mark_missing,
                                  numeric, save)

STAGES = {"baseline": "baseline DP", "Pos": "$P_{os}$", "Posg": "$P_{os+g}$", "Posgp": "$P_{os+g+p}$"}
STAGE_COLORS = {"baseline": "#555555", "Pos": "#4C72B0", "Posg": "#DD8452", "Posgp": "#55A868"}
#: marker, line style and marker size per stage, so that stages with equal values stay visible on top of each other
STAGE_MARKS = {"baseline": ("o", "-", 11), "Pos": ("s", "--", 8), "Posg": ("^", ":", 6), "Posgp": ("D", "-", 6)}
#: words for the measured metrics' names (the axis says what was counted, not the column name)
METRIC_WORDS = {"volume_in_psi": "elements sent per rank per step (x psi)",
                "wire_bytes_per_step": "bytes sent per rank per step",
                "bytes_per_param": "model-state bytes per rank, per model parameter"}
UNIT_WORDS = {"bytes/param": "bytes per parameter", "x psi": "x psi"}


def _axis_label(metric: str, unit: str) -> str:
    words = METRIC_WORDS.get(metric)
    if words:
        return words
    return f"{metric.replace('_', ' ')} ({UNIT_WORDS.get(unit, unit)})"


def _by_stage(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(stage, rows sorted by N_d) in the paper's order: baseline, P_os, P_os+g, P_os+g+p."""
    groups = dict(list(frame.dropna(subset=["_stage"]).groupby("_stage"))) if len(frame) else {}
    return [(stage, groups[stage].sort_values("_nd")) for stage in STAGES if stage in groups]
_CELL = re.compile(r"t1_(?P<model>[\d.]+[BT])_(?P<stage>Pos|Posg|Posgp)_nd(?P<nd>\d+)$")
_LEDGER_STAGE = {"0": "baseline", "stage0": "baseline", "baseline": "baseline", "ddp": "baseline", "dp": "baseline",
                 "1": "Pos", "stage1": "Pos", "pos": "Pos", "2": "Posg", "stage2": "Posg", "posg": "Posg",
                 "3": "Posgp", "stage3": "Posgp", "posgp": "Posgp"}


def _stage_key(value: object) -> str | None:
    """``'Pos+g'``, ``'P_os+g'``, ``2``, ``'stage2'`` -> ``'Posg'``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).lower()
    for ch in "+_ ${}":
        text = text.replace(ch, "")
    return _LEDGER_STAGE.get(text)


def _table1(ctx: FigureContext) -> pd.DataFrame:
    cells = ctx.paper("zero_2019", r"t1_[\d.]+[BT]_(Pos|Posg|Posgp)_nd\d+")
    parsed = cells["claim_id"].str.extract(_CELL)
    frame = pd.concat([cells[["claim_id", "value_num"]], parsed], axis=1)
    frame["nd"] = frame["nd"].astype(int)
    got = ctx.reproduced("zero_2019", frame["claim_id"])
    frame["reproduced"] = frame["claim_id"].map(got)
    return frame


def _ledger_rows(ctx: FigureContext, pattern: str) -> pd.DataFrame:
    """Measured rows of any ZeRO experiment whose metric matches ``pattern`` and that name a stage and N_d."""
    if ctx.rows.empty:
        return ctx.rows
    frames = []
    for name in sorted(set(ctx.rows["experiment"])):
        if not name.startswith("zero") or name.startswith("zero_infinity"):
            continue
        rows = ctx.rows_of(name, pattern=pattern)
        stage_col = next((c for c in ("stage", "zero_stage") if c in rows.columns), None)
        nd_col = next((c for c in ("nd", "dp_size", "world_size", "n_d") if c in rows.columns), None)
        if len(rows) and stage_col and nd_col:
            frames.append(rows.assign(_stage=rows[stage_col].map(_stage_key),
                                      _nd=numeric(rows[nd_col]), _value=numeric(rows["value"]), _exp=name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def memory_by_stage(ctx: FigureContext) -> list[Path]:
    """Table 1 per model size (paper cells vs the formula this suite computed), and the per-rank bytes the memory
    ledger measured at the scale that was run, against the formula for the same toy model."""
    table = _table1(ctx)
    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.4 * (len(models) + 1), 4.8))
    fig.subplots_adjust(wspace=0.35)
    for ax, model in zip(axes, models):
        sub = table[table["model"] == model]
        for stage, group in sub.groupby("stage", sort=False):
            group = group.sort_values("nd")
            ax.plot(group["nd"], group["value_num"], "s", mfc="none", ms=8, color=STAGE_COLORS[stage],
                    label=f"paper {STAGES[stage]}")
            have = group.dropna(subset=["reproduced"])
            if len(have):
                ax.plot(have["nd"], have["reproduced"], "-", color=STAGE_COLORS[stage], lw=1.5,
                        label=f"formula {STAGES[stage]}")
        if sub["reproduced"].isna().all():
            mark_missing(ax, "reproduced: not yet run\n(repro run zero_memory_tables)", y=0.2)
        ax.set_xscale("log", base=4)
        ax.set_xticks(sorted(sub["nd"].unique()), [str(n) for n in sorted(sub["nd"].unique())])
        ax.set_yscale("log")
        ax.set_xlabel("$N_d$ (data-parallel degree)")
        ax.set_ylabel("model-state memory per device (GB, log scale)")
        ax.set_title(f"{model} model, K=12 (Table 1)")
    legend_below(axes[len(models) // 2], ncol=3)
    ax = axes[-1]
    measured = _ledger_rows(ctx, r"^bytes_per_param$|^measured")
    if len(measured) and {"formula_bytes", "psi"} <= set(measured.columns):
        # rows that carry the formula beside the measurement (zero_memory_measured)
        formula = measured.assign(_value=numeric(measured["formula_bytes"]) / numeric(measured["psi"]))
    else:
        formula = _ledger_rows(ctx, r"^(formula|expected)_bytes")
    if len(measured):
        for stage, group in _by_stage(measured):
            ax.plot(group["_nd"], group["_value"], "o", ms=7, color=STAGE_COLORS[stage],
                    label=f"ledger {STAGES[stage]}")
        for stage, group in _by_stage(formula):
            ax.plot(group["_nd"], group["_value"], "-", color=STAGE_COLORS[stage], alpha=0.7,
                    label=f"formula {STAGES[stage]}")
        ax.set_ylabel(_axis_label(str(measured["metric"].iloc[0]), str(measured["unit"].iloc[0])))
        ax.set_xscale("log", base=2)
        ticks = sorted(set(measured["_nd"].dropna().astype(int)))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        legend_below(ax, ncol=2)
        source = ", ".join(ctx.status(e) for e in sorted(set(measured["_exp"])))
    else:
        mark_missing(ax, "measured ledger: not yet run\n(ZeRO stage experiments)")
        source = "no ZeRO stage experiment has run"
    ax.set_xlabel("$N_d$ (data-parallel ranks)")
    ax.set_title(f"Measured per-rank memory ({ctx.scale} scale)")
    tables = sorted(set(ctx.checks.loc[ctx.checks["claim_id"].isin(table["claim_id"]), "experiment"])) \
        if len(ctx.checks) else []
    caption(fig, "ZeRO per-device model-state memory. Paper: Rajbhandari et al. 2019, Table 1 (squares; "
                 "results/paper/zero_2019/table_1.csv), 2psi + 2psi + K psi with K=12 split over N_d by stage. "
                 f"Formula lines: {', '.join(ctx.status(e) for e in tables) or 'not yet run'}. "
                 f"Measured: bytes of parameters, gradients and optimizer states held per rank, {source}.")
    return save(fig, ctx, "zero_memory_by_stage")


_COMM = [("comm_dp", "baseline DP"), ("comm_posg", "$P_{os+g}$"), ("comm_posgp", "$P_{os+g+p}$")]


def communication_volume(ctx: FigureContext) -> list[Path]:
    """Communication per step in units of psi: the paper's 2/2/3, what the collective ledger counted."""
    fig, (ax, ax_measured) = plt.subplots(1, 2, figsize=(12, 4.8))
    fig.subplots_adjust(wspace=0.3)
    paper = ctx.paper("zero_2019", r"comm_(dp|posg|posgp)")
    got = ctx.reproduced("zero_2019", paper["claim_id"])
    x = np.arange(len(_COMM))
    values = [float(paper.loc[paper["claim_id"] == cid, "value_num"].iloc[0]) for cid, _ in _COMM]
    ax.bar(x - 0.2, values, 0.4, color=PAPER_COLOR, label="paper (sec. 7)")
    rep = [got.get(cid, np.nan) for cid, _ in _COMM]
    if any(np.isfinite(rep)):
        ax.bar(x + 0.2, rep, 0.4, color=MODEL_COLOR, label="reproduced (ledger)")
        for i, v in enumerate(rep):
            if np.isfinite(v):
                ax.text(i + 0.2, v + 0.05, f"{v:.3g}", ha="center", fontsize=9)
    else:
        mark_missing(ax, "reproduced: not yet run\n(ZeRO stage experiments)", y=0.8)
    ax.set_xticks(x, [label for _, label in _COMM])
    ax.set_ylabel("elements sent per rank per step (x psi)")
    ax.set_xlabel("data-parallel flavour (ZeRO stage)")
    ax.set_ylim(0, max(values) * 1.15)
    ax.set_title("Paper vs reproduced")
    legend_below(ax, ncol=2)
    measured = _ledger_rows(ctx, r"comm|volume|bytes_sent|traffic")
    if len(measured):
        ticks = sorted(set(measured["_nd"].dropna().astype(int)))
        stages = _by_stage(measured)
        # equal values would hide each other: each stage gets its own marker and line style and a small
        # horizontal offset, and the legend names the stages it coincides with
        step = 0.05 * (max(ticks) - min(ticks) or 1)
        seen: list[tuple[str, tuple]] = []
        for index, (stage, group) in enumerate(stages):
            values = tuple(zip(group["_nd"], group["_value"].round(6)))
            same = [STAGES[other] for other, vals in seen if vals == values]
            seen.append((stage, values))
            label = STAGES[stage] + (f" (same values as {', '.join(same)})" if same else "")
            marker, line, size = STAGE_MARKS[stage]
            offset = (index - (len(stages) - 1) / 2) * step
            ax_measured.plot(group["_nd"] + offset, group["_value"], marker=marker, ls=line, ms=size,
                             color=STAGE_COLORS[stage], mfc="none" if size > 6 else STAGE_COLORS[stage], mew=1.5,
                             label=label)
        ax_measured.set_xlabel("$N_d$ (data-parallel ranks; stages drawn slightly apart)")
        ax_measured.set_xticks(ticks, [str(t) for t in ticks])
        ax_measured.set_xlim(min(ticks) - 8 * step, max(ticks) + 8 * step)
        ax_measured.set_ylim(0, float(measured["_value"].max()) * 1.15)
        ax_measured.set_ylabel(_axis_label(str(measured["metric"].iloc[0]), str(measured["unit"].iloc[0])))
        legend_below(ax_measured, ncol=2)
        source = ", ".join(ctx.status(e) for e in sorted(set(measured["_exp"])))
    else:
        mark_missing(ax_measured, "measured: not yet run")
        source = "no ZeRO stage experiment has run"
    ax_measured.set_title(f"Measured by the collective ledger ({ctx.scale} scale)")
    caption(fig, "ZeRO communication volume by stage (psi = the model's parameter count). Paper: Rajbhandari et al. "
                 "2019, sec. 7 (baseline all-reduce 2psi; P_os+g reduce-scatter + all-gather 2psi; P_os+g+p 3psi = "
                 "1.5x). Reproduced: bytes counted per collective by repro.dist's ledger on gloo CPU ranks, divided by "
                 "(N_d-1)/N_d x psi x the element size (a ring collective's bytes on the wire), "
                 f"{source}. Baseline DP, P_os and P_os+g each send 2psi, so their lines coincide; they are drawn "
                 "slightly apart, each with its own marker.")
    return save(fig, ctx, "zero_communication_volume")
