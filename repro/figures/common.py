"""What every figure shares: the data it may read (:class:`FigureContext`), colours, captions, saving.

Figures read three tables and nothing else (plotting never parses logs): the paper's claims, the newest result
rows, and the experiments' :class:`ClaimCheck` rows (paper claim id -> reproduced value). A figure whose
experiment has not run still draws the paper's values and says "not yet run" where the reproduction would be.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

PAPER_COLOR = "#4C72B0"
MODEL_COLOR = "#DD8452"
MEASURED_COLOR = "#55A868"
MISSING_COLOR = "#999999"
VERDICT_COLORS = {"reproduced": "#55A868", "differs": "#C44E52", "needs GPU": "#8172B3", "not run": "#999999"}


@dataclass
class FigureContext:
    """The inputs of every figure function."""

    claims: pd.DataFrame
    rows: pd.DataFrame
    checks: pd.DataFrame
    scale: str
    out_dir: Path
    known: frozenset[str] = field(default_factory=frozenset)

    def paper(self, paper: str, pattern: str) -> pd.DataFrame:
        """Claims of ``paper`` whose id matches the regex ``pattern`` (full match), in file order."""
        rx = re.compile(pattern)
        mine = self.claims[self.claims["paper"] == paper]
        return mine[[bool(rx.fullmatch(c)) for c in mine["claim_id"]]].reset_index(drop=True)

    def reproduced(self, paper: str, claim_ids: Iterable[str]) -> dict[str, float]:
        """claim id -> reproduced value, for the claims an experiment has checked (with a value)."""
        ids = set(claim_ids)
        hit = self.checks[(self.checks["paper"] == paper) & self.checks["claim_id"].isin(ids)]
        hit = hit[hit["reproduced_value"].notna()]
        out: dict[str, float] = {}
        for row in hit.itertuples():
            try:
                out.setdefault(row.claim_id, float(row.reproduced_value))
            except (TypeError, ValueError):
                continue
        return out

    def rows_of(self, experiment: str, metric: str | None = None, pattern: str | None = None) -> pd.DataFrame:
        """Newest rows of ``experiment`` (optionally one metric, or metrics matching a regex)."""
        if self.rows.empty:
            return self.rows
        mine = self.rows[self.rows["experiment"] == experiment]
        if metric is not None:
            mine = mine[mine["metric"] == metric]
        if pattern is not None:
            rx = re.compile(pattern)
            mine = mine[[bool(rx.search(str(m))) for m in mine["metric"]]]
        return mine.dropna(axis=1, how="all").reset_index(drop=True)

    def status(self, experiment: str) -> str:
        """``name (ci scale, 12 rows, run 2026...)``, ``name: not yet run`` or ``name: not yet registered``."""
        mine = self.rows[self.rows["experiment"] == experiment] if len(self.rows) else self.rows
        if len(mine):
            scales = "/".join(sorted(set(mine["scale"])))
            runs = sorted(set(mine["run_id"]))
            return f"{experiment} ({scales} scale, {len(mine)} rows, run {runs[-1]})"
        if experiment not in self.known:
            return f"{experiment}: not yet registered"
        return f"{experiment}: not yet run"

    def has_rows(self, experiment: str) -> bool:
        return len(self.rows) > 0 and bool((self.rows["experiment"] == experiment).any())


def style() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    plt.rcParams["svg.hashsalt"] = "repro"  # stable ids, so an unchanged figure gives an unchanged SVG


def caption(fig: plt.Figure, text: str, *, width: int = 150) -> None:
    """Sources and scale under the axes (the figure's bottom margin grows to fit)."""
    wrapped = "\n".join(textwrap.fill(part, width) for part in text.split("\n"))
    lines = wrapped.count("\n") + 1
    height = fig.get_size_inches()[1]
    bottom = min(0.45, (0.25 + 0.16 * lines) / height + 0.06)
    fig.subplots_adjust(bottom=bottom)
    fig.text(0.01, 0.01, wrapped, ha="left", va="bottom", fontsize=7, color="#333333")


def mark_missing(ax: plt.Axes, text: str, *, y: float = 0.5) -> None:
    """Say on the axes that the reproduced values are missing, and how to make them."""
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="#555555",
            bbox={"boxstyle": "round", "facecolor": "#f4f4f4", "edgecolor": MISSING_COLOR})


def not_run_text(experiment: str, ctx: FigureContext) -> str:
    state = "not yet registered" if experiment not in ctx.known else "not yet run"
    return f"reproduced: {state}\n(repro run {experiment} --scale {ctx.scale})"


def save(fig: plt.Figure, ctx: FigureContext, name: str) -> list[Path]:
    """Write ``<name>.png`` and ``<name>.svg`` under the output folder (no timestamps inside)."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = ctx.out_dir / f"{name}.png", ctx.out_dir / f"{name}.svg"
    fig.savefig(png, dpi=120, metadata={"Software": None})
    fig.savefig(svg, metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return [png, svg]


def numeric(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce")
