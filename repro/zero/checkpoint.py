"""Sharded checkpoints of a ZeRO optimizer: save, load (resume), verify, consolidate, all written atomically.

A checkpoint is a directory:

    manifest.json     written last: format, world size, stage, and every shard file's size and sha256
    rank00000.pt      rank 0's optimizer shard (fp32 master weights, optimizer states, loss scale) + ``extra``
    rank00001.pt      ...

Atomicity: every file is written to a temporary name, fsynced and renamed; all of them go to ``<dir>.partial``,
which rank 0 renames to ``<dir>`` only after the manifest is on disk. A crash (or a full disk) leaves the previous
checkpoint or none, never a half-written one; :func:`verify_checkpoint` rejects a directory without a manifest
and any file whose size or digest differs from it. Parameters are restored from the master weights, so a resumed
run continues with exactly the losses of an uninterrupted one.

Loading is collective and fails together: each rank checks and reads its own shard, then one all-reduce tells
every rank whether any failed, before the first all-gather of parameters; a rank whose shard is corrupt
therefore makes every rank raise (naming that rank's file) instead of leaving the others waiting in a collective
until the process-group timeout. A checkpoint of another dp size is re-sharded on request (reshard.py).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from repro.atomic_files import atomic_write
from repro.input_files import inside, name_inside_problem, open_regular, read_config
from repro.dist import comm
from repro.dist.comm import CommGroup
from repro.zero.reshard import reshard_states
from repro.zero.weights_file import load_weights

MANIFEST = "manifest.json"
FORMAT = "repro-zero-checkpoint/1"
#: Bytes of a failing rank's reason sent to the other ranks (longer reasons are cut).
_REASON_BYTES = 2048


class CheckpointError(ValueError):
    """The checkpoint is incomplete, corrupt, or does not fit this optimizer."""


class CheckpointWriteError(CheckpointError):
    """A save that could not write its files (a full disk, a lost file system): raised on every rank, nothing was
    published, the previous checkpoint is as it was."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` either holds all of it or does not change (tmp+fsync+rename)."""
    atomic_write(path, [data])


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open_regular(path, error=CheckpointError) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def rank_file_name(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def save_checkpoint(
    directory: str | os.PathLike, optimizer, *, group: CommGroup | None = None, model_parallel_rank: int = 0,
    extra: Any = None, progress: Callable[[str], None] | None = None,
) -> Path:
    """Collective over ``group`` (default: the optimizer's dp group; pass the world group under tp/pp).

    Each rank hashes the file it writes, and every file's size and sha256 reach rank 0 in one all-gather: the
    other ranks wait at most for the slowest rank's own write (never for rank 0 to read every file back), so that
    write is what the groups' timeout must allow. A rank that cannot write (a full disk) tells the others in the
    same step: every rank raises :class:`CheckpointWriteError` with the first failing rank's reason, nothing is
    published, and the previous checkpoint stays as it was. ``progress(phase)`` is called as each phase starts
    (the watchdog names the phase when a save hangs)."""
    report = progress or (lambda phase: None)
    group = group if group is not None else optimizer.dp_group
    device = comm.group_device(group)
    final = Path(directory)
    partial = final.with_name(final.name + ".partial")
    report("preparing the directory")
    failure = None
    if group.rank == 0:
        try:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        except OSError as err:
            failure = write_failure(partial, err)
    _raise_agreed(agree_on_failure(failure, group, device), final, partial if group.rank == 0 else None)
    payload = {"optimizer": optimizer.state_dict(), "extra": extra, "rank": group.rank, "world_size": group.size,
               "model_parallel_rank": model_parallel_rank}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    report(f"writing {rank_file_name(group.rank)}")
    digest = ""
    try:
        digest = atomic_write(partial / rank_file_name(group.rank), [data])
    except OSError as err:
        failure = write_failure(partial / rank_file_name(group.rank), err)
    report("agreeing that every rank wrote its file")
    _raise_agreed(agree_on_failure(failure, group, device), final, partial if group.rank == 0 else None)
    report("waiting for every rank's file")
    entries = _gather_files(len(data), digest, group)
    if group.rank == 0:
        report("publishing")
        try:
            _publish(partial, final, entries, group, optimizer)
        except (OSError, CheckpointError) as err:
            failure = write_failure(partial, err) if isinstance(err, OSError) else str(err)
    report("waiting for rank 0 to publish")
    _raise_agreed(agree_on_failure(failure, group, device), final, partial if group.rank == 0 else None)
    return final


def write_failure(path: Path, err: OSError) -> str:
    """One line for a write that failed: a full disk (or quota) is named as such."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full while writing {path}"
    return f"cannot write {path} ({err.strerror or err})"


def _raise_agreed(agreed: tuple[int, str] | None, final: Path, partial: Path | None) -> None:
    """After :func:`agree_on_failure`: when a rank failed, remove the unpublished files (``partial``, rank 0) and
    raise."""
    if agreed is None:
        return
    if partial is not None:
        shutil.rmtree(partial, ignore_errors=True)
    rank, reason = agreed
    kept = f"; the previous checkpoint {final} is intact" if final.exists() else ""
    raise CheckpointWriteError(f"rank {rank}: {reason}; nothing was published{kept}")


def _publish(partial: Path, final: Path, entries: list[tuple[int, str]], group: CommGroup, optimizer) -> None:
    """Rank 0: check every rank's file against what it wrote, write the manifest, rename ``partial`` to ``final``."""
    files = {}
    for rank, (size, sha256) in enumerate(entries):
        path = partial / rank_file_name(rank)
        if path.stat().st_size != size:  # a shared file system that lost or cut a rank's file
            raise CheckpointError(f"{path} holds {path.stat().st_size} bytes; rank {rank} wrote {size}")
        files[path.name] = {"bytes": size, "sha256": sha256}
    manifest = {"format": FORMAT, "world_size": group.size, "stage": optimizer.stage,
                "dp_size": optimizer.dp_group.size, "files": files}
    atomic_write_bytes(partial / MANIFEST, json.dumps(manifest, indent=1).encode())
    _fsync_dir(partial)
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    partial.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


#: one rank's entry in :func:`_gather_files`: its file's size (8 bytes, little-endian), then its sha256 (32 bytes)
_ENTRY_BYTES = 8 + 32


def _gather_files(size: int, sha256: str, group: CommGroup) -> list[tuple[int, str]]:
    """Every rank's (file size, sha256 hex), in group-rank order, through one all-gather of 40 bytes per rank."""
    row = torch.tensor(list(size.to_bytes(8, "little") + bytes.fromhex(sha256)), dtype=torch.uint8,
                       device=comm.group_device(group))
    table = torch.empty(group.size * _ENTRY_BYTES, dtype=torch.uint8, device=row.device)
    comm.all_gather_into_tensor(table, row, group)
    raw = bytes(table.cpu().tolist())
    entries = [raw[r * _ENTRY_BYTES:(r + 1) * _ENTRY_BYTES] for r in range(group.size)]
    return [(int.from_bytes(entry[:8], "little"), entry[8:].hex()) for entry in entries]


def read_manifest(directory: str | os.PathLike, *, within: str | os.PathLike | None = None) -> dict[str, Any]:
    """The checked manifest of a checkpoint directory: a regular file inside it (or inside ``within``, the directory
    the user gave, above it), a JSON object of this format whose files table names only files inside the directory
    (``..``, absolute names are refused, naming the entry)."""
    path = Path(directory) / MANIFEST
    if not os.path.lexists(path):
        partial = Path(directory).with_name(Path(directory).name + ".partial")
        hint = f" (an unfinished save left {partial})" if partial.exists() else ""
        raise CheckpointError(f"incomplete checkpoint {directory}: no {MANIFEST}, the save did not finish{hint}")
    try:
        path = inside(directory, MANIFEST, what=f"checkpoint {directory}", error=CheckpointError, within=within)
        manifest = json.loads(read_config(path, error=CheckpointError).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointError(f"corrupt checkpoint {directory}: {MANIFEST} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"corrupt checkpoint {directory}: {MANIFEST} holds a JSON {type(manifest).__name__}, "
                              "not an object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{directory} is not a repro ZeRO checkpoint (format {manifest.get('format')!r})")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)
            for entry in files.values()):
        raise CheckpointError(f"corrupt checkpoint {directory}: {MANIFEST} has no files table of "
                              "{name: {bytes, sha256}}")
    for name in files:
        problem = name_inside_problem(name)
        if problem is not None:
            raise CheckpointError(f"corrupt checkpoint {directory}: {MANIFEST}'s files table: entry {problem}")
    return manifest


