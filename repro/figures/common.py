"""What every figure shares: the data it may read (:class:`FigureContext`), colours, captions, saving.

Figures read three tables and nothing else (plotting never parses logs): the paper's claims, the newest result
rows, and the experiments' :class:`ClaimCheck` rows (paper claim id -> reproduced value). A figure whose
experiment has not run still draws the paper's values and says "not yet run" where the reproduction would be.
"""

from __future__ import annotations

import re
import textwrap
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

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
    #: the experiments whose rows or claim checks the figure being drawn has read (its provenance line)
    touched: set[str] = field(default_factory=set)

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
        if "experiment" in hit:
            self.touched.update(str(e) for e in hit["experiment"] if e)
        out: dict[str, float] = {}
        for row in hit.itertuples():
            try:
                out.setdefault(row.claim_id, float(row.reproduced_value))
            except (TypeError, ValueError):
                continue
        return out

    def rows_of(self, experiment: str, metric: str | None = None, pattern: str | None = None) -> pd.DataFrame:
        """Newest rows of ``experiment`` (optionally one metric, or metrics matching a regex)."""
        self.touched.add(experiment)
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
        self.touched.add(experiment)
        mine = self.rows[self.rows["experiment"] == experiment] if len(self.rows) else self.rows
        if len(mine):
            scales = "/".join(sorted(set(mine["scale"])))
            runs = sorted(set(mine["run_id"]))
            return f"{experiment} ({scales} scale, {len(mine)} rows, run {runs[-1]})"
        if experiment not in self.known:
            return f"{experiment}: not yet registered"
        return f"{experiment}: not yet run"

    def has_rows(self, experiment: str) -> bool:
        self.touched.add(experiment)
        return len(self.rows) > 0 and bool((self.rows["experiment"] == experiment).any())

    def provenance(self) -> str:
        """The provenance line of the figure being drawn: the runs of the experiments it read."""
        mine = self.rows[self.rows["experiment"].isin(self.touched)] if len(self.rows) else self.rows
        return rows_provenance(mine, self.scale)


#: Smallest font anywhere on a figure, in points: 9 pt at the saved 120 dpi is 15 pixels, readable at 100 %.
MIN_FONT_PT = 9
DPI = 120


def style() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    plt.rcParams.update({
        "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": MIN_FONT_PT,
        "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
        "figure.titlesize": 12,
    })
    plt.rcParams["svg.hashsalt"] = "repro"  # stable ids, so an unchanged figure gives an unchanged SVG


def caption(fig: plt.Figure, text: str) -> None:
    """Sources and scale under everything else (axes, their labels, legends below them): :func:`save` places it
    once the layout is known, so it never covers a legend or a tick label."""
    fig._repro_caption = text  # type: ignore[attr-defined]


def legend_below(ax: plt.Axes, *, ncol: int = 2, **kwargs) -> plt.Legend:
    """A legend under the axes (below its tick labels and x label), so that it never covers data; :func:`save`
    moves it there once the tick labels' size is known. Use ``fig_legend_above`` for a legend shared by panels."""
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=ncol, frameon=False, **kwargs)
    legend._repro_below = True  # type: ignore[attr-defined]
    return legend


def _place_legends_below(fig: plt.Figure, renderer) -> None:
    pad_px = 4 * DPI / 72
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not getattr(legend, "_repro_below", False):
            continue
        legend.set_visible(False)
        box = ax.get_tightbbox(renderer)
        legend.set_visible(True)
        frame = ax.get_window_extent(renderer)
        # figure coordinates, not pixels: the SVG is written at another dpi than the PNG
        anchor = fig.transFigure.inverted().transform((frame.x0 + frame.width / 2, box.y0 - pad_px))
        legend.set_bbox_to_anchor(tuple(anchor), transform=fig.transFigure)


def _place_caption(fig: plt.Figure, renderer) -> None:
    text = getattr(fig, "_repro_caption", None)
    if not text:
        return
    box = fig.get_tightbbox(renderer)  # inches, everything drawn so far
    width_in = max(box.width, 6.0)
    chars = int(width_in * 72 / (0.52 * MIN_FONT_PT))  # DejaVu Sans averages about half an em per character
    wrapped = "\n".join(textwrap.fill(part, chars) for part in text.split("\n"))
    fig_w, fig_h = fig.get_size_inches()
    fig.text(box.x0 / fig_w, (box.y0 - 0.12) / fig_h, wrapped, ha="left", va="top", fontsize=MIN_FONT_PT,
             color="#333333")


def mark_missing(ax: plt.Axes, text: str, *, y: float = 0.5) -> None:
    """Say on the axes that the reproduced values are missing, and how to make them."""
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="center", fontsize=MIN_FONT_PT, color="#555555",
            bbox={"boxstyle": "round", "facecolor": "#f4f4f4", "edgecolor": MISSING_COLOR})


