"""The experiment registry: every module under ``repro.experiments`` that exposes ``EXPERIMENT`` (one
:class:`~repro.experiments.base.Experiment`) or ``EXPERIMENTS`` (a tuple of them) is registered.

Discovery walks the package, so adding a paper figure or table is adding one module; there is no hand-kept list
and nothing to skip: the package holds experiments (and their helpers, which declare none); the machinery that runs
them is :mod:`repro.harness`. An experiment lives in the module of its name (``repro.experiments.NAME``), so
:func:`get_experiment` imports only that module, not every experiment, to run one.
A module that fails to import, or declares an invalid experiment, does not take the others down: it is listed in
:attr:`Registry.errors` (``repro list`` prints them) and its experiments are left out.

``REPRO_EXTRA_EXPERIMENTS`` (comma-separated module names or ``.py`` paths) adds modules from outside the package;
tests use it to run their own tiny experiments through the CLI, spawned ranks and Slurm jobs.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Iterable, Iterator, Mapping

from repro.experiments.base import CPU_SCALES, EXTRA_MODULE_PREFIX, SCALES, Experiment, Point, RunContext
from repro.vocabulary import ClaimCheck, Row

__all__ = [
    "SCALES", "ClaimCheck", "Experiment", "Point", "Registry", "Row", "RunContext",
    "discover", "get_experiment", "registry", "validate_experiment",
]

EXTRA_ENV = "REPRO_EXTRA_EXPERIMENTS"
PACKAGE = "repro.experiments"


@dataclass
class Registry:
    """Experiments by name, plus the modules that could not be loaded (module -> error text)."""

    experiments: dict[str, Experiment] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)  # experiment name -> module that declares it

    def __contains__(self, name: object) -> bool:
        return name in self.experiments

    def __iter__(self) -> Iterator[Experiment]:
        return iter(self.experiments[name] for name in sorted(self.experiments))

    def __len__(self) -> int:
        return len(self.experiments)

    def names(self) -> list[str]:
        return sorted(self.experiments)

    def get(self, name: str) -> Experiment:
        """The experiment called ``name``; ValueError naming the known ones (and a near miss) otherwise."""
        if name in self.experiments:
            return self.experiments[name]
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        broken = [m for m in self.errors if m.rsplit(".", 1)[-1] == name]
        if broken:
            hint += f"; module {broken[0]} failed to load: {self.errors[broken[0]].strip().splitlines()[-1]}"
        raise ValueError(
            f"unknown experiment {name!r}{hint}; known experiments: {', '.join(self.names()) or 'none'} "
            "(see `repro list`)"
        )

    def add(self, experiment: Experiment, module: str) -> None:
        if experiment.name in self.experiments:
            raise ValueError(
                f"experiment name {experiment.name!r} is declared twice: in {self.modules[experiment.name]} "
                f"and in {module}; names must be unique"
            )
        self.experiments[experiment.name] = experiment
        self.modules[experiment.name] = module


def validate_experiment(experiment: object) -> list[str]:
    """Problems with a declared experiment (empty when it is valid). The rules the spine relies on:
    an :class:`Experiment`; a ``paper`` scale and a CPU-sized ``ci`` or ``smoke`` scale; at least one point per scale; unique point names per
    scale; positive world sizes and memory; JSON-serialisable point params; a callable ``run_point``."""
    if not isinstance(experiment, Experiment):
        return [f"{experiment!r} is a {type(experiment).__name__}, not an Experiment"]
    problems = []
    name = experiment.name
    if not name or not name.replace("_", "").isalnum():
        problems.append(f"name {name!r} must be a non-empty identifier (letters, digits, underscores)")
    if "paper" not in experiment.points:
        problems.append(f"{name}: scale 'paper' is missing; every experiment declares it")
    if not any(scale in experiment.points for scale in CPU_SCALES):
        problems.append(f"{name}: declares none of {list(CPU_SCALES)}; every experiment has a CPU-sized scale")
    unknown = [scale for scale in experiment.points if scale not in SCALES]
    if unknown:
        problems.append(f"{name}: scales {unknown} are not among {list(SCALES)}")
    if not callable(experiment.run_point):
        problems.append(f"{name}: run_point is not callable")
    for claim, scale in dict(experiment.decided_at).items():
        if scale not in experiment.points:
            problems.append(f"{name}: claim {claim!r} is decided at scale {scale!r}, which it does not declare")
    for scale, points in experiment.points.items():
        if len(points) == 0:
            problems.append(f"{name}: scale {scale!r} has no points")
        seen: set[str] = set()
        for point in points:
            if not isinstance(point, Point):
                problems.append(f"{name}/{scale}: {point!r} is not a Point")
                continue
            if point.name in seen:
                problems.append(f"{name}/{scale}: point name {point.name!r} is used twice")
            seen.add(point.name)
            if not point.name or any(ch.isspace() for ch in point.name):
                problems.append(f"{name}/{scale}: point name {point.name!r} must be non-empty, without spaces")
            if not isinstance(point.world_size, int) or point.world_size < 1:
                problems.append(f"{name}/{scale}/{point.name}: world_size={point.world_size!r} must be >= 1")
            if not point.memory_gib > 0:
                problems.append(f"{name}/{scale}/{point.name}: memory_gib={point.memory_gib!r} must be > 0")
            try:
                json.dumps(dict(point.params))
            except (TypeError, ValueError) as err:
                problems.append(f"{name}/{scale}/{point.name}: params are not JSON-serialisable ({err})")
    for scale, budget in experiment.budget_s.items():
        if not budget > 0:
            problems.append(f"{name}: budget_s[{scale!r}]={budget!r} must be > 0 seconds")
    return problems


def declared_experiments(module: ModuleType) -> list[Experiment]:
    found: list = []
    if hasattr(module, "EXPERIMENT"):
        found.append(module.EXPERIMENT)
    if hasattr(module, "EXPERIMENTS"):
        found.extend(module.EXPERIMENTS)
    return found


def load_extra_experiments(spec: str) -> ModuleType:
    """Import ``spec``: a dotted module name or a path to a ``.py`` file."""
    if spec.endswith(".py"):
        path = Path(spec).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{EXTRA_ENV} names {spec!r}, which is not a file")
        mod_name = f"{EXTRA_MODULE_PREFIX}{path.stem}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def _module_names(package: str) -> Iterable[str]:
    pkg = importlib.import_module(package)
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
        yield info.name


def discover(package: str = PACKAGE, extra: Iterable[str] | None = None) -> Registry:
    """Walk ``package`` (and the ``extra`` modules, default ``$REPRO_EXTRA_EXPERIMENTS``) for experiments."""
    if extra is None:
        extra = [s.strip() for s in os.environ.get(EXTRA_ENV, "").split(",") if s.strip()]
    reg = Registry()
    sources: list[tuple[str, bool]] = [(name, False) for name in _module_names(package)]
    sources += [(spec, True) for spec in extra]
    for source, is_extra in sources:
        try:
            module = load_extra_experiments(source) if is_extra else importlib.import_module(source)
            declared = declared_experiments(module)
        except Exception:  # noqa: BLE001 - one broken module must not hide the others
            reg.errors[source] = traceback.format_exc()
            continue
        for experiment in declared:
            problems = validate_experiment(experiment)
            home = f"{package}.{getattr(experiment, 'name', '')}"
            if not is_extra and source != home and not problems:
                problems = [f"experiment {experiment.name!r} is declared in {source}; it must live in {home}, "
                            "where get_experiment looks for it"]
            if problems:
                reg.errors[source] = "invalid experiment: " + "; ".join(problems)
                continue
            try:
                reg.add(experiment, source)
            except ValueError as err:
                reg.errors[source] = str(err)
    return reg


_CACHE: dict[tuple[str, ...], Registry] = {}


def registry(*, refresh: bool = False) -> Registry:
    """The registry of the shipped experiments plus ``$REPRO_EXTRA_EXPERIMENTS`` (cached per value of it)."""
    key = (os.environ.get(EXTRA_ENV, ""),)
    if refresh or key not in _CACHE:
        _CACHE[key] = discover()
    return _CACHE[key]


def _from_its_module(name: str) -> Experiment | None:
    """The experiment ``name`` from ``repro.experiments.NAME`` alone, or None when that module does not declare a
    valid one (the caller then asks the whole registry, which explains what is wrong)."""
    if not name.isidentifier() or os.environ.get(EXTRA_ENV, "").strip():
        return None  # the extra modules may declare any name (and must be checked for clashes): the registry
    try:
        if importlib.util.find_spec(f"{PACKAGE}.{name}") is None:
            return None
        module = importlib.import_module(f"{PACKAGE}.{name}")
    except Exception:  # noqa: BLE001 - the registry reports the failure in full
        return None
    found = [e for e in declared_experiments(module) if getattr(e, "name", None) == name]
    return found[0] if len(found) == 1 and not validate_experiment(found[0]) else None


def get_experiment(name: str, reg: Registry | Mapping[str, Experiment] | None = None) -> Experiment:
    """Look up an experiment by name in ``reg`` (default: its own module, ``repro.experiments.NAME``, imported
    alone; else :func:`registry`, which says what is known when ``name`` is not)."""
    if reg is None:
        found = _from_its_module(name)
        if found is not None:
            return found
        reg = registry()
    if isinstance(reg, Registry):
        return reg.get(name)
    if name not in reg:
        raise ValueError(f"unknown experiment {name!r}; known experiments: {', '.join(sorted(reg)) or 'none'}")
    return reg[name]
