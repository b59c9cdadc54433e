"""One GPT state dict from a checkpoint of ``repro train``, whatever its layout: tp x pp shards, ZeRO or not.

A checkpoint (:mod:`repro.training.checkpoint`) holds one file per rank. With ``zero_stage=0`` the dp-rank-0 file of
each (tp, pp) coordinate carries that pipeline stage's tensor-parallel shard (``extra["model"]``, the names a
:func:`repro.pipeline.stage.cut_to_stage` stage has); under ZeRO the weights are the fp32 masters in the optimizer
states, cut over dp, and :func:`repro.zero.checkpoint.consolidate_checkpoint` puts them back together per
model-parallel rank. Either way, the tp shards of a stage are merged (:func:`repro.models.sharding.merge_state_dicts`, the inverse of the
sharding the trainer loaded), the stage's local layer numbers become global again (:func:`repro.pipeline.partition.
stage_layers`), and the last stage's copy of the tied word embedding is dropped: the result has the names of a
consolidated GPT (``ReferenceGPT``), which the evaluation harness and the Hugging Face export read. Nothing is
unpickled beyond tensors (``torch.load(weights_only=True)``), and every file is checked against the manifest.

On the command line (``repro consolidate CKPT OUT.pt``, = ``python -m repro.training.consolidate``) the result is
one file, ``{"config": GPTConfig's fields, "model": the state dict, "meta": where it came from}``, that
``torch.load(OUT, weights_only=True)`` reads back and ``ReferenceGPT(GPTConfig(**d["config"]))`` loads; the
evaluation harness and ``repro export-hf`` need no such step (they read the checkpoint as it is).

A checkpoint is untrusted input: :func:`load_state_file` and :func:`config_from_dict` (shared with the evaluation
harness's readers) turn a file that is not a weights file, or a config that is not one, into one
:class:`CheckpointError` sentence naming the file, never the reader's own exception.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from repro.dist.groups import GridCoord, RankGrid
from repro.models.config import GPTConfig
from repro.models.sharding import merge_state_dicts
from repro.pipeline.partition import stage_layers
from repro.training.checkpoint import find_checkpoint, read_trainer_meta
from repro.training.checkpoint_fit import non_finite
from repro.zero.checkpoint import CheckpointError, consolidate_checkpoint, verify_checkpoint
from repro.zero.weights_file import load_weights, torch_load_reason

#: the last stage's copy of the word embedding (pp > 1): equal to the first stage's, kept once
_OUTPUT_COPY = "output_word_embeddings."
#: the JSON types a config field's annotation allows (bool is refused where an int or a float is meant)
_FIELD_KINDS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "int | None": (int, type(None)),
                "float | None": (int, float, type(None))}


def load_state_file(path: Path) -> dict[str, torch.Tensor]:
    """A file of named tensors (a state dict) read by :func:`load_weights`; another object is refused, named."""
    state = load_weights(path, error=CheckpointError)
    if not isinstance(state, dict):
        raise CheckpointError(f"{str(path)!r} holds a {type(state).__name__}, not a dict of named tensors")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{str(path)!r}: entry {name!r} is a {type(value).__name__}, not a named tensor")
    return state


def config_from_dict(cls: type, values: Any, where: str) -> Any:
    """``cls(**values)`` for a model config read from a file: ``values`` must be an object with every required
    field, no unknown one, each of its annotated type; any refusal is a :class:`CheckpointError` starting with
    ``where`` (the file) and naming the key."""
    if not isinstance(values, Mapping):
        raise CheckpointError(f"{where}: the model config is a {type(values).__name__}, not a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in values if k not in fields)
    if unknown:
        raise CheckpointError(f"{where}: unknown model config key(s) {unknown}; a {cls.__name__} has no such field")
    missing = [name for name, f in fields.items() if name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise CheckpointError(f"{where}: the model config lacks {missing}")
    for name, value in values.items():
        kinds = _FIELD_KINDS.get(str(fields[name].type))
        if kinds and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise CheckpointError(f"{where}: model config {name}={value!r} must be of type {fields[name].type}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: model config: {err}") from None


@dataclass
class TrainedGPT:
    """A checkpoint of ``repro train`` as one model: its config, consolidated fp32 weights, and where it came from."""

    path: Path
    config: GPTConfig
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""


def is_training_checkpoint(directory: str | os.PathLike) -> bool:
    """A checkpoint ``repro train`` wrote: an ``iter_N`` directory (manifest and trainer.json) or a save directory
    whose newest-pointer names one."""
    path = Path(directory)
    if os.path.lexists(path / "manifest.json") and os.path.lexists(path / "trainer.json"):
        return True
    if not os.path.lexists(path / "latest_checkpointed_iteration.txt") or not any(
            os.path.lexists(folder / "manifest.json") for folder in path.glob("iter_*")):
        return False  # no pointer, or Megatron-LM's (same name) without repro train's manifests
    try:
        found = find_checkpoint(path)
    except (CheckpointError, OSError):
        return True  # its pointer or iteration is broken: repro train's reader says how, in one line
    return found is not None and os.path.lexists(found / "trainer.json")


def _stage_names(state: dict[str, torch.Tensor], layers: range) -> dict[str, torch.Tensor]:
    """A stage's (merged) state with global layer numbers and without the tied copy of the word embedding."""
    out = {}
    for name, tensor in state.items():
        if name.startswith(_OUTPUT_COPY):
            continue
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            name = f"layers.{layers.start + int(index)}.{rest}"
        out[name] = tensor
    return out


