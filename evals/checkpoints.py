"""repro checkpoints for evaluation: consolidated or sharded by tensor-parallel rank, with a small JSON header.

Layout of a checkpoint directory::

    repro_checkpoint.json   {"format": "repro-checkpoint/1", "architecture": "gpt" | "bert" | "bert_multiple_choice",
                             "config": {...}, "tp_size": p, "files": [...], "meta": {...}}
    model.pt                the consolidated state dict (unpadded vocabulary), when tp_size == 1
    model_tp{r}of{p}.pt     rank r's shard, when saved sharded

Loading at any tp size works from either form: shards of another size are merged, then re-sharded with
:mod:`repro.models.sharding`. The checkpoint hash recorded in result rows is the sha256 over the files' bytes.
A Hugging Face directory (``config.json`` + weights) is recognised and converted by :mod:`evals.hf_convert`, a
Megatron-LM checkpoint (``latest_checkpointed_iteration.txt``, ``mp_rank_XX/model_optim_rng.pt`` shards) by
:mod:`evals.megatron_checkpoint`; :func:`checkpoint_format` tells the three apart.

Every checkpoint is untrusted input: weights load with ``torch.load(weights_only=True)`` only, the header is checked
(a JSON object; format, architecture, config, tp_size and files with their types; unknown config keys refused), the
files it names must stay inside the directory, and the tensors must be the ones the config's model has, finite.
Any refusal is one :class:`CheckpointError` sentence ``'<file>': <what is wrong>`` (a ValueError, so the CLIs print
it as one line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from repro.models import BertConfig, BertModel, GPTConfig, GPTModel, merge_state_dicts, shard_state_dict
from repro.input_files import inside, name_inside_problem, open_regular, read_config
from repro.models.sharding import split_rule
from repro.training.consolidate import config_from_dict, load_state_file
from repro.zero.checkpoint import CheckpointError

FORMAT = "repro-checkpoint/1"
HEADER = "repro_checkpoint.json"
CONFIG_CLASSES = {"gpt": GPTConfig, "bert": BertConfig, "bert_multiple_choice": BertConfig}
#: Heads a BERT checkpoint may lack (e.g. an encoder-only export); the model keeps their fresh initialisation.
OPTIONAL_BERT_HEADS = ("pooler.", "lm_head.", "binary_head.")


@dataclass(frozen=True)
class LoadedState:
    """A state dict ready for one tp rank, the config it belongs to, and where it came from."""

    architecture: str
    config: GPTConfig | BertConfig
    state_dict: dict[str, torch.Tensor]
    sha256: str
    source: str  # "repro", "repro-train", "huggingface" or "megatron"
    meta: Mapping[str, Any]


def _write_header(directory: Path, architecture: str, config, tp_size: int, files: list[str], meta) -> None:
    header = {
        "format": FORMAT, "architecture": architecture, "config": dataclasses.asdict(config),
        "tp_size": tp_size, "files": files, "meta": dict(meta or {}),
    }
    (directory / HEADER).write_text(json.dumps(header, indent=1, sort_keys=True))


def _check_architecture(architecture: str) -> None:
    if architecture not in CONFIG_CLASSES:
        raise ValueError(f"architecture {architecture!r} is not one of {sorted(CONFIG_CLASSES)}")


def save_consolidated(directory: str | Path, state_dict: Mapping[str, torch.Tensor], *, architecture: str,
                      config, meta: Mapping[str, Any] | None = None) -> Path:
    """Write one tp-independent state dict (vocabulary rows unpadded, as ``merge_state_dicts`` returns)."""
    _check_architecture(architecture)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, directory / "model.pt")
    _write_header(directory, architecture, config, 1, ["model.pt"], meta)
    return directory


def save_shard(directory: str | Path, shard: Mapping[str, torch.Tensor], *, architecture: str, config,
               tp_rank: int, tp_size: int, meta: Mapping[str, Any] | None = None) -> Path:
    """Write tensor-parallel rank ``tp_rank``'s shard; rank 0 also writes the header. Call on every tp rank."""
    _check_architecture(architecture)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"model_tp{tp_rank}of{tp_size}.pt"
    torch.save({k: v.detach().cpu().contiguous() for k, v in shard.items()}, directory / name)
    if tp_rank == 0:
        files = [f"model_tp{r}of{tp_size}.pt" for r in range(tp_size)]
        _write_header(directory, architecture, config, tp_size, files, meta)
    return directory


