"""The committed figures are what the committed rows draw (issue 26): each figure keeps beside its PNG and SVG a
data file (``<name>.json``: every line, point, bar and text it shows, :mod:`repro.figures.figure_data`); redrawing
every figure from the committed rows must give the same data, so a stale figure fails here. Data, not pixels.

The redraw is what ``repro reproduce`` does after its runs (``make_claims``, then ``make_figures`` on the same
checks): one redraw, read by both tests that need it (the claims overview against claims.md, moved here from
test_evidence.py, which drew the overview from the same rows a second time). The redraw writes only the data files
(``make_figures(formats=("json",))``, laid out as for the pictures): the pictures are half its time, and
test_spine_figures.py and test_spine_cli.py draw them."""

from __future__ import annotations

import json
import re

import pytest

from repro.claims_render import COLUMNS
from repro.experiments import registry
from repro.results import REPO_ROOT

FIGURES = REPO_ROOT / "results" / "figures"


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory):
    """A results folder holding the committed runs, then the report and every figure's data drawn from them."""
    pytest.importorskip("matplotlib", reason="needs the optional package matplotlib (pip install matplotlib)")
    from repro.harness.reproduce import make_claims, make_figures

    root = tmp_path_factory.mktemp("figures")
    (root / "runs").symlink_to(REPO_ROOT / "results" / "runs", target_is_directory=True)
    out = make_claims(registry(), root, "any")
    rendered = make_figures(registry(), root, "any", checks=out.checks, formats=("json",))
    assert not rendered.errors, rendered.errors
    assert not list((root / "figures").glob("*.png")) and not list((root / "figures").glob("*.svg"))
    return root


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
    redrawn = redrawn / "figures"
    drawn = {path.name for path in redrawn.glob("*.json")}
    committed = {path.name for path in FIGURES.glob("*.json")}
    assert drawn == committed, f"figures drawn {sorted(drawn - committed)}, committed only {sorted(committed - drawn)}"
    stale = [name for name in sorted(drawn)
             if json.loads((redrawn / name).read_text()) != json.loads((FIGURES / name).read_text())]
    assert not stale, f"committed figures differ from their rows (redraw with `repro figures`): {stale}"


def _summary_of_markdown(text: str) -> dict[str, list[int]]:
    """paper -> verdict counts of claims.md's table by paper (columns in VERDICTS order, then total)."""
    table = text.split("### By paper", 1)[1].split("##", 1)[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(COLUMNS) + 2 and cells[1].isdigit():
            out[cells[0]] = [int(c) for c in cells[1:]]
    return out


def test_claims_overview_counts_are_claims_md_counts(redrawn):
    """The overview figure is drawn from the table claims.md is written from: its panel titles carry claims.md's
    verdict counts, paper by paper (read from the figure's data file, which keeps every title)."""
    from repro.paper import PAPER_TITLES

    titles = [ax["title"] for ax in json.loads((redrawn / "figures" / "claims_overview.json").read_text())["axes"]]
    md = _summary_of_markdown((redrawn / "claims.md").read_text())
    verdicts = "|".join(COLUMNS)
    for paper in PAPER_TITLES:
        (title,) = [t for t in titles if t.startswith(PAPER_TITLES[paper] + "\n")]
        title = " ".join(title.split("\n")[1:])
        total = int(re.search(r"(\d+) claims:", title).group(1))
        counts = {v: int(n) for n, v in re.findall(rf"(\d+) ({verdicts})\b", title)}
        drawn = int(re.search(r"; (\d+) drawn$", title).group(1))
        assert md[paper] == [counts.get(v, 0) for v in COLUMNS] + [total], paper
        assert 0 <= drawn <= total


def test_only_known_figure_formats_are_written():
    from repro.figures import FORMATS, writing

    assert FORMATS == ("png", "svg", "json")
    for bad in (("pdf",), ()):
        with pytest.raises(ValueError, match="each must be one of png, svg, json"):
            with writing(bad):
                pass
