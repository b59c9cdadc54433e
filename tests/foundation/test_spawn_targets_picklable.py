"""Every spawn target is a module-level function (issue 25): on a GPU build of torch, ranks start from a forkserver
(repro.dist.spawn.choose_start_method), which pickles the target; a closure or a lambda cannot be pickled."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _local_bindings(scope: ast.AST) -> dict[str, list[ast.expr] | None]:
    """What each name in ``scope`` (a function's own body, not nested ones) is assigned: the values of plain
    ``name = value`` statements, or None where the name is also bound some other way (a parameter, a loop)."""
    bound: dict[str, list[ast.expr] | None] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for arg in ast.walk(scope.args):
            if isinstance(arg, ast.arg):
                bound[arg.arg] = None
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if not isinstance(node, ast.Lambda):
                bound[node.name] = None  # a nested function or class: not module level
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name not in bound or bound[name] is not None:
                bound[name] = (bound.get(name) or []) + [node.value]
            stack.append(node.value)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound[node.id] = None
        stack.extend(ast.iter_child_nodes(node))
    return bound


def _module_level(node: ast.expr, top: set[str], local: dict[str, list[ast.expr] | None]) -> bool:
    """Whether ``node`` is a module-level function: its name; a local variable only ever assigned such names
    (``fn = a if x else b``); or ``functools.partial`` of one."""
    if isinstance(node, ast.Name):
        if node.id in local:
            values = local[node.id]
            return values is not None and all(_module_level(v, top, {}) for v in values)
        return node.id in top
    if isinstance(node, ast.IfExp):
        return _module_level(node.body, top, local) and _module_level(node.orelse, top, local)
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return name == "partial" and _module_level(node.args[0], top, local)
    return False


def _spawn_targets(path: Path) -> list[str]:
    """``file:line: target`` for every ``spawn(target, ...)`` whose target is not a module-level function."""
    text = path.read_text()
    if "spawn" not in text:  # no call named spawn without the word: skip parsing most files
        return []
    tree = ast.parse(text, filename=str(path))
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    bad = []

    def visit(node: ast.AST, scope: ast.AST | None) -> None:
        """Check each ``spawn(...)`` call against its innermost enclosing function (None: the module)."""
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name == "spawn":  # a function's bindings are read only where it spawns: one pass over the tree
                local = _local_bindings(scope) if scope is not None else {}
                if not _module_level(node.args[0], top | imported, local):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node.args[0])[:60]}")
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, None)
    return bad


def test_every_spawn_target_is_a_module_level_function():
    """A closure or lambda cannot be pickled to a rank started by forkserver or spawn (a GPU build of torch)."""
    bad = [hit for folder in ("repro", "evals", "tests", "bench") for path in sorted((REPO / folder).rglob("*.py"))
           for hit in _spawn_targets(path)]
    assert not bad, "spawn targets that are not module-level functions:\n" + "\n".join(bad)


def test_every_registered_experiment_pickles():
    """The local runner passes the Experiment to its ranks (repro.harness.runner.execute_point): a lambda in
    one (e.g. ``claims=lambda rows: []``) fails under forkserver with "Can't pickle <function <lambda>"."""
    import pickle

    from repro.experiments import registry

    bad = []
    for name, experiment in registry().experiments.items():
        try:
            pickle.dumps(experiment)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            bad.append(f"{name}: {err}")
    assert not bad, "experiments that cannot be pickled to a rank:\n" + "\n".join(bad)
