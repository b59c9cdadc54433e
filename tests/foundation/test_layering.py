"""The floors of repro and evals, as data: every import points down (or stays on its floor), except the few arrows
listed below, each with the reason it exists and where it should go. DESIGN.md's rule "no import cycles" says no
two modules lean on each other; this says which way a module may lean at all. A new arrow up fails here: move the
shared piece down instead, or, if it is deliberate, add it to ``UP`` with its reason.

Every import counts, at module level or inside a function (tests/foundation/test_import_cycles.py's graph), and an
import of a package's ``__init__`` (``from repro.models import GPTConfig``) counts as an arrow to that package. So does
an import by name at run time (``importlib.import_module``, ``__import__``, or a function of repro's that imports the
module it is given, :data:`IMPORTERS`): a module that makes one has an arrow to every repro or evals module (or
package) that a string of its names, an f-string's fixed start included (``f"repro.experiments.{name}"``)."""

from __future__ import annotations

import ast

from repro.results import REPO_ROOT
from tests.foundation.test_import_cycles import _graph

#: bottom to top; a unit is a top-level module or package of repro, or evals
FLOORS: tuple[tuple[str, ...], ...] = (
    ("repro.optional", "repro.paths", "repro.machine", "repro.atomic_files", "repro.input_files", "repro.cliargs",
     "repro.timing", "repro.claims_scope", "repro.gpu_plans", "repro.vocabulary", "repro.environment",
     "repro.checkout", "repro.provenance", "repro.lazy"),  # the ground: imports nothing above it
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
    ("repro.figures",),                                                           # figures of rows and checks
    ("repro.experiments",),                                                       # the experiments (own figures)
    ("repro.harness",),                                                           # what runs the experiments
    ("repro.cli", "repro.commands", "repro.subcommands", "repro.gpu_session", "repro.gpu_probe", "repro.__main__",
     "repro.testing", "repro.about"),  # entry
)

#: arrows that point up, module to module, each with its reason (a debt, not a design)
UP: dict[tuple[str, str], str] = {
    ("repro.cliargs", "repro.commands"): "the installed `repro` script (pyproject's repro.cliargs:repro_command) "
                                         "loads the CLI's front by name at run time; its home is repro.__main__, a "
                                         "move that needs every installed copy reinstalled (the script's target "
                                         "changes)",
}


#: functions that import a module given by name: a call of one is an import at run time (``run_entry_point`` loads
#: an entry point's module only when it runs, so that a Ctrl-C during the load is one line)
IMPORTERS = ("import_module", "__import__", "run_entry_point")


def _imports_by_name(tree: ast.AST) -> bool:
    """Whether the module calls one of :data:`IMPORTERS`."""
    return any(isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
               in IMPORTERS for node in ast.walk(tree))


def _named_modules(tree: ast.AST, known: set[str]) -> set[str]:
    """The repro and evals modules and packages the strings of ``tree`` name: a whole string (``"repro.cli"``), or
    the fixed start of an f-string up to its last dot (``f"repro.experiments.{name}"`` names the package)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            names.add(str(node.values[0].value).rstrip("."))
    return names & known


def _graph_with_packages() -> dict[str, set[str]]:
    """The module graph, plus arrows from a module to each package whose ``__init__`` it imports from, and to each
    module or package it names where it imports by name at run time (:func:`_named_modules`)."""
    graph = _graph()
    packages = {".".join(p.relative_to(REPO_ROOT).parent.parts) for root in ("repro", "evals")
                for p in (REPO_ROOT / root).rglob("__init__.py")} - {"repro"}
    for name in graph:
        path = REPO_ROOT.joinpath(*name.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in packages:
                graph[name].add(node.module)
        if _imports_by_name(tree):
            graph[name] |= _named_modules(tree, (set(graph) | packages) - {name})
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


def test_an_import_by_name_is_an_arrow():
    """The run-time imports the graph sees: a whole name, an f-string's fixed start, a repro importer's argument; a
    string in a module that imports nothing by name is only text."""
    known = {"repro.cli", "repro.experiments", "repro.experiments.megatron_weak_scaling", "repro.figures"}
    cases = {
        'import importlib\nimportlib.import_module("repro.experiments.megatron_weak_scaling")':
            {"repro.experiments.megatron_weak_scaling"},
        'from importlib import import_module\nimport_module(f"repro.experiments.{name}").rows': {"repro.experiments"},
        'm = __import__("repro.cli")': {"repro.cli"},
        'run_entry_point("repro.cli", "repro")': {"repro.cli"},
        'HELP = "see repro.cli"\nX = "repro.figures"': set(),
    }
    for source, expected in cases.items():
        tree = ast.parse(source)
        assert (_named_modules(tree, known) if _imports_by_name(tree) else set()) == expected, source
