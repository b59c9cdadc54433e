"""Megatron-LM checkpoints read in their own format (tensor- and pipeline-parallel shards), as repro models.

Layout (Megatron-LM's ``checkpointing.py``)::

    DIR/latest_checkpointed_iteration.txt      "release" or an iteration number (> 0)
    DIR/release/ or DIR/iter_0000123/          the checkpoint of that iteration
        mp_rank_00/model_optim_rng.pt          tp rank 0 (no pipeline parallelism)
        mp_rank_01_002/model_optim_rng.pt      tp rank 1, pp rank 2 (with pipeline parallelism)

Each ``model_optim_rng.pt`` holds ``{"model": {"language_model": {...}}, "args": argparse.Namespace,
"checkpoint_version": float, "iteration": int, ...}``. The path given may be ``DIR`` or the iteration directory.

Untrusted input: every file is read with ``torch.load(weights_only=True)``; the only class allowed beyond tensors
and plain containers is ``argparse.Namespace`` (Megatron's ``args``). A file that pickles anything else (numpy RNG
state, optimizer or loss-scaler objects, ...) is refused with the names of the classes it would construct; nothing
is unpickled blindly.

What is converted (the "legacy" GPT/BERT model of Megatron-LM, 2019 to the Megatron-Core switch):

* names: ``language_model.embedding.{word,position,tokentype}_embeddings``, the layers under ``transformer``
  (2019/2020) or ``encoder`` (later), ``attention.*`` or ``self_attention.*``, ``mlp.dense_h_to_4h`` /
  ``mlp.dense_4h_to_h``, ``final_layernorm``; BERT's ``pooler``, ``lm_head`` and ``binary_head``;
* tensor parallelism: column-parallel (QKV, h->4h) shards are concatenated on dim 0, row-parallel (attention
  output, 4h->h) on dim 1 with the bias of rank 0, the word embedding on dim 0 with Megatron's padding rows dropped
  (repro re-pads for the tp size it runs at); everything else is taken from rank 0;
* the fused QKV rows: per tp shard, ``checkpoint_version`` 0 stores them (q|k|v, head, head_dim), 1.0 stores
  (head, head_dim, q|k|v), >= 2.0 stores (head, q|k|v, head_dim), which is repro's order;
* pipeline stages: layers are numbered from 0 within each stage; they are renumbered in stage order. The last
  stage's ``word_embeddings_for_head`` (a tied copy of the input embedding) is ignored.

The config comes from ``args`` (num_layers, hidden_size, num_attention_heads, max_position_embeddings,
ffn_hidden_size, layernorm_epsilon) and is checked against the tensor shapes; without ``args`` (some old releases)
everything but the number of heads is read off the shapes and the heads must be given (``overrides``). The real
vocabulary size: 50,257 for ``tokenizer_type`` GPT2BPETokenizer (also with no tokenizer recorded), 30,522 / 28,996
for BertWordPieceLowerCase / BertWordPieceCase (the standard vocabulary files), each only when the embedding's
padded rows agree with it; else ``overrides["vocab_size"]``. GELU: the tanh approximation (Megatron's fused
bias-GeLU and ``--openai-gelu``), erf when the checkpoint was trained with ``--no-bias-gelu-fusion`` (or
``--onnx-safe``) and without ``--openai-gelu``. Variants repro's models do not implement (rotary/alibi positions,
SwiGLU, RMSNorm, untied output layer, linear layers without bias, grouped-query attention, MoE, post-LN residual,
virtual pipeline stages, Megatron-Core naming) are refused, naming the argument or key.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from evals.checkpoints import LoadedState, check_state, files_sha256
from evals.megatron_files import (  # noqa: F401 - re-exported: the format's files and errors
    RANK_DIR, SAFE_GLOBALS, SHARD_FILE, TRACKER, MegatronCheckpointError, confined, first_file, subdirs,
    is_megatron_checkpoint, iteration_dir,
    load_file, shard_files,
)
from repro.models import BertConfig, GPTConfig, merge_state_dicts
from repro.tensor_parallel.vocab import pad_vocab_size

#: Real vocabulary sizes of Megatron's tokenizers with their standard vocabulary files (GPT-2 BPE; BERT-large
#: uncased / cased WordPiece), used when the embedding's padded rows agree with that size.
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "BertWordPieceLowerCase": 30522, "BertWordPieceCase": 28996}
GPT2_VOCAB = 50257

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
# Megatron's per-layer names -> repro's (the attention block was ``attention`` until 2021, then ``self_attention``).
_LAYER_NAMES = {
    "input_layernorm": "input_layernorm",
    "attention.query_key_value": "attention.qkv",
    "self_attention.query_key_value": "attention.qkv",
    "attention.dense": "attention.dense",
    "self_attention.dense": "attention.dense",
    "post_attention_layernorm": "post_attention_layernorm",
    "mlp.dense_h_to_4h": "mlp.fc1",
    "mlp.dense_4h_to_h": "mlp.fc2",
}
_EMBEDDINGS = {
    "word_embeddings.weight": "embedding.word_embeddings.weight",
    "position_embeddings.weight": "embedding.position_embeddings.weight",
    "tokentype_embeddings.weight": "embedding.tokentype_embeddings.weight",
}
# BERT heads outside ``language_model`` (and the pooler inside it).
_BERT_HEADS = {
    "pooler.dense.weight": "pooler.weight", "pooler.dense.bias": "pooler.bias",
    "lm_head.dense.weight": "lm_head.dense.weight", "lm_head.dense.bias": "lm_head.dense.bias",
    "lm_head.layernorm.weight": "lm_head.layernorm.weight", "lm_head.layernorm.bias": "lm_head.layernorm.bias",
    "lm_head.bias": "lm_head.bias", "binary_head.weight": "binary_head.weight", "binary_head.bias": "binary_head.bias",
}
# args that select model variants repro does not implement: (name, value that is fine, what it means).
_UNSUPPORTED_ARGS = (
    ("apply_residual_connection_post_layernorm", False, "the residual taken after the layer norm"),
    ("untie_embeddings_and_output_weights", False, "an output layer separate from the input embedding"),
    ("swiglu", False, "SwiGLU MLPs"),
    ("squared_relu", False, "squared-ReLU MLPs"),
    ("group_query_attention", False, "grouped-query attention"),
    ("add_bias_linear", True, "linear layers with biases"),
    ("use_rotary_position_embeddings", False, "rotary position embeddings"),
    ("num_experts", None, "mixture-of-experts MLPs"),
    ("virtual_pipeline_model_parallel_size", None, "interleaved (virtual) pipeline stages"),
)


def _parallel_sizes(directory: Path, args: argparse.Namespace | None) -> tuple[int, int]:
    if args is not None:
        tp = getattr(args, "tensor_model_parallel_size", None) or getattr(args, "model_parallel_size", None)
        pp = getattr(args, "pipeline_model_parallel_size", None) or 1
        if tp:
            return int(tp), int(pp)
    ranks = [m.groups() for m in (RANK_DIR.match(p.name) for p in subdirs(directory)) if m]
    tp = 1 + max(int(t) for t, _ in ranks)
    pp = 1 + max((int(p) for _, p in ranks if p is not None), default=0)
    return tp, pp


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    flat: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        elif isinstance(value, torch.Tensor):
            flat[name] = value
        elif value is None or name.endswith("_extra_state"):
            continue
        else:
            raise MegatronCheckpointError(f"model entry {name!r} is a {type(value).__name__}, not a tensor")
    return flat


def _rename(flat: Mapping[str, torch.Tensor], where: Path) -> tuple[dict[str, torch.Tensor], dict[int, dict]]:
    """Megatron names -> repro names; layers are returned separately, keyed by their stage-local index."""
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in flat.items():
        key = name.removeprefix("language_model.")
        if name == "word_embeddings_for_head.weight":
            continue  # the last pipeline stage's tied copy of the input embedding
        if key.startswith("embedding."):
            key = key.removeprefix("embedding.")
        if key in _EMBEDDINGS:
            out[_EMBEDDINGS[key]] = tensor
            continue
        if key in _BERT_HEADS:
            out[_BERT_HEADS[key]] = tensor
            continue
        for body in ("transformer.", "encoder."):
            if key.startswith(body):
                key = key.removeprefix(body)
                break
        else:
            raise _unknown(name, where)
        if key.startswith("final_layernorm."):
            out[key] = tensor
            continue
        match = _LAYER.match(key)
        if not match:
            raise _unknown(name, where)
        index, rest = int(match.group(1)), match.group(2)
        module, _, part = rest.rpartition(".")
        if module not in _LAYER_NAMES or part not in ("weight", "bias"):
            raise _unknown(name, where)
        layers.setdefault(index, {})[f"{_LAYER_NAMES[module]}.{part}"] = tensor
    return out, layers


def _unknown(name: str, where: Path) -> MegatronCheckpointError:
    hint = (" (Megatron-Core naming: convert it to the legacy format with Megatron's tools/checkpoint first)"
            if name.startswith(("decoder.", "embedding.word_embeddings", "output_layer")) else "")
    return MegatronCheckpointError(f"{str(where)!r}: model entry {name!r} is not part of the legacy Megatron GPT/BERT "
                                   f"layout this reader converts{hint}")


def _qkv_to_repro(tensor: torch.Tensor, heads: int, version: float, where: str) -> torch.Tensor:
    """One tp shard's fused QKV rows -> (head, q|k|v, head_dim); weights [3*h_local, h] and biases [3*h_local]."""
    rest = tensor.shape[1:]
    if tensor.shape[0] % (3 * heads) != 0:
        raise MegatronCheckpointError(f"{where}: {tensor.shape[0]} QKV rows do not split into 3 x {heads} heads")
    if version >= 2.0:
        return tensor
    if version == 0:
        grid = tensor.reshape(3, heads, -1, *rest).transpose(0, 1)
    elif version == 1.0:
        grid = tensor.reshape(heads, -1, 3, *rest).transpose(1, 2)
    else:
        raise MegatronCheckpointError(f"{where}: checkpoint_version={version!r} is not one of 0, 1.0 or >= 2.0")
    return grid.reshape(tensor.shape).contiguous()


