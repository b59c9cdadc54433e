"""No two modules of repro/ or evals/ depend on each other, directly or around a loop (DESIGN.md: no import cycles).

Every import counts, at module level or inside a function: a lazy import hides a cycle from Python, not from a
reader. A package's ``__init__`` re-exporting its own modules is not a cycle of concepts and is left out."""

from __future__ import annotations

import ast
from pathlib import Path

from repro.results import REPO_ROOT


def _graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for root in ("repro", "evals"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            if parts[-1] != "__init__":
                modules[".".join(parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            edges[name].update(t for t in targets if t in modules and t != name)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other (directly or around a loop):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)
