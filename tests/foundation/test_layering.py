"""The floors of repro and evals, as data: every import points down (or stays on its floor), except the few arrows
listed below, each with the reason it exists and where it should go. DESIGN.md's rule "no import cycles" says no
two modules lean on each other; this says which way a module may lean at all. A new arrow up fails here: move the
shared piece down instead, or, if it is deliberate, add it to ``UP`` with its reason.

Every import counts, at module level or inside a function (tests/foundation/test_import_cycles.py's graph), and an
import of a package's ``__init__`` (``from repro.models import GPTConfig``) counts as an arrow to that package."""

from __future__ import annotations

import ast

from repro.results import REPO_ROOT
from tests.foundation.test_import_cycles import _graph

#: bottom to top; a unit is a top-level module or package of repro, or evals
FLOORS: tuple[tuple[str, ...], ...] = (
    ("repro.optional", "repro.paths", "repro.machine", "repro.atomic_files", "repro.input_files", "repro.cliargs",
     "repro.timing", "repro.claims_scope", "repro.gpu_plans", "repro.vocabulary", "repro.environment",
     "repro.checkout"),  # the ground: no repro imports
    ("repro.dist", "repro.text"),                                                 # collectives; data and tokenizers
    ("repro.tensor_parallel",),                                                   # Megatron's layers and mappings
    ("repro.zero",),                                                              # ZeRO, for any nn.Module
    ("repro.models",),                                                            # GPT and BERT
    ("repro.perfmodel", "repro.pipeline", "repro.gna", "repro.overlap"),          # models of cost, the systems
    ("repro.results", "repro.paper", "repro.assets"),                             # rows on disk, paper values
    ("repro.training",),                                                          # the trainer
    ("evals",),                                                                   # the evaluation harnesses
    ("repro.verdicts",),                                                          # one claim decided
    ("repro.claims", "repro.claims_render", "repro.cross_hardware"),              # the claims report
    ("repro.experiments", "repro.figures"),                                       # experiments and figures
    ("repro.harness",),                                                           # what runs the experiments
    ("repro.cli", "repro.gpu_session", "repro.gpu_probe", "repro.__main__", "repro.testing", "repro.about"),  # entry
)

#: arrows that point up, module to module, each with its reason (a debt, not a design): none today
UP: dict[tuple[str, str], str] = {}


def _graph_with_packages() -> dict[str, set[str]]:
    """The module graph, plus arrows from a module to each package whose ``__init__`` it imports from."""
    graph = _graph()
    packages = {".".join(p.relative_to(REPO_ROOT).parent.parts) for root in ("repro", "evals")
                for p in (REPO_ROOT / root).rglob("__init__.py")} - {"repro"}
    for name in graph:
        path = REPO_ROOT.joinpath(*name.split(".")).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in packages:
                graph[name].add(node.module)
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return "evals" if parts[0] == "evals" else f"repro.{parts[1]}"


def test_every_import_points_down_or_is_listed():
    floor = {unit: level for level, units in enumerate(FLOORS) for unit in units}
    graph = _graph_with_packages()
    unplaced = sorted({_unit(m) for m in graph} - set(floor))
    assert not unplaced, f"modules on no floor (add them to FLOORS): {unplaced}"
    up = {(a, b) for a, targets in graph.items() for b in targets if floor[_unit(b)] > floor[_unit(a)]}
    new = sorted(up - set(UP))
    assert not new, "imports that point up a floor:\n" + "\n".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(set(UP) - up)
    assert not gone, "listed arrows that no longer exist (remove them from UP):\n" + "\n".join(
        f"{a} -> {b}" for a, b in gone)
