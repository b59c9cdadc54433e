"""Initialise torch.distributed from whatever launched us: torchrun, srun, or our own local launcher.

torchrun exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. srun exports SLURM_PROCID /
SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_NODELIST / SLURM_JOB_ID; the master is the first host of the node list
and the port is derived from the job id so that concurrent jobs on a node do not collide.
With neither, the process is a job of one: it rendezvouses at MASTER_ADDR:MASTER_PORT when MASTER_PORT is set, and
otherwise through an in-process store that needs no port at all, so any number of one-process runs share a machine.
The backend is chosen at run time: nccl when CUDA is available, gloo otherwise.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0
#: launch variables (ranks, world sizes) must lie below this: torch's store and process groups count in int32
MAX_LAUNCH_INT = 2**31


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as read from the launcher's environment."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int  # 0: no rendezvous port (a one-process job without MASTER_PORT uses an in-process store)
    launcher: str  # "torchrun" | "srun" | "single"


def default_backend() -> str:
    """nccl on GPUs, gloo on CPUs (chosen at run time, never hard-coded)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``node[03-05,09],gpu1`` -> ``node03``; ``a1,a2`` -> ``a1``."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("SLURM_JOB_NODELIST is empty; cannot choose the master host")
    match = re.match(r"^([^,\[]+)(\[([^\]]+)\])?", nodelist)
    if match is None:
        raise ValueError(f"cannot parse SLURM_JOB_NODELIST={nodelist!r}")
    prefix, _, ranges = match.groups()
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_port(job_id: str | int, base: int = 20000, span: int = 20000) -> int:
    """A port derived from the job id, so that two jobs sharing a node use different ports."""
    try:
        job = int(str(job_id).split("_")[0])
    except ValueError as err:
        raise ValueError(f"SLURM_JOB_ID={job_id!r} is not an integer job id") from err
    return base + job % span


def _int_var(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise ValueError(f"launch variable {name} is missing")
    try:
        number = int(value)
    except ValueError as err:
        raise ValueError(f"launch variable {name}={value!r} is not an integer") from err
    if not -MAX_LAUNCH_INT < number < MAX_LAUNCH_INT:
        raise ValueError(f"launch variable {name}={value} is out of range: it must be below 2**31")
    return number


def _port_var(env: Mapping[str, str], name: str = "MASTER_PORT") -> int:
    value = env[name]
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"launch variable {name}={value!r} must be a TCP port number in 1..65535")
    return port