def _arg(args: argparse.Namespace | None, name: str, default: Any = None) -> Any:
    return getattr(args, name, default) if args is not None else default


def _check_variants(args: argparse.Namespace | None, where: Path) -> None:
    if args is None:
        return
    for name, fine, meaning in _UNSUPPORTED_ARGS:
        value = getattr(args, name, fine)
        if value != fine and not (fine is None and value in (0, 1)):
            raise MegatronCheckpointError(f"{str(where)!r}: args.{name}={value!r} selects {meaning}, which repro's "
                                          f"models do not implement (supported: {fine!r})")
    position = str(getattr(args, "position_embedding_type", "learned_absolute"))
    if position.split(".")[-1] not in ("learned_absolute", "absolute"):
        raise MegatronCheckpointError(f"{str(where)!r}: args.position_embedding_type={position!r}; only learned "
                                      "absolute position embeddings are supported")
    norm = getattr(args, "normalization", "LayerNorm")
    if norm != "LayerNorm":
        raise MegatronCheckpointError(f"{str(where)!r}: args.normalization={norm!r}; only LayerNorm is supported")
    groups = getattr(args, "num_query_groups", None)
    heads = getattr(args, "num_attention_heads", None)
    if groups not in (None, heads) and getattr(args, "group_query_attention", False):
        raise MegatronCheckpointError(f"{str(where)!r}: args.num_query_groups={groups!r} (grouped-query attention) "
                                      "is not supported")