def not_run_text(experiment: str, ctx: FigureContext) -> str:
    state = "not yet registered" if experiment not in ctx.known else "not yet run"
    return f"reproduced: {state}\n(repro run {experiment} --scale {ctx.scale})"


def rows_provenance(rows: pd.DataFrame, scale: str) -> str:
    """``Provenance: scale any; exp: run R (rows at commit C) ...``: the runs a figure was drawn from and the commit
    each was made at (from the rows' provenance), or that it shows the papers' values only."""
    if rows is None or not len(rows):
        return f"Provenance: scale {scale}; no result rows (paper values from results/paper/paper_claims.csv)."
    if not {"experiment", "run_id", "scale"} <= set(rows.columns):
        return f"Provenance: scale {scale}; {len(rows)} rows handed over directly, not read from a run."
    parts = []
    for experiment, mine in rows.groupby("experiment", sort=True):
        commits = sorted({str(c)[:10] for c in mine.get("prov_git_commit", pd.Series(dtype=str)).dropna() if c})
        dirty = "prov_git_dirty" in mine and bool(mine["prov_git_dirty"].fillna(False).astype(bool).any())
        at = f" at commit {', '.join(commits)}{' (uncommitted changes)' if dirty else ''}" if commits else ""
        runs = sorted(set(mine["run_id"]))
        scales = "/".join(sorted(set(mine["scale"])))
        parts.append(f"{experiment}: {scales} scale, run{'s' if len(runs) > 1 else ''} {', '.join(runs)}{at}")
    return f"Provenance (scale {scale}): " + "; ".join(parts) + "."


#: the files :func:`save_figure` writes for a figure, by suffix: the pictures and the data file (what it shows)
FORMATS = ("png", "svg", "json")
_writing: ContextVar[tuple[str, ...]] = ContextVar("figure_formats", default=FORMATS)


@contextmanager
def writing(formats: Iterable[str]) -> Iterator[None]:
    """Inside, :func:`save_figure` writes only ``formats`` (a subset of :data:`FORMATS`): ``("json",)`` checks
    that figures are current without rasterizing a pixel (the data file is the same, laid out as for the pictures:
    the caption's wrapping depends on the layout). Every figure function, the experiments' own too, goes through
    it, so no signature carries the choice."""
    chosen = tuple(formats)
    if not chosen or not set(chosen) <= set(FORMATS):
        raise ValueError(f"figure formats {chosen}: each must be one of {', '.join(FORMATS)}, at least one")
    token = _writing.set(chosen)
    try:
        yield
    finally:
        _writing.reset(token)


def save(fig: plt.Figure, ctx: FigureContext, name: str) -> list[Path]:
    """:func:`save_figure` under the context's output folder, with the provenance of the rows the figure read."""
    return save_figure(fig, ctx.out_dir, name, ctx.provenance())


def save_figure(fig: plt.Figure, out_dir: Path, name: str, provenance: str) -> list[Path]:
    """Write ``<name>.png``, ``<name>.svg`` and ``<name>.json`` (what the figure shows, as data:
    :mod:`repro.figures.figure_data`) under ``out_dir``, no timestamps inside (only the formats chosen with
    :func:`writing`; all three by default). The caption ends with
    ``provenance``; legends made by :func:`legend_below` go under their axes, the caption under everything, and the
    saved area grows to hold them (``bbox_inches="tight"``), so nothing is clipped."""
    from repro.figures.figure_data import write_data

    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg, data = out_dir / f"{name}.png", out_dir / f"{name}.svg", out_dir / f"{name}.json"
    existing = getattr(fig, "_repro_caption", None)
    caption(fig, f"{existing}\n{provenance}" if existing else provenance)
    fig.set_dpi(DPI)
    renderer = fig.canvas.get_renderer()
    # the layout passes (tick labels, then the legends moved under them) need the artists' positions, not pixels:
    # draw_without_rendering lays out as a draw does and rasterizes nothing (the files are byte for byte the same;
    # 10 % of drawing every figure, ~2 s of CPU)
    fig.draw_without_rendering()
    _place_legends_below(fig, renderer)
    fig.draw_without_rendering()
    _place_caption(fig, renderer)
    formats = _writing.get()
    if "png" in formats:
        fig.savefig(png, dpi=DPI, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.15)
    if "svg" in formats:
        fig.savefig(svg, metadata={"Date": None, "Creator": None}, bbox_inches="tight", pad_inches=0.15)
    if "json" in formats:
        write_data(fig, data)
    plt.close(fig)
    return [path for path, suffix in ((png, "png"), (svg, "svg"), (data, "json")) if suffix in formats]


def numeric(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce")
