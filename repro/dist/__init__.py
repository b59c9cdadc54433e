"""Process groups, launch from torchrun or srun, the local launcher, and the collective ledger.

The names whose modules import torch come at their first use (PEP 562), so that ``python -m repro.dist.torchrun``,
which runs this file first, starts without importing torch (~2.5 s of CPU per job, per Slurm task); its agent and
ranks import torch themselves. ``spawn`` is bound here at once: the import system sets a package's attribute to each
submodule it loads, so a lazily bound ``spawn`` would be the module ``repro.dist.spawn`` once anything had imported
that module (:mod:`repro.dist.spawn` imports torch only when it starts ranks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.dist.spawn import SpawnError, spawn
from repro.lazy import lazy_names

#: name -> the module that defines it, imported at the name's first use
LAZY = {
    "CommGroup": "repro.dist.comm", "CollectiveLedger": "repro.dist.ledger",
    **{name: "repro.dist.groups" for name in ("GridCoord", "ParallelGroups", "RankGrid", "init_parallel",
                                              "resolve_grid")},
    **{name: "repro.dist.launch" for name in ("LaunchEnv", "default_backend", "device_for", "init_distributed",
                                              "read_launch_env")},
}

__all__ = sorted({*LAZY, "SpawnError", "spawn"})

if TYPE_CHECKING:
    from repro.dist.comm import CommGroup
    from repro.dist.groups import GridCoord, ParallelGroups, RankGrid, init_parallel, resolve_grid
    from repro.dist.launch import LaunchEnv, default_backend, device_for, init_distributed, read_launch_env
    from repro.dist.ledger import CollectiveLedger


__getattr__, __dir__ = lazy_names(__name__, LAZY)
