"""Optional packages: imported inside the functions that use them, with one clear error where one is missing.

The core (``repro list``, ``repro run``, training, the parallel layers) needs torch, numpy, pandas and tqdm only.
Everything else is optional and imported where it is used, through :func:`require`:

    datasets = require("datasets", "reading the WikiText-103 test file")

A missing package raises :class:`MissingPackage` (an ``ImportError``, so ``except ImportError`` fallbacks keep
working) whose message is one line naming the package, what needed it and the ``pip install`` that fixes it; the
command-line entry points print that line and exit with status 2. Tests that need one of these packages skip and
name it (:func:`repro.testing.needs`).

A package that is installed but fails to import (a broken install: a dependency missing or of the wrong build, an
error raised while it loads) is not a missing one: :class:`BrokenPackage` (a :class:`MissingPackage`, so the entry
points still print one line and exit 2) names the error and the reinstall that fixes it, and a test that reaches it
fails with that line instead of skipping, so a broken environment cannot pass as a machine without the package.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: import name -> the name ``pip install`` takes, where the two differ.
PIP_NAMES = {
    "lm_eval": "lm-eval",
    "megatron": "megatron-core",
    "pynvml": "nvidia-ml-py",
}


class MissingPackage(ImportError):
    """An optional package is not installed (or cannot be imported); the message says which and how to install it."""


class BrokenPackage(MissingPackage):
    """An optional package is installed but raises when imported; the message names the error and the reinstall."""


def pip_name(module: str) -> str:
    """The ``pip install`` name of the package that provides ``module`` (``lm_eval.api`` -> ``lm-eval``)."""
    top = module.split(".")[0]
    return PIP_NAMES.get(top, top)


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` and return it; raise :class:`MissingPackage` (one line) when it cannot be imported.

    ``purpose`` completes "<purpose> needs the package ...", e.g. ``"reading the LAMBADA test file"``.
    """
    pip = pip_name(module)
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        missing = err.name or ""
        if missing and (module == missing or module.startswith(missing + ".")):
            raise MissingPackage(f"{purpose} needs the package {pip!r}, which is not installed; install it with: "
                                 f"pip install {pip}", name=module) from None
        raise _broken(module, purpose, err) from None  # installed, but one of its own imports failed
    except Exception as err:  # noqa: BLE001 - whatever a broken install raises while it loads
        raise _broken(module, purpose, err) from None
    spec = getattr(imported, "__spec__", None)
    if spec is not None and spec.origin in (None, "namespace"):  # a bare folder of that name, not the package
        folders = ", ".join(getattr(imported, "__path__", []))
        raise MissingPackage(f"{purpose} needs the package {pip!r}, which is not installed (the folder {folders} "
                             f"has its name but no code); install it with: pip install {pip}", name=module)
    return imported


def _broken(module: str, purpose: str, err: BaseException) -> BrokenPackage:
    pip = pip_name(module)
    reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
    return BrokenPackage(f"{purpose} needs the package {pip!r}, which is installed but cannot be imported ({reason}); "
                         f"repair the install, e.g. pip install --force-reinstall {pip}", name=module)


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch: ``2.4.1+cu121`` -> ``(2, 4)``."""
    import torch

    return tuple(int(part) for part in torch.__version__.split(".")[:2])  # type: ignore[return-value]


def require_torch(minimum: tuple[int, int], feature: str) -> None:
    """Raise :class:`MissingPackage` (one line) when this torch is older than ``minimum``: ``feature`` needs it."""
    import torch

    if torch_version() < minimum:
        raise MissingPackage(f"{feature} needs torch >= {minimum[0]}.{minimum[1]}; this torch is "
                             f"{torch.__version__}: upgrade torch, or go without it", name="torch")


def available(module: str) -> bool:
    """Whether ``module`` can be found (without importing it: cheap enough for a test's skip condition). A bare
    directory of that name on the path (a namespace package: no ``__init__``, no code) is not the package: it
    imports, but has none of the package's code."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a missing parent package, or a module with no __spec__
        return False
    return spec is not None and spec.origin not in (None, "namespace")
