"""Which device a rank computes on, chosen at run time: one GPU per rank (``LOCAL_RANK``) with nccl, else CPU + gloo.

Megatron-LM and torchrun's convention: rank ``r`` of a node uses ``cuda:LOCAL_RANK``. Asking for more ranks per node
than the node has GPUs is an error here (silently sharing a GPU between ranks would make every timing wrong).
"""

from __future__ import annotations

import os
from typing import Mapping

import torch

DEVICES = ("auto", "cpu", "cuda")


class DeviceError(ValueError):
    """A device request this machine cannot satisfy (one line naming the value and the rule)."""


def local_rank_from_env(env: Mapping[str, str] | None = None) -> int:
    """``LOCAL_RANK`` (torchrun) or ``SLURM_LOCALID`` (srun); 0 for a single process."""
    env = os.environ if env is None else env
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        if key in env:
            try:
                value = int(env[key])
            except ValueError as err:
                raise DeviceError(f"{key}={env[key]!r} must be a non-negative integer") from err
            if value < 0:
                raise DeviceError(f"{key}={value} must be a non-negative integer")
            return value
    return 0


def select_device(requested: str = "auto", *, local_rank: int | None = None,
                  cuda_devices: int | None = None) -> torch.device:
    """``cuda:LOCAL_RANK`` or ``cpu``.

    ``auto``: a GPU when this process has one, else the CPU. ``cuda``: a GPU or a :class:`DeviceError`.
    ``cpu``: the CPU, always. A local rank at or beyond the node's GPU count is an error, never a wrap-around.
    """
    if requested not in DEVICES:
        raise DeviceError(f"device {requested!r} is not one of {', '.join(DEVICES)}")
    if requested == "cpu":
        return torch.device("cpu")
    if cuda_devices is None:
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda_devices == 0:
        if requested == "cuda":
            raise DeviceError("device 'cuda' was asked for but this machine has no CUDA GPU "
                              "(torch.cuda.is_available() is False); use --device cpu or auto")
        return torch.device("cpu")
    rank = local_rank_from_env() if local_rank is None else local_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise DeviceError(f"local rank {rank!r} must be a non-negative integer")
    if rank >= cuda_devices:
        raise DeviceError(
            f"local rank {rank} has no GPU: this node has {cuda_devices} GPU(s) and each rank needs its own "
            f"(launch at most {cuda_devices} rank(s) per node, e.g. --ntasks-per-node={cuda_devices})"
        )
    return torch.device("cuda", rank)


def backend_for(device: torch.device | str) -> str:
    """nccl for GPU tensors, gloo for CPU tensors."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def describe(device: torch.device | str) -> dict[str, object]:
    """Provenance of a device: GPU name, count, driver, CUDA and cuDNN versions (or the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        import platform

        return {"type": "cpu", "name": platform.processor() or platform.machine(), "count": os.cpu_count()}
    props = torch.cuda.get_device_properties(device)
    info: dict[str, object] = {
        "type": "cuda",
        "name": props.name,
        "count": torch.cuda.device_count(),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    try:  # the driver version is not exposed by torch; NVML has it when installed
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # noqa: BLE001 - provenance is best effort; the rest still identifies the GPU
        info["driver"] = _driver_from_proc()
    return info


def _driver_from_proc() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="ascii") as handle:
            first = handle.readline()
    except OSError:
        return None
    for word in first.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def rank_device(requested: str, rank: int) -> torch.device:
    """The device of experiment rank ``rank`` when the runner asked for ``requested`` ("cpu" or "cuda"):
    ``cuda:LOCAL_RANK`` under torchrun/srun, ``cuda:rank`` on ranks the local launcher spawned (one node), made the
    current CUDA device; the CPU when ``requested`` is "cpu"."""
    if requested == "cpu":
        return torch.device("cpu")
    launched = "LOCAL_RANK" in os.environ or "SLURM_LOCALID" in os.environ
    device = select_device("cuda", local_rank=local_rank_from_env() if launched else rank)
    torch.cuda.set_device(device)
    return device


def gpu_identity(device: torch.device | None = None) -> tuple[str, str]:
    """(host, GPU) naming the physical GPU this rank computes on: the device's UUID where torch reports one, else its
    PCI bus id, else the index (which ``CUDA_VISIBLE_DEVICES`` may renumber, so two ranks may then look distinct)."""
    import socket

    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return socket.gethostname(), f"GPU-{uuid}"
    bus = getattr(props, "pci_bus_id", None)
    return socket.gethostname(), f"pci:{bus}" if bus is not None else f"cuda:{device.index}"


def shared_gpus(identities: list[tuple[str, str]]) -> list[tuple[int, int, str, str]]:
    """(first rank, second rank, host, GPU) for every rank that uses a GPU an earlier rank already uses."""
    seen: dict[tuple[str, str], int] = {}
    clashes = []
    for rank, ident in enumerate(identities):
        key = (str(ident[0]), str(ident[1]))
        if key in seen:
            clashes.append((seen[key], rank, key[0], key[1]))
        else:
            seen[key] = rank
    return clashes


def check_one_gpu_per_rank(identity: tuple[str, str], group=None) -> None:
    """Collective over ``group`` (default: the world): every rank sends its (host, GPU); two ranks on one GPU is a
    :class:`DeviceError` on every rank, naming both (they would share its memory and time each other's kernels)."""
    import torch.distributed as dist

    identities: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(identities, tuple(identity), group=group)
    clashes = shared_gpus(identities)
    if clashes:
        first, second, host, gpu = clashes[0]
        raise DeviceError(
            f"ranks {first} and {second} both compute on GPU {gpu} of host {host}: each rank needs a GPU of its own "
            "(one rank per GPU: check LOCAL_RANK/SLURM_LOCALID, --ntasks-per-node and CUDA_VISIBLE_DEVICES)"
            + (f"; {len(clashes) - 1} more rank(s) share a GPU" if len(clashes) > 1 else ""))
