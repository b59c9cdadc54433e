"""No module imports another module's private names (a leading underscore): what another module needs is public
in its home, and a split of one concept into two files is not a licence to reach into each other's insides."""

from __future__ import annotations

import ast

from repro.results import REPO_ROOT


def test_no_module_imports_another_modules_private_names():
    found = []
    for top in ("repro", "evals"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("repro", "evals"):
                    found += [f"{path.relative_to(REPO_ROOT)}: from {node.module} import {alias.name}"
                              for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)