def verify_file(directory: Path, name: str, expected: dict[str, Any], *,
                within: str | os.PathLike | None = None) -> Path:
    """``directory / name`` checked: a regular file inside the directory (no symlink out of it; ``within``: the
    directory the user gave, above it, bounds the symlinks instead), of the size and sha256 the manifest records."""
    path = inside(directory, name, what=f"corrupt checkpoint {directory}: {MANIFEST}", error=CheckpointError,
                  missing_ok=True, within=within)
    if not os.path.lexists(path):
        raise CheckpointError(f"corrupt checkpoint {directory}: {name} listed in the manifest is missing")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise CheckpointError(f"corrupt checkpoint {directory}: {name} has {size} bytes, the manifest says "
                              f"{expected['bytes']} (truncated or partially written)")
    if _digest(path) != expected["sha256"]:
        raise CheckpointError(f"corrupt checkpoint {directory}: {name} does not match its sha256 in the manifest")
    return path


def verify_checkpoint(directory: str | os.PathLike, *, within: str | os.PathLike | None = None) -> dict[str, Any]:
    """Check the manifest and every file against it (each inside ``directory``, or ``within`` above it); return the
    manifest."""
    manifest = read_manifest(directory, within=within)
    for name, expected in manifest["files"].items():
        verify_file(Path(directory), name, expected, within=within)
    return manifest


