"""Process groups, launch from torchrun or srun, the local launcher, and the collective ledger."""

from repro.dist.comm import CommGroup
from repro.dist.groups import GridCoord, ParallelGroups, RankGrid, init_parallel, resolve_grid
from repro.dist.launch import LaunchEnv, default_backend, device_for, init_distributed, read_launch_env
from repro.dist.ledger import CollectiveLedger
from repro.dist.spawn import SpawnError, spawn

__all__ = [
    "CollectiveLedger", "CommGroup", "GridCoord", "LaunchEnv", "ParallelGroups", "RankGrid", "SpawnError",
    "default_backend", "device_for", "init_distributed", "init_parallel", "read_launch_env", "resolve_grid", "spawn",
]
