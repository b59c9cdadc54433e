"""Checkpoints of a training run under any tp x pp x dp layout: save, find the newest, resume bit for bit.

A save directory holds one checkpoint per saved iteration and a pointer to the newest, as Megatron-LM's does:

    DIR/iter_0000010/manifest.json      every rank's file with its size and sha256 (repro.zero.checkpoint)
    DIR/iter_0000010/rank00000.pt       this rank's optimizer (ZeRO-sharded or not) and its ``trainer`` extra:
                                        model shard (stage 0; ZeRO restores parameters from its masters),
                                        every random generator (torch, CUDA, the tensor-parallel tracker)
    DIR/iter_0000010/trainer.json       layout (tp, pp, dp), ZeRO stage, iteration, consumed samples, settings
    DIR/latest_checkpointed_iteration.txt   "10": written last, the commit point of a save

Every file is written atomically (temporary name, fsync, rename) and the per-rank files are published together
(:func:`repro.zero.checkpoint.save_checkpoint`); the pointer moves only after ``trainer.json`` is on disk, so a crash
at any moment leaves the previous checkpoint as the newest. Loading verifies each file a rank reads against the
manifest, and all ranks agree on success (one all-reduce) before any other collective runs: a corrupt shard on one
rank makes every rank raise :class:`CheckpointError` naming that file, instead of leaving the others waiting.

A checkpoint loads into the same tp and pp (a different one is refused: the shards would have to be re-cut) and any
dp size: with ``zero_stage=0`` the optimizer states are the same on every dp rank; under ZeRO they are re-sharded from
all of the old dp ranks' shards (:mod:`repro.zero.reshard`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from repro.dist import comm
from repro.dist.groups import GridCoord, RankGrid
from repro.input_files import directory_problem, inside, read_config, read_pointer
from repro.training.checkpoint_fit import difference, fit_problem
from repro.training.checkpoint_kinds import describe_foreign
from repro.zero.checkpoint import (
    MANIFEST, CheckpointError, CheckpointWriteError, rank_file_name, verify_file, agree_on_failure, atomic_write_bytes,
    read_manifest, save_checkpoint, write_failure,
)
from repro.zero.weights_file import load_weights

LATEST = "latest_checkpointed_iteration.txt"
TRAINER = "trainer.json"
#: settings that must match for a resume to continue the same run (others, like the logging, may change)
MUST_MATCH = ("seq_len", "micro_batch_size", "optimizer", "zero_stage", "precision", "seed")


def iteration_dir(directory: str | os.PathLike, iteration: int) -> Path:
    return Path(directory) / f"iter_{iteration:07d}"


def remove_unfinished(directory: str | os.PathLike) -> list[Path]:
    """Remove the ``iter_*.partial`` folders of saves that never finished in ``directory`` (a second Ctrl-C or a
    kill during a save exits without tidying up); returns what was removed. They were never published (the
    newest-pointer never named them), so no load could have read them."""
    import shutil

    found = sorted(p for p in Path(directory).glob("iter_*.partial") if p.is_dir() and not p.is_symlink())
    for folder in found:
        shutil.rmtree(folder, ignore_errors=True)
    return found


def _rng_state(trainer) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "tracker": trainer.rng_tracker._state.clone()}
    if trainer.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(trainer.device)
    return state


def _set_rng_state(trainer, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    trainer.rng_tracker._state = state["tracker"].clone()
    if "cuda" in state and trainer.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], trainer.device)


def _model_parallel_rank(groups) -> int:
    return groups.pp_rank * groups.tp_size + groups.tp_rank


def save_training_checkpoint(
    directory: str | os.PathLike, trainer, *, extra: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None, guard: Callable[[], str | None] | None = None,
) -> Path:
    """Collective over every rank: write ``DIR/iter_<iteration>`` and move the newest-pointer to it.

    ``progress(phase)`` is called as each phase starts ("writing rank00001.pt", "agreeing that every rank wrote its
    file"): a heartbeat, and what the watchdog names when the save hangs. ``guard()`` (given on every rank or on
    none; rank 0's answer counts) says why this run may no longer write into ``directory`` (its lock was taken
    over, :mod:`repro.training.dirlock`): every rank then raises :class:`CheckpointWriteError` before a byte is
    written."""
    report = progress or (lambda phase: None)
    groups, s = trainer.groups, trainer.settings
    if guard is not None:
        report("checking that this run still holds the directory")
        agreed = agree_on_failure(guard() if groups.rank == 0 else None, groups.world, trainer.device)
        if agreed is not None:
            raise CheckpointWriteError(f"{agreed[1]}; nothing was published")
    path = iteration_dir(directory, trainer.iteration)
    payload = {
        "model": trainer.stage.state_dict() if s.zero_stage == 0 else None,
        "rng": _rng_state(trainer),
        "iteration": trainer.iteration,
        "consumed_samples": trainer.consumed_samples,
    }
    Path(directory).mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, trainer.optimizer, group=groups.world, model_parallel_rank=_model_parallel_rank(groups),
                    extra=payload, progress=report)
    failure = None
    if groups.rank == 0:
        report(f"writing {TRAINER} and {LATEST}")
        meta = {
            "iteration": trainer.iteration, "consumed_samples": trainer.consumed_samples,
            "tp": groups.tp_size, "pp": groups.pp_size, "dp": groups.dp_size, "zero_stage": s.zero_stage,
            "global_batch_size": trainer.global_batch_size, "model": trainer.config.__dict__,
            "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.__dict__.items()},
            **(extra or {}),
        }
        written = path / TRAINER
        try:
            atomic_write_bytes(written, json.dumps(meta, indent=1, default=str).encode())
            written = Path(directory) / LATEST
            atomic_write_bytes(written, f"{trainer.iteration}\n".encode())
        except OSError as err:  # the pointer did not move: the newest checkpoint is still the previous one
            failure = write_failure(written, err)
            if latest_iteration(directory) != trainer.iteration:
                shutil.rmtree(path, ignore_errors=True)
    report(f"waiting for rank 0 to move {LATEST}")
    agreed = agree_on_failure(failure, groups.world, trainer.device)
    if agreed is not None:
        raise CheckpointWriteError(f"rank {agreed[0]}: {agreed[1]}; the newest-pointer did not move")
    return path


def latest_iteration(directory: str | os.PathLike) -> int | None:
    """The iteration ``DIR/latest_checkpointed_iteration.txt`` names, or None (no pointer, not a regular file, or not
    a number)."""
    try:
        text = read_pointer(Path(directory) / LATEST).decode("ascii").strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None


def find_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: ``directory`` itself when it is one, else the newest in it, else None.

    The pointer must be a regular file (a FIFO, a device, a symlink loop is refused, never read as "no checkpoint")
    holding an iteration number, and the iteration directory it names must lie inside ``directory`` (a symlink to
    elsewhere is refused)."""
    directory = Path(directory)
    problem = directory_problem(directory, missing_ok=True)
    if problem is not None:
        raise CheckpointError(f"checkpoint directory {directory} {problem}")
    if os.path.lexists(directory / MANIFEST):
        return directory
    foreign = describe_foreign(directory)
    if foreign is not None:
        raise CheckpointError(f"{directory} {foreign}")
    pointer = directory / LATEST
    if not os.path.lexists(pointer):
        return None
    pointer = inside(directory, LATEST, what=f"checkpoint directory {directory}", error=CheckpointError)
    raw = read_pointer(pointer, what="the pointer file", error=CheckpointError).strip()
    text = raw.decode("ascii", "replace")
    if not raw.isdigit():
        shown = repr(text[:40]) if raw.isascii() else f"the bytes {raw[:40]!r} (not text)"
        raise CheckpointError(f"the pointer file {pointer} should hold an iteration number (decimal digits), holds "
                              f"{shown}")
    path = iteration_dir(directory, int(text))
    if not os.path.lexists(path):
        raise CheckpointError(f"{pointer} names iteration {text}, but {path} does not exist")
    return inside(directory, path.name, kind="dir", what=f"{pointer} names iteration {text}", error=CheckpointError)