def _load_payload(path: Path) -> dict[str, Any]:
    payload = load_weights(path, error=CheckpointError)
    if not isinstance(payload, dict) or not isinstance(payload.get("optimizer"), dict):
        raise CheckpointError(f"{str(path)!r} holds no optimizer state (a {type(payload).__name__})")
    return payload


def _fit_error(state: dict[str, Any], optimizer) -> str | None:
    """Why ``state`` cannot be loaded into ``optimizer`` (checked before any collective), or None."""
    for name, mine in (("stage", optimizer.stage), ("dp_size", optimizer.dp_group.size),
                       ("dp_rank", optimizer.dp_group.rank)):
        if state.get(name) != mine:
            return f"checkpoint has {name}={state.get(name)}, this optimizer has {name}={mine}"
    if len(state["buckets"]) != len(optimizer.buckets):
        return f"checkpoint has {len(state['buckets'])} buckets, this optimizer {len(optimizer.buckets)}"
    for saved, bucket in zip(state["buckets"], optimizer.buckets):
        if tuple(saved["numels"]) != bucket.layout.numels:
            return f"bucket {bucket.key}: checkpoint parameter sizes differ from this model's"
    return None


def _read_own_shard(directory: Path, manifest: dict[str, Any], rank: int) -> dict[str, Any]:
    name = rank_file_name(rank)
    if name not in manifest["files"]:
        raise CheckpointError(f"corrupt checkpoint {directory}: the manifest lists no {name}")
    return _load_payload(verify_file(directory, name, manifest["files"][name]))


def _read_resharded(
    directory: Path, manifest: dict[str, Any], optimizer, model_parallel_rank: int
) -> dict[str, Any]:
    """Every saved shard of ``model_parallel_rank``, re-cut for this optimizer's dp group (reshard.py)."""
    states, extra = [], None
    for name, expected in sorted(manifest["files"].items()):
        payload = _load_payload(verify_file(directory, name, expected))
        if payload["model_parallel_rank"] == model_parallel_rank:
            states.append(payload["optimizer"])
            if payload["optimizer"]["dp_rank"] == 0:
                extra = payload["extra"]
    if not states:
        raise CheckpointError(f"checkpoint {directory} holds no shard of model-parallel rank {model_parallel_rank}")
    try:
        state = reshard_states(states, new_dp_size=optimizer.dp_group.size, new_dp_rank=optimizer.dp_group.rank,
                               stage=optimizer.stage)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {directory} cannot be re-sharded: {err}") from err
    return {"optimizer": state, "extra": extra}


