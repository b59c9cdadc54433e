"""Hugging Face GPT-2 / BERT / Megatron-BERT weights from a local directory, renamed into repro's models.

No network and no ``transformers`` import: ``config.json`` is read as JSON and the weights from
``model.safetensors`` (a 20-line reader below; sharded ``*.index.json`` too) or ``pytorch_model.bin``.

Layout differences handled here:
* GPT-2 uses ``Conv1D`` (weights stored ``[in, out]``): transposed to ``nn.Linear``'s ``[out, in]``.
* GPT-2's fused ``c_attn`` rows are ordered (q|k|v, head, head_dim); repro orders them (head, q|k|v, head_dim) so
  that a contiguous tensor-parallel split hands each rank whole heads (Megatron sec. 3). BERT's separate
  query/key/value are interleaved the same way.
* BERT (post-LN) and Megatron-BERT (pre-LN): names in evals/hf_bert.py, which also writes them back.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Mapping

import torch

from evals.checkpoints import LoadedState, check_state, files_sha256, inside_name_problem, read_json
from evals.hf_bert import bert_config, convert_bert, hf_config_values, source_tensor
from repro.input_files import inside, open_regular
from repro.models import GPTConfig
from repro.training.consolidate import load_state_file
from repro.zero.checkpoint import CheckpointError

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Parse a .safetensors file: 8-byte little-endian header size, JSON header, then raw tensor bytes."""
    with open_regular(path, error=CheckpointError) as handle:
        data = handle.read()
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > len(data) - 8:
        raise CheckpointError(f"{str(path)!r} is not a safetensors file: its header claims {header_size} bytes, the file "
                         f"has {len(data)}")
    try:
        header = json.loads(data[8: 8 + header_size])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{str(path)!r} is not a safetensors file: its header is not JSON ({err})") from None
    base = 8 + header_size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{str(path)!r}: tensor {name!r} has unsupported dtype {info['dtype']!r}")
        start, end = info["data_offsets"]
        buffer = bytearray(data[base + start: base + end])
        tensor = torch.frombuffer(buffer, dtype=_SAFETENSORS_DTYPES[info["dtype"]]) if buffer else torch.empty(0)
        tensors[name] = tensor.reshape(info["shape"]).clone()
    return tensors


def hub_root(directory: Path) -> Path:
    """What a Hugging Face directory's files must stay inside: the directory itself, or, for a snapshot of the
    hub's cache (``models--ORG--NAME/snapshots/REV``, whose files are symlinks into ``../../blobs``), the model's
    cache folder ``models--ORG--NAME``."""
    real = Path(os.path.realpath(directory))
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith(("models--", "datasets--")):
        return real.parent.parent
    return directory


def hf_file(directory: Path, name: object, *, what: str = "", missing_ok: bool = False) -> Path:
    """``directory / name``, a regular file inside the directory (:func:`hub_root`), else one CheckpointError."""
    return inside(directory, name, what=what, error=CheckpointError, missing_ok=missing_ok,
                  within=hub_root(directory))


def _index_names(index: Path) -> list[str]:
    """The weight files a ``*.index.json`` names (its ``weight_map`` values), each inside its directory."""
    content = read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{str(index)!r} has no weight_map (a non-empty object of tensor name -> file name)")
    for name in weight_map.values():
        problem = inside_name_problem(name)
        if problem is not None:
            raise CheckpointError(f"{str(index)!r}: weight_map: {problem}")
    return sorted(set(weight_map.values()))


def weight_files(directory: Path) -> list[Path]:
    """The weight files of an HF directory: those its index names, else the one weights file; each a regular file
    inside the directory (a name or symlink leaving it is refused, naming the entry)."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if os.path.lexists(directory / index_name):
            index = hf_file(directory, index_name)
            paths = [hf_file(directory, n, what=f"{str(index)!r}: weight_map", missing_ok=True)
                     for n in _index_names(index)]
            missing = [str(p) for p in paths if not os.path.lexists(p)]
            if missing:
                raise CheckpointError(f"{str(index)!r} names weight files that are missing: {missing[:3]}")
            return paths
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.lexists(directory / name):
            return [hf_file(directory, name)]
    raise CheckpointError(f"{str(directory)!r} holds no model.safetensors or pytorch_model.bin")


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every weight file of an HF directory, merged. A file that does not parse is a CheckpointError naming it (one
    line), never the reader's own exception: the directory came from elsewhere."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(directory):
        if path.suffix != ".safetensors":
            tensors = load_state_file(path)
            _check_finite(tensors, path)
            state.update(tensors)
            continue
        try:
            tensors = read_safetensors(path)
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - struct, json, key, type and reshape errors alike
            reason = (str(err).strip().splitlines() or [""])[0][:160]
            raise CheckpointError(f"{str(path)!r} is not a safetensors file that can be read "
                                  f"({type(err).__name__}: {reason})") from None
        _check_finite(tensors, path)
        state.update(tensors)
    return state


def _check_finite(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Every floating-point tensor of one weights file is finite; else a CheckpointError naming the file and the
    tensor (not the config the weights are later checked against)."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{str(path)!r}: tensor {name!r} holds non-finite values (nan or inf)")


def _qkv_to_repro(fused: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows (3, heads, head_dim) -> (heads, 3, head_dim); works for weights [3h, in] and biases [3h]."""
    rest = fused.shape[1:]
    return fused.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(fused.shape[0], *rest).contiguous()


