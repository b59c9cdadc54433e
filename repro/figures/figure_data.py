"""What a figure shows, as data: every plotted line, point, bar and text of a drawn matplotlib figure, written beside
its PNG and SVG as ``<name>.json``.

A test redraws every figure from the committed rows and compares this data with the committed file (data, not
pixels), so a figure that no longer matches its rows fails CI. Numbers are kept to 6 significant digits (what a
reader can see, and stable across platforms); NaN and infinities become null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import Collection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number):
        return None
    return float(f"{number:.6g}")


def _nums(values: Any) -> list:
    array = np.ma.filled(np.ma.asarray(values, dtype=float), np.nan) if np.size(values) else np.array([])
    return [_num(v) for v in np.ravel(array)]


def _texts(artists) -> list[str]:
    """The visible texts (numeric tick labels are left out by the caller: they follow matplotlib's tick choice)."""
    return [t.get_text() for t in artists if t.get_visible() and t.get_text()]


def _axes(ax: Axes) -> dict[str, Any]:
    lines = [{"label": line.get_label(), "x": _nums(line.get_xdata()), "y": _nums(line.get_ydata())}
             for line in ax.get_lines() if line.get_visible()]
    bars = [{"label": p.get_label(), "xywh": [_num(p.get_x()), _num(p.get_y()), _num(p.get_width()),
                                                _num(p.get_height())]}
            for p in ax.patches if isinstance(p, Rectangle) and p.get_visible()]
    points = []
    for collection in ax.collections:
        if not isinstance(collection, Collection) or not collection.get_visible():
            continue
        offsets = collection.get_offsets()
        if len(offsets):
            points.append({"label": collection.get_label(), "xy": [_nums(row) for row in np.asarray(offsets)]})
    legend = ax.get_legend()
    return {
        "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
        "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
        "xticklabels": [t for t in _texts(ax.get_xticklabels()) if any(ch.isalpha() for ch in t)],
        "lines": lines, "bars": bars, "points": points, "texts": _texts(ax.texts),
        "legend": _texts(legend.get_texts()) if legend is not None else [],
    }


def figure_data(fig: Figure) -> dict[str, Any]:
    """Every axes' titles, labels, lines, bars, points, texts and legend, and the figure's own texts (the caption
    and suptitle), in drawing order."""
    suptitle = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"suptitle": suptitle, "texts": _texts(fig.texts), "axes": [_axes(ax) for ax in fig.axes]}


def write_data(fig: Figure, path: Path) -> Path:
    path.write_text(json.dumps(figure_data(fig), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path
