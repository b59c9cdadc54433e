"""Names of a package that load on first use (PEP 562): the package's ``__init__`` says where each name lives and
imports none of those modules, so that a piece that needs no torch (a configuration an experiment declares, the
torchrun wrapper) does not import torch through the package.

    __getattr__, __dir__ = lazy_names(__name__, {"ZeroConfig": "repro.zero.config", ...})

A name is imported from its module at its first use and then kept in the package's namespace; a name that is not
listed raises AttributeError, which lets the import system find a submodule of that name
(``from repro.zero import config``)."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_names(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` (its ``__name__``), whose names ``homes`` maps
    to the modules that define them."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
