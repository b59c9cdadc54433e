"""What this machine offers a job right now: host memory and CPUs, as the kernel and the container see them.

One probe for every command that sizes work against the machine (``repro run``'s memory check, ``repro train``'s
start check, the ZeRO capacity search): host memory is ``MemAvailable`` of ``/proc/meminfo`` (what can be allocated
without swapping; the free pages where there is no such line), capped by the room a cgroup leaves (v2
``memory.max`` less ``memory.current``; v1 ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``), since a
container's limit, not the host's free memory, is what the OOM killer enforces. CPUs are the ones this process may
run on (its affinity), capped by a cgroup v2 CPU quota (``cpu.max``). ``root`` lets a test stand in a container.
And what this process holds: its resident set now and at its peak (``VmRSS``, ``VmHWM``), the peak resettable.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: a cgroup v1 "no limit" is a huge number rather than "max"
_V1_UNLIMITED = 1 << 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _meminfo_available(root: Path) -> tuple[int, str]:
    text = _read(root / "proc" / "meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
            except (IndexError, ValueError):
                break
    if hasattr(os, "sysconf") and root == Path("/"):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages (os.sysconf)"
    return 0, "nothing readable in /proc/meminfo"


def cgroup_memory_room(root: Path = Path("/")) -> tuple[int, str] | None:
    """(bytes a cgroup lets this process still allocate, which limit), or None when no limit applies."""
    cgroup = root / "sys" / "fs" / "cgroup"
    for limit_name, used_name, label in (("memory.max", "memory.current", "the cgroup's memory.max"),
                                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                          "the cgroup's memory.limit_in_bytes")):
        limit, used = _read(cgroup / limit_name), _read(cgroup / used_name)
        if limit is None or used is None or limit == "max":
            continue
        try:
            limit_bytes, used_bytes = int(limit), int(used)
        except ValueError:
            continue
        if limit_bytes >= _V1_UNLIMITED:
            continue
        return max(0, limit_bytes - used_bytes), f"{label} less what the cgroup uses"
    return None


def host_memory(root: Path = Path("/")) -> tuple[int, str]:
    """(bytes that can be allocated now without swapping or meeting a container's limit, where that comes from)."""
    free, source = _meminfo_available(root)
    room = cgroup_memory_room(root)
    if room is not None and room[0] < free:
        return room
    return free, source


def host_memory_gib(root: Path = Path("/")) -> float:
    return host_memory(root)[0] / 2**30


def cpu_count(root: Path = Path("/")) -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 quota (``cpu.max`` "quota period")."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = (_read(root / "sys" / "fs" / "cgroup" / "cpu.max") or "max").split()
    if len(quota) == 2 and quota[0] != "max":
        try:
            cpus = min(cpus, max(1, math.ceil(int(quota[0]) / int(quota[1]))))
        except (ValueError, ZeroDivisionError):
            pass
    return max(1, cpus)


# --- this process's resident memory, now and at its peak (the ZeRO measurements, the trainer's log) -------

def _status_bytes(field_name: str) -> int:
    """A /proc/self/status field in bytes (VmRSS = resident now, VmHWM = peak resident)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    return _status_bytes("VmHWM")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False
