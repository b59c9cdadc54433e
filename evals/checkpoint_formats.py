"""Which format a checkpoint directory is in, and loading any of them: the harness's own, repro train's, Hugging
Face, Megatron-LM.

The dispatcher lives apart from the formats (evals/checkpoints.py, hf_convert.py, megatron_checkpoint.py), which
depend on checkpoints.py's shared pieces, so that no two of these modules import each other.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from evals.checkpoints import HEADER, LoadedState, check_state, load_repro
from evals.hf_convert import load_hf
from evals.megatron_checkpoint import TRACKER, is_megatron_checkpoint, read_megatron
from repro.input_files import directory_problem
from repro.models import shard_state_dict
from repro.training.consolidate import is_training_checkpoint, load_trained_gpt


def checkpoint_format(path: str | Path) -> str:
    """"repro", "repro-train", "huggingface" or "megatron" for a checkpoint directory; ValueError naming what was
    looked for. ``repro train``'s saves come before Megatron-LM's, whose newest-pointer has the same name."""
    if not str(path).strip():
        raise ValueError(f"checkpoint {str(path)!r} is empty: give a checkpoint directory")
    path = Path(path)
    problem = directory_problem(path)
    if problem is not None:
        raise ValueError(f"checkpoint {str(path)!r} {problem}")
    # by name, not by kind: a header that is a FIFO or a symlink out is that format's reader's to refuse, in words
    if os.path.lexists(path / HEADER):
        return "repro"
    if is_training_checkpoint(path):
        return "repro-train"
    if os.path.lexists(path / "config.json"):
        return "huggingface"
    if is_megatron_checkpoint(path):
        return "megatron"
    raise ValueError(
        f"{str(path)!r} is not a checkpoint directory of a known format: a repro checkpoint has {HEADER}, one of "
        f"repro train iter_N/manifest.json and trainer.json, a Hugging Face model config.json, a Megatron-LM "
        f"checkpoint {TRACKER} or mp_rank_XX/ folders"
    )


def _load_trained(path: Path, *, expect: str) -> LoadedState:
    """A checkpoint of ``repro train`` (any tp x pp x dp layout, ZeRO or not), consolidated (a GPT)."""
    if expect != "gpt":
        raise ValueError(f"checkpoint {str(path)!r} is a GPT trained by repro train, but a {expect!r} model was "
                         "requested; evaluate it with a GPT task (lambada, wikitext)")
    trained = load_trained_gpt(path)  # CheckpointError (a ValueError) naming what is wrong
    check_state(trained.state_dict, trained.config, "gpt", f"corrupt checkpoint {trained.path}")
    return LoadedState(architecture="gpt", config=trained.config, state_dict=trained.state_dict,
                       sha256=trained.sha256, source="repro-train",
                       meta={"checkpoint": str(trained.path), **trained.meta})


def load_checkpoint(path: str | Path, *, expect: str, tp_rank: int = 0, tp_size: int = 1) -> LoadedState:
    """A repro checkpoint, a Hugging Face model directory (GPT-2 / BERT) or a Megatron-LM checkpoint directory
    (tp/pp shards in Megatron's own layout), for one tp rank."""
    path = Path(path)
    kind = checkpoint_format(path)
    if kind == "repro":
        return load_repro(path, expect=expect, tp_rank=tp_rank, tp_size=tp_size)
    if kind == "repro-train":
        loaded = _load_trained(path, expect=expect)
    elif kind == "huggingface":
        loaded = load_hf(path, expect=expect)
    else:
        loaded = read_megatron(path, expect=expect)
    state = shard_state_dict(loaded.state_dict, loaded.config, tp_rank, tp_size)
    return dataclasses.replace(loaded, state_dict=state)


class NeedsCheckpoint(ValueError):
    """A point that evaluates a real checkpoint was given none: it says which variable or param to set."""


def resolve_checkpoint(param: str | None, env: str, *, point: str, what: str, param_name: str = "checkpoint",
                       legacy_env: tuple[str, ...] = ()) -> tuple[str, str]:
    """(path, format) from the point param ``param_name`` (value ``param``), else ``$env`` (else the ``legacy_env``
    variables). :class:`NeedsCheckpoint` when none is set; ValueError naming the value when it is not a checkpoint
    directory of a known format. No rows are ever made up for a missing checkpoint."""
    import os

    sources = [(f"param {param_name}", param)] + [(f"${name}", os.environ.get(name)) for name in (env, *legacy_env)]
    for label, value in sources:
        if value:
            try:
                return value, checkpoint_format(value)
            except ValueError as err:
                raise ValueError(f"point {point!r}: {label}={value!r}: {err}") from None
    raise NeedsCheckpoint(
        f"point {point!r} needs {what}: set {env}=DIR (a Hugging Face directory, a Megatron-LM checkpoint directory "
        "with latest_checkpointed_iteration.txt and mp_rank_XX/model_optim_rng.pt shards, or a repro checkpoint), "
        f"or pass the point param {param_name!r}; nothing is downloaded and no rows are made up without it"
    )
