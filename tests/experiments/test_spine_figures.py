"""Figures drawn from synthetic rows: each measured panel finds the rows the conventions describe (read from each
figure's data file, drawn without its pictures: tests/experiments/test_spine_cli.py draws those)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("matplotlib", reason="the figures need matplotlib: pip install matplotlib")
pytest.importorskip("seaborn", reason="the figures need seaborn: pip install seaborn")

from repro.figures import FIGURES, FigureContext, render_all, writing  # noqa: E402
from repro.paper import load_claims  # noqa: E402


def _rows() -> pd.DataFrame:
    rows = []

    def add(experiment, metric, value, unit="-", point="p", **extra):
        rows.append({"experiment": experiment, "scale": "ci", "point": point, "run_id": "r1", "metric": metric,
                     "value": value, "unit": unit, **extra})

    for gpus, eff in ((1, 100.0), (2, 91.0), (4, 80.0)):
        add("megatron_measured", "measured_weak_scaling_efficiency", eff, "%", point=f"g{gpus}", gpus=gpus)
    for stage in ("baseline", "Pos", "Pos+g", "Pos+g+p"):
        for nd in (1, 2, 4):
            add("zero_stages", "bytes_per_param", 16.0 / nd, "bytes/param", stage=stage, nd=nd, psi=1000,
                formula_bytes=16000.0 / nd)
            add("zero_stages", "comm_volume_psi", 2.0 + (stage == "Pos+g+p"), "x psi", stage=stage, nd=nd)
    for bw in (1, 2, 4, 8, 16, 32):
        add("zero_infinity_model", "efficiency", 100 * bw / (bw + 5), "%", data="params", bandwidth_gbs=bw)
    for direction, raw, tier in (("read", 2.0, 1.6), ("write", 1.5, 1.2)):
        add("zero_infinity_offload", "raw_disk_gbs", raw, "GB/s", direction=direction)
        add("zero_infinity_offload", "nvme_tier_gbs", tier, "GB/s", direction=direction)
    for placement, slowdown in (("none", 1.0), ("nvme", 1.8)):
        add("zero_infinity_offload", "slowdown_vs_none", slowdown, "x", placement=placement)
    for point, sim, measured in (("a", 2.0, 1.5), ("b", 3.0, 2.1)):
        add("gna_speedup", "sim_bound_speedup", sim, "x", point=point)
        add("gna_speedup", "measured_speedup", measured, "x", point=point)
    add("eval_wikitext_lambada", "wikitext_ppl", 35.2, "perplexity", point="tiny")
    add("eval_race", "race_accuracy", 27.0, "%", point="tiny")
    return pd.DataFrame(rows)


def _texts(data) -> str:
    """Every string of a figure's data file, each with its line breaks as spaces (a phrase wrapped over two lines
    still reads as one), one per line."""
    if isinstance(data, str):
        return " ".join(data.split())
    values = data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
    return "\n".join(_texts(value) for value in values)


def test_measured_panels_read_rows_by_convention(tmp_path):
    checks = pd.DataFrame({"paper": ["megatron_lm_2019", "zero_2019"], "claim_id": ["fig5_eff_mp_2gpu", "comm_posgp"],
                           "reproduced_value": [94.0, 3.0], "verdict": ["reproduced", "reproduced"],
                           "experiment": ["x", "y"], "scale": ["ci", "ci"]})
    ctx = FigureContext(claims=load_claims(), rows=_rows(), checks=checks, scale="ci", out_dir=tmp_path,
                        known=frozenset({"zero_infinity_model", "gna_speedup"}))
    with writing(("json",)):
        rendered = render_all(ctx)
    assert not rendered.errors, rendered.errors
    assert set(rendered.files) == set(FIGURES)
    shown = {name: _texts(json.loads(files[0].read_text())) for name, files in rendered.files.items()}
    assert "megatron_measured: measured weak scaling efficiency" in shown["megatron_weak_scaling"]
    assert "ledger" in shown["zero_memory_by_stage"] and "ledger: not yet run" not in shown["zero_memory_by_stage"]
    assert "measured: not yet run" not in shown["zero_communication_volume"]
    assert "model: data=params" in shown["zero_infinity_efficiency"]
    assert "NVMe tier" in shown["zero_infinity_efficiency"]
    assert "repro run zero_infinity_offload" not in shown["zero_infinity_efficiency"]
    assert "block-sparse config" in shown["gna_speedup"] or "other config" in shown["gna_speedup"]
    assert "wikitext ppl" in shown["evals"] and "race accuracy" in shown["evals"]
    assert "eval_race (ci scale, 1 rows" in shown["evals"]
    assert "no experiment has run" in shown["parameter_counts"]