def load_trained_gpt(directory: str | os.PathLike) -> TrainedGPT:
    """The newest checkpoint under ``directory`` (or ``directory`` itself) as one consolidated GPT."""
    path = find_checkpoint(directory)
    if path is None:
        raise CheckpointError(f"{directory} holds no checkpoint of repro train (no {Path(directory).name}/"
                              "latest_checkpointed_iteration.txt, no manifest.json)")
    manifest = verify_checkpoint(path, within=directory)  # every file against its size and sha256, none outside
    meta = read_trainer_meta(path, within=directory)
    config = config_from_dict(GPTConfig, meta["model"], f"corrupt checkpoint {path}: trainer.json")
    tp, pp, dp = meta["tp"], meta["pp"], meta["dp"]
    if min(tp, pp, dp) < 1 or meta["zero_stage"] < 0:
        raise CheckpointError(f"corrupt checkpoint {path}: trainer.json has tp={tp}, pp={pp}, dp={dp}, zero_stage="
                              f"{meta['zero_stage']}; each size must be >= 1 and the stage >= 0")
    grid = RankGrid(tp=tp, pp=pp, dp=dp)
    try:
        by_mp = _model_parallel_states(path, manifest, meta["zero_stage"], grid, Path(directory))
        full: dict[str, torch.Tensor] = {}
        for pp_rank in range(pp):
            shards = [by_mp[pp_rank * tp + tp_rank] for tp_rank in range(tp)]
            merged = merge_state_dicts(shards, config) if tp > 1 else dict(shards[0])
            full.update(_stage_names(merged, stage_layers(config.num_layers, pp, pp_rank)))
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError, EOFError,
            pickle.UnpicklingError) as err:  # a shard that does not fit the others or trainer.json
        raise CheckpointError(f"corrupt checkpoint {path}: its model shards do not fit trainer.json (tp={tp}, "
                              f"pp={pp}): {type(err).__name__}: {torch_load_reason(err)}") from None
    for name, tensor in full.items():  # repro train saves fp32 weights: anything else was put there by another hand
        if tensor.dtype != torch.float32:
            raise CheckpointError(f"corrupt checkpoint {path}: tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')}"
                                  "; repro train saves its weights in float32")
    digest = ",".join(f"{name}:{entry['sha256'][:16]}" for name, entry in sorted(manifest["files"].items()))
    return TrainedGPT(path=path, config=config, state_dict={k: v.float() for k, v in full.items()},
                      meta={"iteration": meta["iteration"], "tp": tp, "pp": pp, "dp": dp,
                            "zero_stage": meta["zero_stage"], "consumed_samples": meta.get("consumed_samples")},
                      sha256=digest)