#: what trainer.json's layout must hold: key -> lowest value (every one an integer)
_META_LOWEST = {"iteration": 0, "tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, "global_batch_size": 1}


def read_trainer_meta(path: Path, *, within: str | os.PathLike | None = None) -> dict[str, Any]:
    """The checked ``trainer.json`` of an iteration directory: a regular file inside it, a JSON object whose layout
    (iteration, tp, pp, dp, ZeRO stage, global batch) is whole numbers in range, naming the file and key."""
    meta_path = path / TRAINER
    if not os.path.lexists(meta_path):
        raise CheckpointError(f"{path} is not a training checkpoint: no {TRAINER} (a bare ZeRO checkpoint?)")
    meta_path = inside(path, TRAINER, what=f"checkpoint {path}", error=CheckpointError, within=within)
    try:
        meta = json.loads(read_config(meta_path, error=CheckpointError).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CheckpointError(f"corrupt checkpoint {path}: {TRAINER} is not valid JSON ({err})") from None
    kinds = {"iteration": int, "tp": int, "pp": int, "dp": int, "zero_stage": int, "global_batch_size": int,
             "model": dict, "settings": dict}
    wrong = [key for key, kind in kinds.items() if not isinstance(meta, dict) or not isinstance(meta.get(key), kind)
             or isinstance(meta.get(key), bool)]
    if wrong:
        raise CheckpointError(f"corrupt checkpoint {path}: {TRAINER} lacks {', '.join(wrong)} (or holds another "
                              "type there)")
    for key, lowest in _META_LOWEST.items():
        if meta[key] < lowest:
            raise CheckpointError(f"corrupt checkpoint {path}: {meta_path} has {key}={meta[key]}; it must be an "
                                  f"integer >= {lowest}")
    if meta["zero_stage"] > 3:
        raise CheckpointError(f"corrupt checkpoint {path}: {meta_path} has zero_stage={meta['zero_stage']}; ZeRO "
                              "stages are 0 to 3")
    return meta


def check_compatible(meta: dict[str, Any], trainer, path: Path) -> None:
    """Refuse a checkpoint that cannot continue this run (deterministic: every rank reaches the same verdict)."""
    groups, s = trainer.groups, trainer.settings
    for name, mine in (("tp", groups.tp_size), ("pp", groups.pp_size)):
        if meta[name] != mine:
            raise CheckpointError(
                f"checkpoint {path} was written with {name}={meta[name]}, this run has {name}={mine}: loading into a "
                "different tp or pp is not supported (the model shards would have to be re-cut); use the same "
                f"--{name}")
    mine = trainer.config.__dict__
    if meta["model"] != mine:
        missing = object()
        diff = sorted(str(k) for k in {*meta["model"], *mine} if meta["model"].get(k, missing) != mine.get(k, missing))
        shown = "; ".join(f"{k} {_shown(meta['model'], k)} in it, {_shown(mine, k)} in this run" for k in diff[:3])
        raise CheckpointError(f"checkpoint {path} holds a different model ({shown}); a resume must build the same "
                              "model")
    for name in MUST_MATCH:
        if meta["settings"].get(name) != getattr(s, name):
            raise CheckpointError(f"checkpoint {path} was written with {name}={meta['settings'].get(name)!r}, this "
                                  f"run has {name}={getattr(s, name)!r}; a resume must keep it")
    if meta["global_batch_size"] != trainer.global_batch_size:
        raise CheckpointError(
            f"checkpoint {path} was trained with a global batch of {meta['global_batch_size']} sequences, this run "
            f"has {trainer.global_batch_size} (micro-batch size x micro-batches x dp); keep the global batch when dp "
            "changes by changing --micro-batches")


def _shown(values: dict[str, Any], key: str) -> str:
    return repr(values[key]) if key in values else "absent"


def _files_to_read(meta: dict[str, Any], groups) -> list[int]:
    """The old ranks whose files this rank needs: its own coordinate at the same dp; under a dp change the dp-rank-0
    file (stage 0, replicated states) or every old dp rank of its (tp, pp) coordinate (ZeRO, re-sharded)."""
    old = RankGrid(tp=meta["tp"], pp=meta["pp"], dp=meta["dp"])
    if meta["dp"] == groups.dp_size:
        return [old.rank(GridCoord(groups.tp_rank, groups.dp_rank, groups.pp_rank))]
    ranks = range(meta["dp"]) if meta["zero_stage"] > 0 else range(1)
    return [old.rank(GridCoord(groups.tp_rank, d, groups.pp_rank)) for d in ranks]


def _read(path: Path, manifest: dict[str, Any], rank: int, within: Path) -> dict[str, Any]:
    name = rank_file_name(rank)
    if name not in manifest["files"]:
        raise CheckpointError(f"corrupt checkpoint {path}: the manifest lists no {name}")
    payload = load_weights(verify_file(path, name, manifest["files"][name], within=within), error=CheckpointError)
    # the hash proves the file is the one that was written, not that a trainer wrote it
    extra = payload.get("extra") if isinstance(payload, dict) else None
    if not isinstance(payload, dict) or not isinstance(payload.get("optimizer"), dict) or not isinstance(extra, dict):
        raise CheckpointError(f"corrupt checkpoint {path}: {name} holds no optimizer state and trainer extra (it "
                              f"holds {_shape_of(payload)})")
    missing = [key for key in ("model", "rng", "iteration", "consumed_samples") if key not in extra]
    if missing:
        raise CheckpointError(f"corrupt checkpoint {path}: {name} lacks {', '.join(missing)}")
    for key in ("iteration", "consumed_samples"):
        if isinstance(extra[key], bool) or not isinstance(extra[key], int) or extra[key] < 0:
            raise CheckpointError(f"corrupt checkpoint {path}: {name} has {key}={extra[key]!r}; it must be an "
                                  "integer >= 0")
    return payload


def _shape_of(payload: Any) -> str:
    if isinstance(payload, dict):
        return f"a dict of {', '.join(map(repr, list(payload)[:5])) or 'nothing'}"
    return f"a {type(payload).__name__}"


def _rng_problem(saved: Any, trainer) -> str | None:
    """Why a saved random-generator state cannot be restored here (the CPU generator and the tensor-parallel
    tracker must have this run's shapes and dtypes; a CUDA state is restored only where there is one)."""
    if not isinstance(saved, dict):
        return f"its random generator state is a {type(saved).__name__}, not a dict"
    mine = _rng_state(trainer)
    return difference({key: saved.get(key) for key in ("torch", "tracker")},
                      {key: mine[key] for key in ("torch", "tracker")}, "its random generator state")


def _this_ranks_state(payloads: list[dict[str, Any]], meta: dict[str, Any], groups) -> dict[str, Any]:
    """This rank's optimizer state from the files it read: re-cut from every old dp rank's shard under ZeRO with a
    dp change, else the one file's (replicated over dp without ZeRO)."""
    states = [p["optimizer"] for p in payloads]
    if meta["dp"] != groups.dp_size and meta["zero_stage"] > 0:
        from repro.zero.reshard import reshard_states

        try:
            return reshard_states(states, new_dp_size=groups.dp_size, new_dp_rank=groups.dp_rank,
                                  stage=meta["zero_stage"])
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"its ZeRO shards cannot be re-cut for dp {groups.dp_size} ({type(err).__name__}: "
                                  f"{err})") from None
    return dict(states[0], dp_rank=groups.dp_rank, dp_size=groups.dp_size)


def load_training_checkpoint(
    directory: str | os.PathLike, trainer, *, progress: Callable[[str], None] | None = None
) -> Path | None:
    """Collective: resume ``trainer`` from the newest checkpoint under ``directory``; None when there is none.

    ``progress(phase)`` is called as each phase starts ("reading rank00001.pt", "agreeing that every rank read its
    files"): a heartbeat per file read, and what the watchdog names when the load hangs."""
    report = progress or (lambda phase: None)
    groups = trainer.groups
    report(f"finding the newest checkpoint in {directory}")
    path = find_checkpoint(directory)
    if path is None:
        return None
    manifest = read_manifest(path, within=directory)  # symlinks may stay inside the directory given, not leave it
    meta = read_trainer_meta(path, within=directory)
    check_compatible(meta, trainer, path)
    wanted = _files_to_read(meta, groups)
    failure: Exception | None = None
    payloads: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    try:
        for rank in wanted:
            report(f"reading {path.name}/{rank_file_name(rank)}")
            payloads.append(_read(path, manifest, rank, Path(directory)))
        state = _this_ranks_state(payloads, meta, groups)
        extra = payloads[0]["extra"]
        problem = fit_problem(extra["model"], state, trainer) or _rng_problem(extra["rng"], trainer)
        if problem is None and extra["iteration"] != meta["iteration"]:
            problem = (f"it was saved at iteration {extra['iteration']}, its trainer.json says "
                       f"{meta['iteration']}: they must agree")
        if problem is not None:
            files = ", ".join(rank_file_name(rank) for rank in wanted)
            raise CheckpointError(f"{files}: {problem}")  # said as "cannot resume from <path>: ..."
    except Exception as err:  # noqa: BLE001 - reported on every rank below, before any other collective
        failure = err
    # Agree before anything else talks: the lowest failing rank (or world size when none failed).
    report("agreeing that every rank read its files")
    first_bad = torch.tensor(groups.rank if failure is not None else groups.world_size, device=trainer.device)
    comm.all_reduce(first_bad, groups.world, op=torch.distributed.ReduceOp.MIN)
    bad = int(first_bad)
    if bad < groups.world_size:
        if failure is not None:
            raise CheckpointError(f"cannot resume from {path}: {failure or type(failure).__name__}") from failure
        named = path / rank_file_name(bad) if meta["dp"] == groups.dp_size else f"its files of checkpoint {path}"
        error = CheckpointError(f"rank {bad} could not load {named}; no rank resumes")
        error.follower = True  # another rank's failure: that rank reports the reason
        raise error
    extra = payloads[0]["extra"]
    if extra["model"] is not None:
        trainer.stage.load_state_dict(extra["model"])
    trainer.optimizer.load_state_dict(state)
    _set_rng_state(trainer, extra["rng"])
    trainer.iteration = int(extra["iteration"])
    trainer.consumed_samples = int(extra["consumed_samples"])
    good = meta.get("known_good")
    trainer.known_good_iteration = (good if isinstance(good, int) and not isinstance(good, bool)
                                    and 0 <= good <= trainer.iteration else None)
    return path
