"""``repro export-hf CKPT OUT``: a checkpoint as a Hugging Face GPT-2 directory that ``transformers`` loads.

The inverse of :func:`evals.hf_convert.convert_gpt2`. Any checkpoint the harness reads (``repro train``'s at any
layout, the harness's own, Megatron-LM's) is consolidated to one GPT state dict, renamed to ``GPT2LMHeadModel``'s
names (fused QKV rows back from ``(heads, 3, head_dim)`` to ``(3, heads, head_dim)``, linear weights transposed into
GPT-2's ``Conv1D`` layout) and written as ``config.json`` + ``model.safetensors`` (written here: an 8-byte header
length, a JSON header, the raw little-endian tensors). A model with GPT-2's vocabulary also gets the tokenizer's
``vocab.json`` and ``merges.txt`` from the data directory, so that ``AutoTokenizer`` and lm-eval's ``HFLM`` load the
directory as it is. GPT-2's architecture is repro's (pre-LN, tanh GELU, learned positions, tied output layer).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from pathlib import Path
from typing import Mapping, Sequence

import torch

from repro.cliargs import OneLineParser
from repro.models.config import GPTConfig

GPT2_VOCAB = 50257
_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def _qkv_to_hf(fused: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows (heads, 3, head_dim) -> (3, heads, head_dim): the inverse of ``_qkv_to_repro``."""
    rest = fused.shape[1:]
    return fused.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(fused.shape[0], *rest).contiguous()


def gpt2_state(state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Consolidated repro GPT state dict -> ``GPT2LMHeadModel`` state dict (lm_head tied to wte)."""
    out = {
        "transformer.wte.weight": state["embedding.word_embeddings.weight"][: config.vocab_size],
        "transformer.wpe.weight": state["embedding.position_embeddings.weight"],
        "transformer.ln_f.weight": state["final_layernorm.weight"],
        "transformer.ln_f.bias": state["final_layernorm.bias"],
    }
    heads = config.num_attention_heads
    for i in range(config.num_layers):
        p, q = f"transformer.h.{i}.", f"layers.{i}."
        out[p + "ln_1.weight"] = state[q + "input_layernorm.weight"]
        out[p + "ln_1.bias"] = state[q + "input_layernorm.bias"]
        out[p + "attn.c_attn.weight"] = _qkv_to_hf(state[q + "attention.qkv.weight"], heads).t()
        out[p + "attn.c_attn.bias"] = _qkv_to_hf(state[q + "attention.qkv.bias"], heads)
        out[p + "attn.c_proj.weight"] = state[q + "attention.dense.weight"].t()
        out[p + "attn.c_proj.bias"] = state[q + "attention.dense.bias"]
        out[p + "ln_2.weight"] = state[q + "post_attention_layernorm.weight"]
        out[p + "ln_2.bias"] = state[q + "post_attention_layernorm.bias"]
        out[p + "mlp.c_fc.weight"] = state[q + "mlp.fc1.weight"].t()
        out[p + "mlp.c_fc.bias"] = state[q + "mlp.fc1.bias"]
        out[p + "mlp.c_proj.weight"] = state[q + "mlp.fc2.weight"].t()
        out[p + "mlp.c_proj.bias"] = state[q + "mlp.fc2.bias"]
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def gpt2_config_json(config: GPTConfig) -> dict:
    """``config.json`` of a ``GPT2LMHeadModel`` with ``config``'s shape (no dropout: an exported model evaluates)."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
        "n_embd": config.hidden_size, "n_layer": config.num_layers, "n_head": config.num_attention_heads,
        "n_positions": config.max_position_embeddings, "n_ctx": config.max_position_embeddings,
        "n_inner": config.ffn_hidden_size, "activation_function": "gelu_new",
        "layer_norm_epsilon": config.layernorm_epsilon, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "tie_word_embeddings": True, "bos_token_id": GPT2_VOCAB - 1,
        "eos_token_id": GPT2_VOCAB - 1, "torch_dtype": "float32",
    }


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """The safetensors layout: u64 header length, JSON header (dtype, shape, byte offsets), tensor bytes. Tied
    tensors are written once each under each name (safetensors has no aliasing)."""
    header: dict = {"__metadata__": dict(metadata)}
    blobs, offset = [], 0
    for name in sorted(tensors):
        tensor = tensors[name].cpu().contiguous()
        data = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the tensors start 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for blob in blobs:
            handle.write(blob)


def export_gpt2(checkpoint: str | Path, out: str | Path, *, tokenizer_dir: Path | None = None) -> Path:
    """Write ``out`` (config.json, model.safetensors, and the GPT-2 tokenizer when given and the vocabulary is
    GPT-2's) from any GPT checkpoint the harness reads; returns ``out``."""
    from evals.checkpoint_formats import load_checkpoint

    loaded = load_checkpoint(checkpoint, expect="gpt")
    config = loaded.config
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = gpt2_state(loaded.state_dict, config)
    write_safetensors(out / "model.safetensors", state,
                      {"format": "pt", "exported_from": str(checkpoint), "source": loaded.source})
    (out / "config.json").write_text(json.dumps(gpt2_config_json(config), indent=1) + "\n")
    if tokenizer_dir is not None and config.vocab_size == GPT2_VOCAB:
        shutil.copyfile(tokenizer_dir / "gpt2-vocab.json", out / "vocab.json")
        shutil.copyfile(tokenizer_dir / "gpt2-merges.txt", out / "merges.txt")
        (out / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "GPT2Tokenizer", "model_max_length": config.max_position_embeddings,
             "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}) + "\n")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="repro export-hf", description=__doc__.split("\n")[0].split(": ", 1)[1],
                           epilog="example: repro export-hf ckpt/ hf-model/ && python -c \"import transformers; "
                                  "transformers.AutoModelForCausalLM.from_pretrained('hf-model')\"")
    parser.add_argument("checkpoint", help="a checkpoint directory: repro train's --save directory (its newest "
                        "checkpoint) or one iter_N inside it, the harness's own, or Megatron-LM's")
    parser.add_argument("out", help="the Hugging Face directory to write (created; files in it are replaced)")
    parser.add_argument("--data-dir", default=None, help="where the GPT-2 tokenizer files are (default: $REPRO_DATA, "
                        "else ../shared/data); copied only for a model with GPT-2's vocabulary of 50257")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from repro.paths import writable_dir_problem

    args = build_parser().parse_args(argv)
    problem = writable_dir_problem(args.out)
    if problem is not None:
        print(f"repro export-hf: error: {args.out} {problem}", file=sys.stderr)
        return 2
    from evals.data_files import resolve_data_dir

    try:
        tokenizers = resolve_data_dir(args.data_dir) / "tokenizers"
    except (ValueError, OSError) as err:
        if args.data_dir is not None:
            print(f"repro export-hf: error: --data-dir {args.data_dir}: {err}", file=sys.stderr)
            return 2
        tokenizers = None  # no data directory here: the weights and config alone
    try:
        out = export_gpt2(args.checkpoint, args.out, tokenizer_dir=tokenizers)
    except ValueError as err:
        print(f"repro export-hf: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}/config.json and model.safetensors" + (
        " (and the GPT-2 tokenizer)" if (out / "vocab.json").exists() else ""))
    return 0