def read_launch_env(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read rank, world size and rendezvous address from torchrun's or srun's variables.

    torchrun's variables win when both are present (srun running one torchrun per node sets both).
    With neither, this is a single process (rank 0 of 1), at MASTER_ADDR (default 127.0.0.1) and MASTER_PORT when
    MASTER_PORT is set, else with port 0: no port (see :func:`init_distributed`).
    """
    env = os.environ if env is None else env
    if "RANK" in env or "WORLD_SIZE" in env:
        rank, world = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE")
        local = _int_var(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
        addr = env.get("MASTER_ADDR")
        port = env.get("MASTER_PORT")
        if addr is None or port is None:
            raise ValueError("RANK/WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is missing")
        if not addr.strip():
            raise ValueError(f"launch variable MASTER_ADDR={addr!r} is empty: it must name rank 0's host")
        launcher = "torchrun"
        port_int = _port_var(env)
    elif "SLURM_PROCID" in env:
        rank, world = _int_var(env, "SLURM_PROCID"), _int_var(env, "SLURM_NTASKS")
        local = _int_var(env, "SLURM_LOCALID")
        addr = env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_JOB_NODELIST", ""))
        port_int = _port_var(env) if "MASTER_PORT" in env else slurm_port(env.get("SLURM_JOB_ID", "0"))
        launcher = "srun"
    else:
        port_int = _port_var(env) if "MASTER_PORT" in env else 0
        if "MASTER_ADDR" in env and not env["MASTER_ADDR"].strip():
            raise ValueError(f"launch variable MASTER_ADDR={env['MASTER_ADDR']!r} is empty: it must name a host "
                             "(or leave it unset: 127.0.0.1)")
        return LaunchEnv(0, 1, 0, env.get("MASTER_ADDR") or "127.0.0.1", port_int, "single")
    if world < 1:
        raise ValueError(f"world size {world} must be >= 1")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside [0, world size {world})")
    if local < 0:
        raise ValueError(f"local rank {local} must be >= 0")
    return LaunchEnv(rank, world, local, addr, port_int, launcher)


def init_distributed(
    backend: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> LaunchEnv:
    """Initialise the default process group from the launcher's environment (idempotent).

    ``timeout_s`` bounds every collective, so a dead peer makes the job fail instead of hang. A job of one without
    MASTER_PORT rendezvouses through an in-process store (no port to collide with another run on the machine); a
    MASTER_PORT that another process holds is a ``ValueError`` naming it.
    """
    launch = read_launch_env(env)
    if dist.is_initialized():
        if dist.get_world_size() != launch.world_size and launch.launcher != "single":
            raise ValueError(
                f"process group already initialised with world size {dist.get_world_size()}, "
                f"but the launcher says {launch.world_size}"
            )
        return launch
    backend = backend or default_backend()
    if backend == "nccl":
        from repro.dist.device import select_device

        # cuda:LOCAL_RANK, or an error when the node has fewer GPUs than ranks (never a wrap-around onto a GPU
        # that another rank already uses)
        torch.cuda.set_device(select_device("cuda", local_rank=launch.local_rank))
    rendezvous: dict = {"store": dist.HashStore()} if launch.master_port == 0 else {
        "init_method": f"tcp://{launch.master_addr}:{launch.master_port}"}
    if launch.master_port and launch.rank != 0:
        wait_for_rendezvous(launch, timeout_s=timeout_s)
    elif launch.master_port:
        wait_for_address(launch, timeout_s=timeout_s)
    try:
        dist.init_process_group(backend=backend, rank=launch.rank, world_size=launch.world_size,
                                timeout=_dt.timedelta(seconds=timeout_s), **rendezvous)
    except RuntimeError as err:  # torch's DistNetworkError: the master could not bind its port
        if launch.rank == 0 and "in use" in str(err).lower():
            hint = "unset MASTER_PORT to run without a port" if launch.launcher == "single" else "choose a free port"
            raise ValueError(f"launch variable MASTER_PORT={launch.master_port}: the port is in use on "
                             f"{launch.master_addr} (another job?); {hint}") from None
        joined = re.search(r"(\d+)/(\d+) clients joined", str(err))
        if joined or "timed out" in str(err).lower():
            count = f"only {joined.group(1)} of {joined.group(2)} ranks" if joined else "not every rank"
            raise RendezvousFailed(f"rank {launch.rank}: {count} joined the rendezvous at {launch.master_addr}:"
                                   f"{launch.master_port} within --timeout-s {timeout_s:g} s: are the others "
                                   "running, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?") from None
        raise
    if backend == "nccl":
        from repro.dist.device import check_one_gpu_per_rank, gpu_identity

        check_one_gpu_per_rank(gpu_identity())
    return launch


class RendezvousFailed(RuntimeError):
    """The ranks did not meet at MASTER_ADDR:MASTER_PORT within the timeout (a host that does not resolve, nobody
    listening, a rank that never came): one line, and the exit code of a hang (124) in the trainer."""


def wait_for_address(launch: LaunchEnv, *, timeout_s: float) -> None:
    """Rank 0, before torch's store (whose client repeats a warning and a C++ stack per failed lookup): resolve
    MASTER_ADDR, retrying for at most ``timeout_s`` (DNS at a job's start may lag); :class:`RendezvousFailed`
    naming it otherwise."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.getaddrinfo(launch.master_addr, launch.master_port, type=socket.SOCK_STREAM)
            return
        except (socket.gaierror, UnicodeError) as err:
            reason = getattr(err, "strerror", None) or str(err)
        if time.monotonic() >= deadline:
            raise RendezvousFailed(
                f"rank {launch.rank}: MASTER_ADDR={launch.master_addr!r} did not resolve within --timeout-s "
                f"{timeout_s:g} s ({reason}): it must name rank 0's host")
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def wait_for_rendezvous(launch: LaunchEnv, *, timeout_s: float) -> None:
    """Before torch's store client (whose failure is a C++ stack dump and a traceback): connect to the master's
    port until it answers, for at most ``timeout_s``; :class:`RendezvousFailed` naming the address otherwise."""
    import socket
    import time

    deadline, reason = time.monotonic() + timeout_s, "no answer"
    while True:
        try:
            with socket.create_connection((launch.master_addr, launch.master_port),
                                          timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                return
        except socket.gaierror as err:
            reason = f"the host does not resolve: {err.strerror}"
        except OSError as err:
            reason = err.strerror or type(err).__name__
        if time.monotonic() >= deadline:
            raise RendezvousFailed(
                f"rank {launch.rank}: no rendezvous at MASTER_ADDR={launch.master_addr} MASTER_PORT="
                f"{launch.master_port} within --timeout-s {timeout_s:g} s ({reason}): is rank 0 running there?")
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def device_for(backend: str | None = None) -> torch.device:
    """The device tensors of this rank should live on for the given backend."""
    backend = backend or (dist.get_backend() if dist.is_initialized() else default_backend())
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def leave_process_group() -> bool:
    """End this process's part in the default process group, at the end of a rank's work.

    Returns ``True`` when the group was destroyed, ``False`` when it was left to the process's exit: on torch < 2.5,
    ``destroy_process_group()`` deadlocks now and then (the gloo destructor joins a worker thread that waits for the
    GIL the destroying thread holds), so there the ranks meet at a barrier and the caller must end the process with
    ``os._exit`` (after flushing what it wrote), which runs no destructor.
    """
    if not dist.is_initialized():
        return True
    from repro.optional import torch_version

    if torch_version() < (2, 5):
        dist.barrier()
        return False
    dist.destroy_process_group()
    return True


def end_rank(code: int) -> int:
    """At the end of an entry point's work, on every rank: leave the default process group and return ``code``.

    On torch < 2.5 (see :func:`leave_process_group`) the process ends here, with ``code``, after the ranks' barrier:
    the group's destructors would otherwise run at the interpreter's exit, where torch 2.4's gloo can deadlock or
    abort ("terminate called without an active exception", exit code 134 instead of the rank's own). A peer already
    gone (the barrier fails) changes nothing: this rank's work is done, and it ends with its own code.
    """
    try:
        left = leave_process_group()
    except Exception:  # noqa: BLE001 - a peer that left first; the work was done
        left = False
    if not left:
        exit_now(code)
    return code


def exit_now(code: int = 0) -> None:
    """Flush stdout and stderr and end the process at once (no destructors, no atexit handlers)."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
