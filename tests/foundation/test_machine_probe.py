"""One machine probe (repro/machine.py) for every command that sizes work against the machine: a container's
memory limit counts, not only the host's free memory (``repro run``'s check ignored it while ``repro train``'s
respected it; now both, and the ZeRO capacity search, ask the same function)."""

from __future__ import annotations

from pathlib import Path

import pytest

import repro.machine as machine
from repro.experiments.base import Point
from repro.harness.machine_fit import check_memory
from repro.training.startcheck import available_bytes

GIB = 2**30


def _container(root: Path, *, available_gib: float, v2: tuple[float, float] | None = None,
               v1: tuple[float, float] | None = None, cpu_max: str | None = None) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {int(available_gib * 2**20)} kB\n")
    cgroup = root / "sys" / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    if v2 is not None:
        (cgroup / "memory.max").write_text(f"{int(v2[0] * GIB)}\n")
        (cgroup / "memory.current").write_text(f"{int(v2[1] * GIB)}\n")
    if v1 is not None:
        (cgroup / "memory").mkdir()
        (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{int(v1[0] * GIB)}\n")
        (cgroup / "memory" / "memory.usage_in_bytes").write_text(f"{int(v1[1] * GIB)}\n")
    if cpu_max is not None:
        (cgroup / "cpu.max").write_text(cpu_max + "\n")
    return root


def test_a_containers_limit_caps_the_hosts_free_memory(tmp_path):
    host = _container(tmp_path / "host", available_gib=8)
    assert machine.host_memory(host) == (8 * GIB, "MemAvailable in /proc/meminfo")
    v2 = _container(tmp_path / "v2", available_gib=8, v2=(2, 0.5))
    assert machine.host_memory(v2)[0] == int(1.5 * GIB) and "memory.max" in machine.host_memory(v2)[1]
    v1 = _container(tmp_path / "v1", available_gib=8, v1=(3, 1))
    assert machine.host_memory(v1)[0] == 2 * GIB and "limit_in_bytes" in machine.host_memory(v1)[1]
    roomy = _container(tmp_path / "roomy", available_gib=8, v2=(64, 1))  # the host is the tighter bound
    assert machine.host_memory(roomy)[0] == 8 * GIB


def test_a_cpu_quota_caps_the_cpus(tmp_path):
    assert machine.cpu_count(_container(tmp_path / "a", available_gib=1, cpu_max="100000 100000")) == 1
    assert machine.cpu_count(_container(tmp_path / "b", available_gib=1, cpu_max="max 100000")) >= 1


def test_repro_run_and_repro_train_ask_the_same_probe(monkeypatch):
    monkeypatch.setattr(machine, "host_memory", lambda root=Path("/"): (2 * GIB, "a container of 2 GiB"))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert available_bytes("cpu", 0) == (2 * GIB, "a container of 2 GiB")
    point = Point(name="big", memory_gib=3.0)
    with pytest.raises(ValueError, match="has 2.0 GiB available"):
        check_memory("exp", "ci", point)
