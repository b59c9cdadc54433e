"""``repro figures``: paper vs reproduced, one function per figure, PNG and SVG under ``results/figures/``.

Each figure function takes a :class:`FigureContext` (paper claims, newest result rows, the experiments' claim
checks) and returns the files it wrote. Figures whose experiments have not run still draw the paper's values
and mark the reproduction "not yet run".

What the figures read. The paper side and the "reproduced" side of every paper-vs-reproduced comparison come
from claim ids: an experiment's ``claims()`` returning a :class:`ClaimCheck` with a numeric ``reproduced_value``
for e.g. ``fig5_eff_mp_8gpu`` or ``t1_7.5B_Posg_nd64`` is all a figure needs. Measurements made on this machine
(which have no paper counterpart) are read from rows by experiment and metric:

* weak scaling: experiments named ``megatron*``, metric containing ``measured`` and ``efficiency``, x from a
  ``gpus`` / ``world_size`` / ``tp_size`` column;
* ZeRO memory and communication: experiments named ``zero*`` (not ``zero_infinity*``) with a ``stage`` (0-3 or
  ``baseline``/``Pos``/``Pos+g``/``Pos+g+p``) and an ``nd`` / ``dp_size`` / ``world_size`` column; memory: metric
  ``bytes_per_param`` or starting with ``measured`` (formula lines from ``formula_bytes`` / ``psi`` columns of the
  same rows, or metrics starting with ``formula_bytes``/``expected_bytes``); communication: metrics containing
  ``comm``, ``volume``, ``bytes_sent`` or ``traffic``;
* ZeRO-Infinity: ``zero_infinity_model`` rows with metric containing ``efficiency`` and a ``bandwidth*`` column
  (five or more bandwidths per group draw a curve);
* GNA: ``gna_speedup`` rows per point, ``paired_speedup`` (or ``speedup``, or a metric with ``measured``) against
  ``bound`` (or a metric with ``sim``/``bound``), block-sparse points (``block_sparse`` column) marked;
* evals: ``eval_wikitext_lambada`` and ``eval_race`` rows whose metric contains ``ppl``, ``perplexity``, ``acc``
  or ``accuracy``;
* GPU runs (:mod:`repro.figures.gpu`): ``megatron_weak_scaling_gpu``'s 1-GPU ``share_of_peak`` and ``tokens_per_s``
  per variant, and ``gna_speedup_gpu``'s ``speedup``, ``op_speedup`` and ``bound`` per point, each naming its GPU.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from repro.optional import require

for _package in ("matplotlib", "seaborn"):  # one clear line here, before the figure modules import them
    require(_package, "drawing figures")

from repro.figures.common import FORMATS, FigureContext, style, writing  # noqa: E402
from repro.figures.claims_overview import claims_overview  # noqa: E402
from repro.figures.evals_overview import evals, mtnlg_throughput  # noqa: E402
from repro.figures.gpu import gna_gpu, megatron_1gpu  # noqa: E402
from repro.figures.infinity_gna import gna_speedup, infinity_efficiency  # noqa: E402
from repro.figures.megatron import parameter_counts, weak_scaling  # noqa: E402
from repro.figures.zero import communication_volume, memory_by_stage  # noqa: E402

#: name -> function; the name is also the file stem.
FIGURES: dict[str, Callable[[FigureContext], list[Path]]] = {
    "megatron_weak_scaling": weak_scaling,
    "megatron_1gpu_baseline": megatron_1gpu,
    "parameter_counts": parameter_counts,
    "zero_memory_by_stage": memory_by_stage,
    "zero_communication_volume": communication_volume,
    "zero_infinity_efficiency": infinity_efficiency,
    "gna_speedup": gna_speedup,
    "gna_speedup_gpu": gna_gpu,
    "evals": evals,
    "mtnlg_throughput": mtnlg_throughput,
    "claims_overview": claims_overview,
}

__all__ = ["FIGURES", "FORMATS", "FigureContext", "Rendered", "render_all", "writing"]


@dataclass
class Rendered:
    files: dict[str, list[Path]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def render_all(ctx: FigureContext, names: list[str] | None = None) -> Rendered:
    """Draw the chosen figures (all by default); one failing figure is reported, the others still drawn."""
    style()
    unknown = [n for n in (names or []) if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; known: {', '.join(FIGURES)}")
    out = Rendered()
    for name in names or list(FIGURES):
        ctx.touched = set()  # the provenance line names what this figure reads
        try:
            out.files[name] = FIGURES[name](ctx)
        except Exception:  # noqa: BLE001 - keep drawing the others, report this one
            out.errors[name] = traceback.format_exc()
    return out
