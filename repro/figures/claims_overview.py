"""Every claim of the claims report at a glance: paper value against this suite's, one panel per paper.

Drawn from the very table ``results/claims.md`` is written from (:func:`repro.claims.build_report` on the same
checks), so its counts are claims.md's: each panel's title gives the paper's verdict counts of the summary table.
Colour is the verdict, marker the evidence class (measured, simulated, predicted, derived, consistency,
configuration, fitted); a threshold claim ("> 50 %", "<= 8 GB") is drawn as its bound, an arrow from the bound
towards the side that satisfies it, with the suite's value as the point.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from repro.claims import CheckSet, build_report
from repro.claims_render import COLUMNS, OTHER_HARDWARE, other_hardware, summary
from repro.vocabulary import EVIDENCE
from repro.figures.common import MIN_FONT_PT, FigureContext, caption, mark_missing, save
from repro.paper import PAPER_TITLES

COLORS = {"reproduced": "#55A868", "agrees, not decisive": "#A6D8A0", "differs": "#C44E52",
          "consistent": "#64B5CD", "inconsistent": "#8C613C", "conforms": "#2A9D8F", "does not conform": "#6D2E46",
          "same quantity": "#CCB974", "not counted": "#DD8452", "not decidable": "#BBBBBB", "needs GPU": "#8172B3",
          "not run": "#999999", OTHER_HARDWARE: "#4C72B0"}
MARKERS = {"measured": "o", "simulated": "s", "predicted": "D", "derived": "^", "conformance": "<",
           "consistency": "v", "configuration": "x", "fitted": "P"}
_BOUND = re.compile(r"^\s*(>=|<=|>|<)\s*([-+0-9.eE]+)")


def bound_of(tolerance: object) -> tuple[str, float] | None:
    """``('>=', 50.0)``-like (``>``, ``<=``, ``<`` too) when the claim is a threshold, else None."""
    hit = _BOUND.match(str(tolerance or ""))
    return (hit.group(1), float(hit.group(2))) if hit else None


def _number(value: object) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def report_of(ctx: FigureContext) -> pd.DataFrame:
    """The claims report of the figure's checks: the same rows claims.md and claims.csv hold."""
    checks = ctx.checks.copy()
    if "experiment" in checks:  # the figure shows every experiment's checks: its provenance names their runs
        ctx.touched.update(str(name) for name in checks["experiment"] if name)
    for column in ("paper", "claim_id", "reproduced_value", "tolerance", "verdict", "note", "evidence", "device",
                   "hardware", "experiment", "scale"):
        if column not in checks:
            checks[column] = None if column == "reproduced_value" else ""
    return build_report(CheckSet(checks), ctx.claims)


def panel_title(paper: str, counts: pd.Series, drawn: int) -> str:
    """The paper's name and its verdict counts (those not zero), as claims.md's table by paper gives them, and how
    many are drawn."""
    parts = [f"{int(counts[v])} {v}" for v in COLUMNS if int(counts[v])]
    lines = [", ".join(parts[i:i + 3]) for i in range(0, len(parts), 3)]
    return (f"{PAPER_TITLES.get(paper, paper)}\n{int(counts['total'])} claims: " + ",\n".join(lines)
            + f"; {drawn} drawn")


def claims_overview(ctx: FigureContext) -> list[Path]:
    """Paper (x) against this suite (y), log-log, one panel per paper; colour = verdict, marker = evidence."""
    report = report_of(ctx)
    counts = summary(report)
    colour = report["verdict"].where(~other_hardware(report), OTHER_HARDWARE)  # as the summary counts them
    papers = list(PAPER_TITLES)
    fig, axes = plt.subplots(2, 3, figsize=(15, 10.5))
    fig.subplots_adjust(hspace=0.42, wspace=0.28)
    for ax, paper in zip(axes.flat, papers):
        mine = report[report["paper"] == paper]
        x = np.array([_number(v) for v in mine["paper_value"]])
        y = np.array([_number(v) for v in mine["reproduced_value"]])
        keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        drawn = mine[keep]
        if len(drawn):
            ends = [b[1] * (4 if b[0].startswith(">") else 0.25) for b in map(bound_of, drawn["tolerance"])
                    if b is not None and b[1] > 0]
            lo = min(x[keep].min(), y[keep].min(), *ends) / 2
            hi = max(x[keep].max(), y[keep].max(), *ends) * 2
            ax.plot([lo, hi], [lo, hi], "--", color="#888888", lw=1, zorder=1)
            for row, px, py, shade in zip(drawn.itertuples(), x[keep], y[keep], colour[drawn.index]):
                bound = bound_of(row.tolerance)
                if bound is not None and bound[1] > 0:  # the allowed side of the bound, from the bound
                    side, start = bound
                    end = start * 4 if side.startswith(">") else start / 4
                    ax.annotate("", xy=(px, end), xytext=(px, start), zorder=2,
                                arrowprops={"arrowstyle": "-|>", "color": COLORS[shade], "lw": 1.2,
                                            "alpha": 0.6})
                marker = MARKERS.get(row.evidence, "o")
                ax.scatter([px], [py], s=26, marker=marker, color=COLORS[shade], zorder=3,
                           edgecolors=None if marker == "x" else "white", linewidths=0.4)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        if not len(drawn):
            mark_missing(ax, "no claim of this paper has a number yet")
        ax.set_title(panel_title(paper, counts.loc[paper], len(drawn)) if paper in counts.index
                     else PAPER_TITLES[paper], fontsize=MIN_FONT_PT + 1)
        ax.set_xlabel("paper's value (claim's unit, log scale)")
        ax.set_ylabel("this suite's value (same unit, log scale)")
    verdict_handles = [Line2D([], [], ls="", marker="o", color=COLORS[v], label=v) for v in COLUMNS]
    evidence_handles = [Line2D([], [], ls="", marker=MARKERS[e], color="#444444", label=e) for e in EVIDENCE]
    bound_handle = [Line2D([], [], color="#777777", marker=">", lw=1.2, label="threshold claim: allowed side")]
    fig.legend(handles=verdict_handles + bound_handle, title="verdict (colour)", loc="upper left",
               bbox_to_anchor=(0.08, 0.005), ncol=3, frameon=False)
    fig.legend(handles=evidence_handles, title="evidence (marker)", loc="upper left", bbox_to_anchor=(0.52, 0.005),
               ncol=4, frameon=False)
    total = counts.loc["all"]
    caption(fig, "Every claim of results/claims.md with a positive number, paper's value (x) against this suite's "
                 "(y), log-log; the dashed line is equality. Panel titles give each paper's verdict counts, the "
                 "same as claims.md's summary, and how many rows are drawn (the others have no positive number "
                 "yet: not run, needs GPU, or a formula or text value); in all "
                 f"{int(total['total'])} claims: "
                 + ", ".join(f"{int(total[v])} {v}" for v in COLUMNS) + ". 'not counted' rows are settings the "
                 "suite was given (configuration) or inputs of a fit (fitted), shown but never counted as "
                 f"reproduced; '{OTHER_HARDWARE}' rows were compared on another class of GPU than the paper's "
                 "(the GPU is named in claims.md), counted apart. Rows: the experiments' newest rows at scale "
                 f"'{ctx.scale}'.")
    return save(fig, ctx, "claims_overview")