def gpt2_config(hf: Mapping, where: str = "config.json") -> GPTConfig:
    """repro's GPTConfig from a ``gpt2`` config.json (``where``: the file, for refusals)."""
    if not isinstance(hf, Mapping):
        raise CheckpointError(f"{where} holds a JSON {type(hf).__name__}, not an object")
    if hf.get("model_type") != "gpt2":
        raise CheckpointError(f"{where} has model_type {hf.get('model_type')!r}, expected 'gpt2' for a GPT model")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(f"{where}: activation_function={hf['activation_function']!r}: repro's GPT uses "
                              "tanh-GELU only")
    if hf.get("scale_attn_by_inverse_layer_idx") or not hf.get("scale_attn_weights", True):
        raise CheckpointError(f"{where}: GPT-2 attention-scaling variants other than 1/sqrt(head_dim) are not "
                              "supported")
    v = hf_config_values(hf, where, ints=("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
                         optional={"n_inner": None, "layer_norm_epsilon": 1e-5})
    return _config(GPTConfig, where, vocab_size=v["vocab_size"], hidden_size=v["n_embd"], num_layers=v["n_layer"],
                   num_attention_heads=v["n_head"], max_position_embeddings=v["n_positions"],
                   ffn_hidden_size=v["n_inner"] or None, layernorm_epsilon=v["layer_norm_epsilon"],
                   hidden_dropout=0.0, attention_dropout=0.0)


def _config(cls: type, where: str, **values) -> GPTConfig:
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None


def gpt2_names(config: GPTConfig) -> list[tuple[str, str, bool]]:
    """(repro name, ``GPT2LMHeadModel`` name, transposed) of every tensor both ways; ``transposed``: GPT-2's
    ``Conv1D`` stores the weight ``[in, out]``. The fused QKV's rows are also reordered (:func:`_qkv_to_repro`)."""
    names = [("embedding.word_embeddings.weight", "transformer.wte.weight", False),
             ("embedding.position_embeddings.weight", "transformer.wpe.weight", False),
             ("final_layernorm.weight", "transformer.ln_f.weight", False),
             ("final_layernorm.bias", "transformer.ln_f.bias", False)]
    pairs = (("input_layernorm", "ln_1"), ("attention.qkv", "attn.c_attn"), ("attention.dense", "attn.c_proj"),
             ("post_attention_layernorm", "ln_2"), ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj"))
    for i in range(config.num_layers):
        names += [(f"layers.{i}.{ours}.{part}", f"transformer.h.{i}.{theirs}.{part}",
                   part == "weight" and not ours.endswith("layernorm"))
                  for ours, theirs in pairs for part in ("weight", "bias")]
    return names


def convert_gpt2(hf_state: Mapping[str, torch.Tensor], config: GPTConfig,
                 where: str = "the weights") -> dict[str, torch.Tensor]:
    """HF ``GPT2LMHeadModel`` / ``GPT2Model`` state dict -> repro GPT consolidated state dict; a tensor the config
    needs and the weights lack, or one that cannot be reordered, is a CheckpointError naming it."""
    src = {k if k.startswith("transformer.") else f"transformer.{k}": v for k, v in hf_state.items()}
    out = {}
    for ours, theirs, transposed in gpt2_names(config):
        tensor = source_tensor(src, theirs, where)
        tensor = tensor.t() if transposed and tensor.dim() == 2 else tensor
        try:
            out[ours] = _qkv_to_repro(tensor, config.num_attention_heads) if ".attention.qkv." in ours else tensor
        except RuntimeError:
            raise CheckpointError(f"{where}: tensor {theirs!r} of shape {tuple(tensor.shape)} does not split into "
                                  f"{config.num_attention_heads} heads as the config says") from None
    return {k: v.contiguous().clone() for k, v in out.items()}


def load_hf(directory: str | Path, *, expect: str) -> LoadedState:
    """Read a local Hugging Face GPT-2 (``expect="gpt"``), BERT or Megatron-BERT directory (``"bert"``: the encoder
    and whatever heads it has; ``"bert_multiple_choice"``: a ``*ForMultipleChoice`` model, RACE's finetuned one)."""
    directory = Path(directory)
    where = repr(str(directory / "config.json"))
    hf_config = read_json(hf_file(directory, "config.json"))
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{where} holds a JSON {type(hf_config).__name__}, not an object")
    files = weight_files(directory)
    state = read_hf_weights(directory)
    # a tensor the weights lack or hold as integers is named with the file; shapes are checked against config.json
    weights = repr(str(files[0])) if len(files) == 1 else f"the weight files of {str(directory)!r}"
    if expect == "gpt":
        config = gpt2_config(hf_config, where)
        converted = convert_gpt2(state, config, weights)
    elif expect in ("bert", "bert_multiple_choice"):
        config = bert_config(hf_config, where)
        converted = convert_bert(state, config, weights)
        multiple_choice = "head.weight" in converted
        if expect == "bert" and multiple_choice:  # the encoder of a finetuned model (e.g. to finetune it again)
            converted = {k.removeprefix("bert."): v for k, v in converted.items() if k.startswith("bert.")}
        elif expect == "bert_multiple_choice" and not multiple_choice:
            raise CheckpointError(f"{str(directory)!r} holds no multiple-choice head (classifier.weight): it is a "
                                  f"{(hf_config.get('architectures') or ['BERT'])[0]}, not a *ForMultipleChoice model")
    else:
        raise ValueError(f"Hugging Face conversion supports 'gpt' (GPT-2) and 'bert', not {expect!r}")
    check_state(converted, config, expect, where)
    return LoadedState(architecture=expect, config=config, state_dict=converted,
                       sha256=files_sha256(files), source="huggingface",
                       meta={"hf_model_type": hf_config.get("model_type")})
