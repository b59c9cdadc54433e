"""The committed figures are what the committed rows draw (issue 26): each figure keeps beside its PNG and SVG a
data file (``<name>.json``: every line, point, bar and text it shows, :mod:`repro.figures.figure_data`); redrawing
every figure from the committed rows must give the same data, so a stale figure fails here. Data, not pixels."""

from __future__ import annotations

import json

import pytest

from repro.experiments import registry
from repro.results import REPO_ROOT

FIGURES = REPO_ROOT / "results" / "figures"


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory):
    pytest.importorskip("matplotlib", reason="needs the optional package matplotlib (pip install matplotlib)")
    from repro.harness.reproduce import make_figures

    root = tmp_path_factory.mktemp("figures")
    (root / "runs").symlink_to(REPO_ROOT / "results" / "runs", target_is_directory=True)
    rendered = make_figures(registry(), root, "any")
    assert not rendered.errors, rendered.errors
    return root / "figures"


def test_every_committed_figure_has_svg_data_and_a_provenance_caption():
    pngs = sorted(FIGURES.glob("*.png"))
    assert pngs
    for png in pngs:
        assert png.with_suffix(".svg").exists(), f"{png.name} has no SVG"
        data = png.with_suffix(".json")
        assert data.exists(), f"{png.name} has no data file (redraw with `repro figures`)"
        texts = "\n".join(json.loads(data.read_text())["texts"])
        assert "Provenance" in texts, f"{png.name}: the caption names no provenance"


def test_committed_figures_equal_a_redraw_from_the_committed_rows(redrawn):
    drawn = {path.name for path in redrawn.glob("*.json")}
    committed = {path.name for path in FIGURES.glob("*.json")}
    assert drawn == committed, f"figures drawn {sorted(drawn - committed)}, committed only {sorted(committed - drawn)}"
    stale = [name for name in sorted(drawn)
             if json.loads((redrawn / name).read_text()) != json.loads((FIGURES / name).read_text())]
    assert not stale, f"committed figures differ from their rows (redraw with `repro figures`): {stale}"