def read_json(path: Path) -> Any:
    """A JSON file of a checkpoint; one :class:`CheckpointError` naming it when it is not UTF-8 text or not JSON."""
    try:
        return json.loads(read_config(path, error=CheckpointError).decode("utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{str(path)!r} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    except json.JSONDecodeError as err:
        what = "is empty, not JSON" if not err.doc.strip() else f"is not valid JSON ({err})"
        raise CheckpointError(f"{str(path)!r} {what}") from None
    except OSError as err:
        raise CheckpointError(f"{str(path)!r} cannot be read: {err.strerror or err}") from None
    except RecursionError:
        raise CheckpointError(f"{str(path)!r} nests its JSON too deeply to read") from None


def inside_name_problem(name: Any) -> str | None:
    """Why ``name``, a file name from a header or an index, is not a relative path inside its directory; or None
    (:func:`repro.input_files.name_inside_problem`)."""
    problem = name_inside_problem(name)
    return None if problem is None else f"entry {problem}"


def _header_problem(header: Any) -> str | None:
    """What is wrong with a parsed header (its shape and types), or None."""
    if not isinstance(header, dict):
        return f"holds a JSON {type(header).__name__}, not an object"
    if header.get("format") != FORMAT:
        return f"has format {header.get('format')!r}, expected {FORMAT!r}"
    kinds = {"architecture": (str, "a string"), "config": (dict, "a JSON object"), "tp_size": (int, "an integer"),
             "files": (list, "a non-empty list of file names")}
    for key, (kind, words) in kinds.items():
        if key not in header:
            return f"lacks the key {key!r}"
        if not isinstance(header[key], kind) or isinstance(header[key], bool):
            return f"{key}={header[key]!r} must be {words}"
    if header["architecture"] not in CONFIG_CLASSES:
        return f"architecture {header['architecture']!r} is not one of {sorted(CONFIG_CLASSES)}"
    if header["tp_size"] < 1:
        return f"tp_size={header['tp_size']} must be >= 1"
    if not header["files"]:
        return "files=[] must be a non-empty list of file names"
    if len(header["files"]) not in (1, header["tp_size"]):
        return f"lists {len(header['files'])} files for tp_size={header['tp_size']} (one, or one per rank)"
    for name in header["files"]:
        problem = inside_name_problem(name)
        if problem is not None:
            return f"files: {problem}"
    if not isinstance(header.get("meta", {}), dict):
        return f"meta={header['meta']!r} must be a JSON object"
    return None


def read_header(directory: str | Path) -> dict[str, Any]:
    """The checked header of a repro checkpoint (see :func:`_header_problem`); :class:`CheckpointError` naming it."""
    directory = Path(directory)
    path = directory / HEADER
    if not os.path.lexists(path):
        raise CheckpointError(f"{str(directory)!r} is not a repro checkpoint: {HEADER} is missing")
    header = read_json(inside(directory, HEADER, error=CheckpointError))
    problem = _header_problem(header)
    if problem is not None:
        raise CheckpointError(f"{str(path)!r} {problem}")
    return header


def expected_shapes(config, architecture: str, tp_rank: int = 0,
                    tp_size: int | None = None) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of ``architecture``'s model at ``config``: tensor-parallel rank ``tp_rank`` of
    ``tp_size``, or the consolidated form (``tp_size`` None; vocabulary rows then checked apart). Built on the meta
    device: nothing is allocated."""
    with torch.device("meta"):
        model = GPTModel(config) if architecture == "gpt" else BertModel(config)
    full = model.state_dict()
    if tp_size is not None:
        full = shard_state_dict(full, config, tp_rank, tp_size)
    shapes = {name: tuple(t.shape) for name, t in full.items()}
    if architecture == "bert_multiple_choice":
        shapes = {f"bert.{name}": shape for name, shape in shapes.items()}
        shapes.update({"head.weight": (1, config.hidden_size), "head.bias": (1,)})
    return shapes


def check_state(state: Mapping[str, torch.Tensor], config, architecture: str, where: str, *, tp_rank: int = 0,
                tp_size: int | None = None) -> None:
    """The tensors of ``state`` are those of ``architecture``'s model at ``config`` (see :func:`expected_shapes`),
    each finite; else a :class:`CheckpointError` starting with ``where`` and naming the first tensor that is
    missing, unexpected, mis-shaped or not finite. A BERT may lack its heads (pooler, LM, NSP)."""
    try:
        expected = expected_shapes(config, architecture, tp_rank, tp_size)
    except ValueError as err:  # the config does not split over the saved tp size
        raise CheckpointError(f"{where}: {err}") from None
    optional = tuple(f"{'bert.' if architecture == 'bert_multiple_choice' else ''}{p}" for p in OPTIONAL_BERT_HEADS)
    prefix = f"{where}: the checkpoint does not match its config"
    for name in expected:
        if name not in state and not (architecture != "gpt" and name.startswith(optional)):
            raise CheckpointError(f"{prefix}: tensor {name!r} is missing")
    for name, tensor in state.items():
        if name not in expected:
            raise CheckpointError(f"{prefix}: tensor {name!r} is unexpected")
        shape, want = tuple(tensor.shape), expected[name]
        vocab_rows = tp_size is None and split_rule(name) == ("vocab", 0)
        fits = (shape[1:] == want[1:] and shape[0] >= config.vocab_size) if vocab_rows and shape else shape == want
        if not fits:
            need = (f"({', '.join([f'{config.vocab_size} or more', *map(str, want[1:])])})" if vocab_rows
                    else str(want))
            raise CheckpointError(f"{prefix}: tensor {name!r} has shape {shape}, the config needs {need}")
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            raise CheckpointError(f"{where}: tensor {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}; a "
                                  "model's weights are floating point")
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{where}: tensor {name!r} holds non-finite values (nan or inf)")


def files_sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open_regular(path, error=CheckpointError) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def load_repro(directory: str | Path, *, expect: str, tp_rank: int = 0, tp_size: int = 1) -> LoadedState:
    """Load a repro checkpoint for rank ``tp_rank`` of ``tp_size``; ``expect`` is the architecture the caller
    builds (a checkpoint of another architecture is refused)."""
    directory = Path(directory)
    header = read_header(directory)
    if header["architecture"] != expect:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} holds a {header['architecture']!r} model, but a {expect!r} model was "
            "requested; evaluate it with the matching task"
        )
    config = config_from_dict(CONFIG_CLASSES[expect], header["config"], repr(str(directory / HEADER)))
    paths = [inside(directory, f, what=repr(str(directory / HEADER)), error=CheckpointError, missing_ok=True)
             for f in header["files"]]
    missing = [str(p) for p in paths if not os.path.lexists(p)]
    if missing:
        raise CheckpointError(f"checkpoint {str(directory)!r} is missing files {missing}")
    states = [load_state_file(p) for p in paths]
    saved_tp = header["tp_size"] if len(states) > 1 else None
    for rank, (path, shard) in enumerate(zip(paths, states)):
        check_state(shard, config, expect, f"{str(path)!r}", tp_rank=rank, tp_size=saved_tp)
    if saved_tp == tp_size:
        state = states[tp_rank]
    else:
        full = states[0] if len(states) == 1 else merge_state_dicts(states, config)
        state = shard_state_dict(full, config, tp_rank, tp_size)  # also pads vocabulary rows for this tp
    return LoadedState(architecture=expect, config=config, state_dict=state, sha256=files_sha256(paths),
                       source="repro", meta=header.get("meta", {}))


FORMATS = ("repro", "repro-train", "huggingface", "megatron")
#: The variable the paper-scale evaluation points read a GPT checkpoint path from (any of the three formats).
CHECKPOINT_ENV = "REPRO_EVAL_CHECKPOINT"
#: The same for the pretrained BERT that RACE finetuning starts from.
BERT_CHECKPOINT_ENV = "REPRO_EVAL_BERT_CHECKPOINT"
