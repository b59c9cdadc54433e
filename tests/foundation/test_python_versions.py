"""Issue 25: the suite runs under Python 3.10 to 3.12 (pyproject: requires-python >= 3.10).

Three checks on every .py file of repro/, evals/, tests/, bench/ and scripts/: it parses with the 3.10 grammar
(``ast.parse(feature_version=(3, 10))`` rejects e.g. ``except*`` and PEP 695 type parameters); it uses none of the
standard-library names added in 3.11 or 3.12 (a list of the likely ones: ``tomllib``, ``typing.Self``,
``datetime.UTC``, ``enum.StrEnum``, ...); and, where a Python 3.10 or 3.12 interpreter is installed, it compiles
there and every name it imports from the standard library exists there.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repro.results import REPO_ROOT

FOLDERS = ("repro", "evals", "tests", "bench", "scripts")

#: standard-library names new in Python 3.11 or 3.12 (module -> names); a whole new module maps to None
NEWER_STDLIB: dict[str, frozenset[str] | None] = {
    "tomllib": None,
    "wsgiref.types": None,
    "typing": frozenset({"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type",
                         "TypeVarTuple", "Unpack", "Required", "NotRequired", "dataclass_transform", "override",
                         "get_overloads", "clear_overloads", "TypeAliasType", "ReadOnly"}),
    "datetime": frozenset({"UTC"}),
    "enum": frozenset({"StrEnum", "ReprEnum", "EnumCheck", "FlagBoundary", "verify", "member", "nonmember",
                       "global_enum", "show_flag_values", "CONTINUOUS", "NAMED_FLAGS", "UNIQUE"}),
    "asyncio": frozenset({"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier", "Timeout"}),
    "hashlib": frozenset({"file_digest"}),
    "contextlib": frozenset({"chdir"}),
    "itertools": frozenset({"batched"}),
    "operator": frozenset({"call"}),
    "math": frozenset({"cbrt", "exp2", "sumprod"}),
    "sys": frozenset({"exception", "monitoring", "activate_stack_trampoline", "getunicodeinternedsize"}),
    "logging": frozenset({"getLevelNamesMapping", "getHandlerByName", "getHandlerNames"}),
    "inspect": frozenset({"markcoroutinefunction", "getasyncgenstate", "getasyncgenlocals"}),
    "os.path": frozenset({"splitroot"}),
    "re": frozenset({"NOFLAG"}),
}
NEWER_BUILTINS = frozenset({"ExceptionGroup", "BaseExceptionGroup"})


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO_ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _newer_names(tree: ast.AST) -> list[str]:
    """``module.name`` for each use in ``tree`` of a standard-library name from :data:`NEWER_STDLIB`."""
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> the module it stands for (``import os.path as p``: p -> os.path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if NEWER_STDLIB.get(alias.name, frozenset()) is None:
                    found.append(alias.name)
                local = alias.asname or alias.name.split(".")[0]
                modules[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            newer = NEWER_STDLIB.get(node.module, frozenset())
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if newer is None or alias.name in newer or NEWER_STDLIB.get(dotted, frozenset()) is None:
                    found.append(dotted)
                elif dotted in NEWER_STDLIB:  # from os import path
                    modules[alias.asname or alias.name] = dotted
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            found.append(node.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_note":
            found.append("BaseException.add_note")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base, dotted = node.value, None
        if isinstance(base, ast.Name):
            dotted = modules.get(base.id)
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in modules:
            dotted = f"{modules[base.value.id]}.{base.attr}"  # os.path.splitroot
        newer = NEWER_STDLIB.get(dotted or "", frozenset())
        if newer and node.attr in newer:
            found.append(f"{dotted}.{node.attr}")
    return found


def test_every_file_parses_with_the_python_3_10_grammar():
    bad = []
    for path in _sources():
        try:
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 10))
        except SyntaxError as err:
            bad.append(f"{path.relative_to(REPO_ROOT)}:{err.lineno}: {err.msg}")
    assert not bad, "\n".join(bad)


def test_no_standard_library_names_newer_than_python_3_10():
    bad = []
    for path in _sources():
        for name in _newer_names(ast.parse(path.read_text(encoding="utf-8"))):
            bad.append(f"{path.relative_to(REPO_ROOT)}: {name}")
    assert not bad, "\n".join(bad)


def test_the_checker_finds_what_it_looks_for():
    source = """
import tomllib
import datetime as dt
import typing
from typing import Self
from enum import StrEnum
from contextlib import chdir
when = dt.UTC
t = typing.override
try:
    pass
except ExceptionGroup:
    pass
err.add_note("x")
import os
os.path.splitroot("/a")
"""
    assert sorted(_newer_names(ast.parse(source))) == sorted([
        "tomllib", "typing.Self", "enum.StrEnum", "contextlib.chdir", "datetime.UTC", "typing.override",
        "ExceptionGroup", "BaseException.add_note", "os.path.splitroot"])
    assert _newer_names(ast.parse("import datetime\nfrom typing import Any\nx = datetime.timezone.utc\n")) == []
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))


#: run by another interpreter: compile each file, and check every name imported from its standard library exists
OTHER_PYTHON = r'''
import ast, importlib, json, sys
bad = []
given = json.load(sys.stdin)
stdlib = set(sys.stdlib_module_names) | set(given["stdlib"])  # the test's own: names newer than this Python
for path in given["files"]:
    source = open(path, encoding="utf-8").read()
    try:
        tree = compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        compile(tree, path, "exec", dont_inherit=True)
    except SyntaxError as err:
        bad.append(f"{path}:{err.lineno}: {err.msg}")
        continue
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] not in stdlib or node.module == "__future__":
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError as err:
                bad.append(f"{path}: import {node.module}: {err}")
                continue
            for alias in node.names:
                if alias.name != "*" and not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        bad.append(f"{path}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in stdlib:
                    try:
                        importlib.import_module(alias.name)
                    except ImportError as err:
                        bad.append(f"{path}: import {alias.name}: {err}")
print(json.dumps(bad))
'''


def _interpreter(minor: int) -> str | None:
    """A working ``python3.<minor>`` (on PATH, or one pyenv installed), or None."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python3.{minor}"),
                  *sorted(glob.glob(os.path.join(pyenv, "versions", f"3.{minor}.*", "bin", f"python3.{minor}")))]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == f"(3, {minor})":
            return candidate
    return None


@pytest.mark.parametrize("minor", [10, 12])
def test_compiles_and_finds_its_standard_library_names_on_other_pythons(minor):
    python = _interpreter(minor)
    if python is None:
        pytest.skip(f"no Python 3.{minor} interpreter here (python3.{minor} not on PATH, none under pyenv)")
    given = {"files": [str(p) for p in _sources()], "stdlib": sorted(sys.stdlib_module_names)}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}  # its own stdlib only
    done = subprocess.run([python, "-B", "-c", OTHER_PYTHON], input=json.dumps(given), capture_output=True,
                          text=True, timeout=300, cwd=REPO_ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    bad = json.loads(done.stdout.splitlines()[-1])
    assert not bad, f"Python 3.{minor}:\n" + "\n".join(bad)