def _model_parallel_states(path: Path, manifest: dict[str, Any], zero_stage: int,
                           grid: RankGrid, within: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Each model-parallel rank's (tp shard of a stage's) weights: the fp32 masters under ZeRO, else the dp-rank-0
    file's ``extra["model"]``; a file the manifest does not list, or that holds no model state, is refused."""
    if zero_stage > 0:
        return consolidate_checkpoint(path, within=within)  # fp32 masters, per model-parallel rank
    by_mp = {}
    for pp_rank in range(grid.pp):
        for tp_rank in range(grid.tp):
            name = f"rank{grid.rank(GridCoord(tp_rank, 0, pp_rank)):05d}.pt"
            if name not in manifest["files"]:
                raise CheckpointError(f"corrupt checkpoint {path}: trainer.json says tp={grid.tp}, pp={grid.pp}, "
                                      f"dp={grid.dp}, but the manifest lists no {name}")
            try:
                payload = load_weights(path / name, error=CheckpointError)
            except CheckpointError as err:
                raise CheckpointError(f"corrupt checkpoint {path}: {err}") from None
            extra = payload.get("extra") if isinstance(payload, dict) else None
            model = extra.get("model") if isinstance(extra, dict) else None
            if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
                raise CheckpointError(f"corrupt checkpoint {path}: {name} holds no model state")
            problem = non_finite(model, f"{name}: tensor")  # named with its own rank file
            if problem is not None:
                raise CheckpointError(f"corrupt checkpoint {path}: {problem}")
            by_mp[pp_rank * grid.tp + tp_rank] = model
    return by_mp


def main(argv: list[str] | None = None) -> int:
    """``repro consolidate CKPT OUT.pt``: the newest checkpoint under CKPT as one file (module docstring)."""
    import io
    import sys

    from repro.atomic_files import atomic_write
    from repro.cliargs import OneLineParser
    from repro.paths import name_problem

    parser = OneLineParser(prog="repro consolidate", description="One GPT state dict and its config from a "
                           "checkpoint of repro train, whatever its tp x pp x dp layout and ZeRO stage (= python -m "
                           "repro.training.consolidate). Read it back with torch.load(OUT, weights_only=True).")
    parser.add_argument("checkpoint", help="repro train's --save directory (its newest checkpoint) or one iter_N "
                        "inside it")
    parser.add_argument("out", help="the file to write (replaced atomically): {'config', 'model', 'meta'}")
    args = parser.parse_args(argv)
    problem = name_problem(args.out) or ("is a directory; it must name a file" if Path(args.out).is_dir() else None)
    if problem is not None:
        print(f"repro consolidate: error: OUT {args.out!r} {problem}", file=sys.stderr)
        return 2
    try:
        trained = load_trained_gpt(args.checkpoint)
        buffer = io.BytesIO()
        torch.save({"config": dataclasses.asdict(trained.config), "model": trained.state_dict,
                    "meta": {**trained.meta, "source": str(trained.path), "sha256": trained.sha256}}, buffer)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(args.out), [buffer.getvalue()])
    except (CheckpointError, OSError) as err:
        print(f"repro consolidate: error: {err}", file=sys.stderr)
        return 2
    meta, config = trained.meta, trained.config
    print(f"wrote {args.out}: the {config.num_layers}-layer GPT (hidden {config.hidden_size}, vocabulary "
          f"{config.vocab_size}) of {trained.path}, iteration {meta['iteration']}, trained at tp {meta['tp']} x pp "
          f"{meta['pp']} x dp {meta['dp']}, ZeRO stage {meta['zero_stage']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