def agree_on_failure(failure: str | None, group: CommGroup, device: torch.device) -> tuple[int, str] | None:
    """All ranks learn whether any failed: one all-reduce (MIN of the failing rank, ``group.size`` for none)
    and, only after a failure, a broadcast of the first failing rank's reason. Returns (rank, reason) or None.

    Run before any other collective of the load: a rank that failed alone must not leave the others waiting
    in an all-gather (they would hang until the process-group timeout)."""
    failed = torch.tensor([group.rank if failure is not None else group.size], dtype=torch.int64, device=device)
    comm.all_reduce(failed, group, op=dist.ReduceOp.MIN)
    first = int(failed.item())
    if first >= group.size:
        return None
    reason = torch.zeros(_REASON_BYTES, dtype=torch.uint8, device=device)
    if group.rank == first:
        encoded = failure.encode()[:_REASON_BYTES]
        reason[:len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8, device=device)
    comm.broadcast(reason, group, src_group_rank=first)
    return first, bytes(reason.cpu().tolist()).rstrip(b"\0").decode(errors="replace")



def load_checkpoint(
    directory: str | os.PathLike, optimizer, *, group: CommGroup | None = None, allow_reshard: bool = False,
    model_parallel_rank: int = 0,
) -> Any:
    """Restore this rank's shard into ``optimizer`` (parameters included); returns the ``extra`` saved with it.

    Collective over ``group`` (default: the optimizer's dp group; pass the world group under tp/pp). Every rank
    first verifies its own shard (size and sha256 against the manifest) and reads it; then the ranks agree: if
    any failed, every rank raises CheckpointError naming the failing rank's file and its reason, before any
    parameter all-gather starts. ``allow_reshard``: a checkpoint written by another dp size is read whole (all
    shards of ``model_parallel_rank``) and re-cut for this group (reshard.py); ``extra`` is then dp rank 0's.
    """
    group = group if group is not None else optimizer.dp_group
    directory = Path(directory)
    payload, failure = None, None
    try:
        manifest = read_manifest(directory)
        if manifest["world_size"] == group.size and manifest.get("dp_size") == optimizer.dp_group.size:
            payload = _read_own_shard(directory, manifest, group.rank)
        elif allow_reshard:
            payload = _read_resharded(directory, manifest, optimizer, model_parallel_rank)
        else:
            raise CheckpointError(f"checkpoint {directory} was written by {manifest['world_size']} ranks (dp "
                                  f"{manifest.get('dp_size')}), this job has {group.size} (dp "
                                  f"{optimizer.dp_group.size}); pass allow_reshard=True to re-shard it")
        failure = _fit_error(payload["optimizer"], optimizer)
    except Exception as err:  # noqa: BLE001 - every failure must reach the agreement below
        failure = str(err) or type(err).__name__
    agreed = agree_on_failure(failure, group, optimizer.device)
    if agreed is not None:
        rank, reason = agreed
        raise CheckpointError(f"loading checkpoint {directory} failed on rank {rank} "
                              f"({directory / rank_file_name(rank)}): {reason}")
    optimizer.load_state_dict(payload["optimizer"])
    return payload["extra"]


def consolidate_checkpoint(directory: str | os.PathLike, *,
                           within: str | os.PathLike | None = None) -> dict[int, dict[str, torch.Tensor]]:
    """Full fp32 parameters from a sharded checkpoint, one state dict per model-parallel rank (0 without tp/pp):
    each bucket's shards are concatenated in dp-rank order and cut back into named parameters."""
    directory = Path(directory)
    manifest = verify_checkpoint(directory, within=within)
    by_mp: dict[int, dict[int, dict]] = {}
    for name in sorted(manifest["files"]):
        payload = _load_payload(directory / name)
        state = payload["optimizer"]
        by_mp.setdefault(payload["model_parallel_rank"], {})[state["dp_rank"]] = state
    out: dict[int, dict[str, torch.Tensor]] = {}
    for mp_rank, shards in by_mp.items():
        first = shards[min(shards)]
        full: dict[str, torch.Tensor] = {}
        for index, bucket in enumerate(first["buckets"]):
            world = bucket["layout_world"]
            if world == 1:
                flat = bucket["state"]["master"]
            else:
                missing = [r for r in range(world) if r not in shards]
                if missing:
                    raise CheckpointError(
                        f"checkpoint {directory} lacks dp ranks {missing} of model-parallel rank {mp_rank}")
                flat = torch.cat([shards[r]["buckets"][index]["state"]["master"] for r in range(world)])
            offset = 0
            for name, numel, shape in zip(bucket["names"], bucket["numels"], bucket["shapes"]):
                full[name] = flat[offset:offset + numel].view(shape).clone()
                offset += numel
        out[mp_rank] = full
    return out