def _gelu(args: argparse.Namespace | None) -> str:
    if _arg(args, "openai_gelu", False):
        return "tanh"
    if _arg(args, "onnx_safe", False) or not _arg(args, "bias_gelu_fusion", True):
        return "none"
    return "tanh"


def _vocab_size(args, padded_rows: int, tp: int, overrides: Mapping[str, Any], where: Path) -> int:
    if "vocab_size" in overrides:
        return int(overrides["vocab_size"])
    tokenizer = _arg(args, "tokenizer_type")
    divisible = _arg(args, "make_vocab_size_divisible_by", 128)
    guess = TOKENIZER_VOCAB.get(tokenizer) if tokenizer is not None else GPT2_VOCAB
    if guess is not None and padded_rows == pad_vocab_size(guess, tp, divisible):
        return guess
    raise MegatronCheckpointError(
        f"{str(where)!r}: the real vocabulary size of tokenizer_type={tokenizer!r} is not recorded (the embedding "
        f"has {padded_rows} padded rows); pass overrides={{'vocab_size': N}}"
    )


def read_megatron(path: str | Path, *, expect: str | None = "gpt",
                  overrides: Mapping[str, Any] | None = None) -> LoadedState:
    """A Megatron-LM checkpoint directory as one consolidated repro state dict (unpadded vocabulary).

    ``expect``: "gpt" or "bert" (the model the caller builds; the other is refused), or None for whichever the
    tensors hold (a BERT has a pooler or an LM head); ``overrides``: config values the checkpoint does not record
    (``num_attention_heads`` without ``args``, ``vocab_size`` for an unknown tokenizer).
    """
    if expect not in ("gpt", "bert", None):
        raise MegatronCheckpointError(f"Megatron checkpoints convert to 'gpt' or 'bert' models, not {expect!r}")
    overrides = dict(overrides or {})
    directory = iteration_dir(path)
    first = load_file(confined(path, first_file(directory)))
    args = first.get("args")
    if args is not None and not isinstance(args, argparse.Namespace):
        raise MegatronCheckpointError(f"{str(directory)!r}: 'args' is a {type(args).__name__}, not a Namespace")
    version = float(first.get("checkpoint_version", 0))
    _check_variants(args, directory)
    tp, pp = _parallel_sizes(directory, args)
    files = [[confined(path, file) for file in row] for row in shard_files(directory, tp, pp)]
    missing = [str(f) for row in files for f in row if not f.is_file()]
    if missing:
        raise MegatronCheckpointError(
            f"Megatron checkpoint {str(directory)!r} (tp={tp}, pp={pp}) is missing shard file(s) {missing}"
        )
    heads = overrides.get("num_attention_heads") or _arg(args, "num_attention_heads")
    if not heads:
        raise MegatronCheckpointError(f"{str(directory)!r} records no args; the number of attention heads cannot be "
                                      "read off the tensor shapes: pass overrides={'num_attention_heads': N}")
    heads = int(heads)
    if heads % tp:
        raise MegatronCheckpointError(f"{str(directory)!r}: num_attention_heads={heads} is not divisible by tp={tp}")
    shards: list[dict[str, torch.Tensor]] = []
    for t in range(tp):
        merged: dict[str, torch.Tensor] = {}
        offset = 0
        for p in range(pp):
            state = first if (t, p) == (0, 0) else load_file(files[t][p])
            if (t, p) != (0, 0) and float(state.get("checkpoint_version", 0)) != version:
                raise MegatronCheckpointError(f"{str(files[t][p])!r} has checkpoint_version "
                                              f"{state.get('checkpoint_version')!r}, rank 0 has {version!r}")
            if "model" not in state:
                extra = " (virtual pipeline stages: model0, model1, ...)" if "model0" in state else ""
                raise MegatronCheckpointError(f"{str(files[t][p])!r} has no 'model' entry{extra}; keys: "
                                              f"{sorted(state)[:10]}")
            flat = _flatten(state["model"])
            for name, tensor in flat.items():  # named with its own shard file, not the checkpoint as a whole
                if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
                    raise MegatronCheckpointError(f"{str(files[t][p])!r}: tensor {name!r} holds non-finite values "
                                                  "(nan or inf)")
            rest, layers = _rename(flat, files[t][p])
            for key in rest:
                if key in merged:
                    raise MegatronCheckpointError(f"{str(files[t][p])!r}: {key!r} appears in two pipeline stages")
            merged.update(rest)
            for local in sorted(layers):
                for name, tensor in layers[local].items():
                    if name.startswith("attention.qkv."):
                        tensor = _qkv_to_repro(tensor, heads // tp, version, f"{files[t][p]}: layers.{local}.{name}")
                    merged[f"layers.{offset + local}.{name}"] = tensor
            offset += len(layers)
        shards.append(merged)
    if expect is None:
        expect = "bert" if "lm_head.bias" in shards[0] or "pooler.weight" in shards[0] else "gpt"
    config = _config(expect, args, shards[0], tp, heads, overrides, directory)
    names = set(shards[0])
    for t, shard in enumerate(shards[1:], start=1):
        if set(shard) != names:
            diff = sorted(names.symmetric_difference(shard))[:5]
            raise MegatronCheckpointError(f"tp shard {t} of {str(directory)!r} holds other tensors than shard 0: "
                                          f"{diff}")
    full = merge_state_dicts(shards, config)
    _check_shapes(full, config, directory)
    check_state(full, config, expect, repr(str(directory)))
    meta = {"megatron_dir": str(directory), "checkpoint_version": version, "iteration": first.get("iteration"),
            "megatron_tp": tp, "megatron_pp": pp}
    return LoadedState(architecture=expect, config=config, state_dict=full,
                       sha256=files_sha256([f for row in files for f in row]), source="megatron", meta=meta)


def _config(expect: str, args, shard0: Mapping[str, torch.Tensor], tp: int, heads: int,
            overrides: Mapping[str, Any], where: Path) -> GPTConfig | BertConfig:
    for key in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight", "final_layernorm.weight"):
        if key not in shard0:
            theirs = key.replace("embedding.", "language_model.embedding.")
            raise MegatronCheckpointError(f"{str(where)!r}: no {theirs} in the checkpoint")
    word = shard0["embedding.word_embeddings.weight"]
    hidden = word.shape[1]
    layers = 1 + max((int(k.split(".")[1]) for k in shard0 if k.startswith("layers.")), default=-1)
    ffn = shard0["layers.0.mlp.fc1.weight"].shape[0] * tp if layers else 4 * hidden
    values = {
        "vocab_size": _vocab_size(args, word.shape[0] * tp, tp, overrides, where),
        "hidden_size": hidden, "num_layers": layers, "num_attention_heads": heads,
        "max_position_embeddings": shard0["embedding.position_embeddings.weight"].shape[0],
        "ffn_hidden_size": None if ffn == 4 * hidden else ffn,
        "layernorm_epsilon": float(_arg(args, "layernorm_epsilon", 1e-5)),
        "gelu_approximate": _gelu(args), "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "make_vocab_size_divisible_by": int(_arg(args, "make_vocab_size_divisible_by", 128)),
    }
    recorded = {"hidden_size": hidden, "num_layers": layers,
                "max_position_embeddings": values["max_position_embeddings"], "ffn_hidden_size": ffn}
    for name, actual in recorded.items():
        stated = _arg(args, name)
        if stated is not None and int(stated) != actual:
            raise MegatronCheckpointError(f"{str(where)!r}: args.{name}={stated} but the tensors give {actual}")
    values.update({k: v for k, v in overrides.items() if k not in ("vocab_size",)})
    values["vocab_size"] = int(overrides.get("vocab_size", values["vocab_size"]))
    if expect == "bert":
        if "lm_head.bias" not in shard0 and "pooler.weight" not in shard0:
            raise MegatronCheckpointError(f"{str(where)!r} holds a GPT model (no BERT pooler or LM head), but a BERT "
                                          "model was requested; evaluate it with the matching task")
        types = shard0.get("embedding.tokentype_embeddings.weight")
        values.update(num_tokentypes=types.shape[0] if types is not None else 0, layernorm_placement="megatron")
        return BertConfig(**values)
    if "embedding.tokentype_embeddings.weight" in shard0 or "lm_head.bias" in shard0:
        raise MegatronCheckpointError(f"{str(where)!r} holds a BERT model (tokentype embeddings / LM head), but a GPT "
                                      "model was requested; evaluate it with the matching task")
    return GPTConfig(**values)


def _check_shapes(full: Mapping[str, torch.Tensor], config, where: Path) -> None:
    """The merged tensors against the config (catches wrong heads / hidden sizes before the model does)."""
    h = config.hidden_size
    expected = {"attention.qkv.weight": (3 * h, h), "attention.dense.weight": (h, h),
                "mlp.fc1.weight": (config.ffn_size, h), "mlp.fc2.weight": (h, config.ffn_size)}
    for name, tensor in full.items():
        for suffix, shape in expected.items():
            if name.endswith(suffix) and tuple(tensor.shape) != shape:
                raise MegatronCheckpointError(f"{str(where)!r}: {name} has shape {tuple(tensor.shape)}, the config "
                                              f"(hidden {h}, ffn {config.ffn_size}) needs {shape}")
    if full["embedding.word_embeddings.weight"].shape[0] < config.vocab_size:
        raise MegatronCheckpointError(f"{str(where)!r}: the word embedding has "
                                      f"{full['embedding.word_embeddings.weight'].shape[0]} rows, fewer than "
                                      f"vocab_size={config.vocab_size}")
