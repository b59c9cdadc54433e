"""``repro export-hf CKPT OUT``: a GPT or BERT checkpoint as a Hugging Face directory that ``transformers`` loads.

GPT: the inverse of :func:`evals.hf_convert.convert_gpt2`. Any GPT checkpoint the harness reads (``repro train``'s
at any layout, the harness's own, Megatron-LM's) is consolidated to one state dict, renamed to ``GPT2LMHeadModel``'s
names (fused QKV rows back from ``(heads, 3, head_dim)`` to ``(3, heads, head_dim)``, linear weights transposed into
GPT-2's ``Conv1D`` layout). GPT-2's architecture is repro's (pre-LN, tanh GELU, learned positions, tied output).
BERT (the harness's own, RACE finetuning's ``--save``, Megatron-LM's): :mod:`evals.hf_bert`, as ``Bert*`` (post-LN)
or ``MegatronBert*`` (pre-LN, Megatron's placement), ``*ForMultipleChoice`` for RACE's finetuned model.

Written as ``config.json`` + ``model.safetensors`` (written here: an 8-byte header length, a JSON header, the raw
little-endian tensors). A model with the vocabulary of the data directory's tokenizer (GPT-2's BPE, BERT's uncased
WordPiece) also gets the tokenizer's files, so that ``AutoTokenizer`` and lm-eval's ``HFLM`` load the directory as
it is.
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
BERT_VOCAB = "bert-large-uncased-vocab.txt"
_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def _qkv_to_hf(fused: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows (heads, 3, head_dim) -> (3, heads, head_dim): the inverse of ``_qkv_to_repro``."""
    rest = fused.shape[1:]
    return fused.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(fused.shape[0], *rest).contiguous()


def gpt2_state(state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Consolidated repro GPT state dict -> ``GPT2LMHeadModel`` state dict (lm_head tied to wte): the inverse of
    :func:`evals.hf_convert.convert_gpt2`, by the same name table."""
    from evals.hf_convert import gpt2_names

    out = {}
    for ours, theirs, transposed in gpt2_names(config):
        tensor = state[ours]
        if ".attention.qkv." in ours:
            tensor = _qkv_to_hf(tensor, config.num_attention_heads)
        out[theirs] = tensor.t() if transposed else tensor
    out["transformer.wte.weight"] = out["transformer.wte.weight"][: config.vocab_size]
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


def _load_any(checkpoint: str | Path):
    """(architecture, LoadedState) for any checkpoint the harness reads: "gpt", "bert" or "bert_multiple_choice"."""
    from evals.checkpoint_formats import checkpoint_format, load_checkpoint
    from evals.checkpoints import read_header, read_json

    kind = checkpoint_format(checkpoint)
    if kind == "repro":
        architecture = read_header(checkpoint)["architecture"]
    elif kind == "huggingface":
        hf = read_json(Path(checkpoint) / "config.json")
        if not isinstance(hf, dict):
            raise ValueError(f"{checkpoint}/config.json holds a JSON {type(hf).__name__}, not an object")
        if hf.get("model_type") not in ("gpt2", "bert", "megatron-bert"):
            raise ValueError(f"{checkpoint}/config.json has model_type {hf.get('model_type')!r}: the models repro "
                             "has are GPT-2 ('gpt2'), BERT ('bert') and Megatron-BERT ('megatron-bert')")
        architecture = "gpt" if hf.get("model_type") == "gpt2" else (
            "bert_multiple_choice" if any(a.endswith("ForMultipleChoice") for a in hf.get("architectures") or [])
            else "bert")
    elif kind == "megatron":  # the checkpoint says which model it holds, read once
        from evals.megatron_checkpoint import read_megatron

        loaded = read_megatron(checkpoint, expect=None)
        return loaded.architecture, loaded
    else:
        architecture = "gpt"  # repro train trains GPTs
    return architecture, load_checkpoint(checkpoint, expect=architecture)


def _copy_tokenizer(out: Path, tokenizer_dir: Path, architecture: str, vocab_size: int,
                    max_length: int) -> str | None:
    """The tokenizer's files, when the model's vocabulary is the data directory's; the tokenizer's name, if so."""
    gpt2_files = all((tokenizer_dir / name).is_file() for name in ("gpt2-vocab.json", "gpt2-merges.txt"))
    if architecture == "gpt" and vocab_size == GPT2_VOCAB and gpt2_files:
        shutil.copyfile(tokenizer_dir / "gpt2-vocab.json", out / "vocab.json")
        shutil.copyfile(tokenizer_dir / "gpt2-merges.txt", out / "merges.txt")
        name = "GPT-2"
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                  "unk_token": "<|endoftext|>"}
    elif architecture != "gpt" and (tokenizer_dir / BERT_VOCAB).is_file() and vocab_size == len(
            (tokenizer_dir / BERT_VOCAB).read_text(encoding="utf-8").splitlines()):
        shutil.copyfile(tokenizer_dir / BERT_VOCAB, out / "vocab.txt")
        name = "BERT uncased WordPiece"
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "unk_token": "[UNK]",
                  "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
    else:
        return None
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": max_length}) + "\n")
    return name


def export_hf(checkpoint: str | Path, out: str | Path, *,
              tokenizer_dir: Path | None = None) -> tuple[str, str | None]:
    """Write ``out`` (config.json, model.safetensors, and the tokenizer when given and it is the model's) from any
    GPT or BERT checkpoint the harness reads; returns (the Hugging Face class written, the tokenizer's name or
    None when none was written)."""
    from evals.checkpoint_formats import checkpoint_format
    from evals.hf_bert import bert_architecture, bert_config_json, bert_hf_state

    checkpoint_format(checkpoint)  # a known format, before OUT is compared with it
    overlap = out_overlap_problem(checkpoint, out)
    if overlap is not None:
        raise ValueError(overlap)
    architecture, loaded = _load_any(checkpoint)
    config = loaded.config
    if architecture == "gpt":
        state, hf_class = gpt2_state(loaded.state_dict, config), "GPT2LMHeadModel"
        config_json = gpt2_config_json(config)
    else:
        state, hf_class = bert_hf_state(loaded.state_dict, config), bert_architecture(loaded.state_dict, config)
        config_json = bert_config_json(config, hf_class)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", state,
                      {"format": "pt", "exported_from": str(checkpoint), "source": loaded.source})
    (out / "config.json").write_text(json.dumps(config_json, indent=1) + "\n")
    tokenizer = None if tokenizer_dir is None else _copy_tokenizer(out, tokenizer_dir, architecture, config.vocab_size,
                                                              config.max_position_embeddings)
    return hf_class, tokenizer


def out_overlap_problem(checkpoint: str | Path, out: str | Path) -> str | None:
    """Why OUT cannot be written beside ``checkpoint`` (the same directory, one inside the other), or None: the
    export would write its files into the checkpoint it reads, or put the checkpoint inside its output."""
    ckpt, target = Path(checkpoint).resolve(), Path(out).resolve()
    if target == ckpt:
        return f"OUT {str(out)!r} is the checkpoint directory {str(checkpoint)!r}: give another directory"
    if ckpt in target.parents:
        return f"OUT {str(out)!r} is inside the checkpoint directory {str(checkpoint)!r}: give a directory outside it"
    if target in ckpt.parents:
        return f"OUT {str(out)!r} holds the checkpoint directory {str(checkpoint)!r}: give a directory outside it"
    return None


def _tokenizer_dir(data_dir: str | None) -> tuple[Path | None, str | None]:
    """(the tokenizer directory or None, an error line or None): a data directory given by --data-dir or a set
    $REPRO_DATA must exist; without either, a missing default only means no tokenizer is copied."""
    import os

    from repro.text.data_files import ENV_VAR, resolve_data_dir

    try:
        return resolve_data_dir(data_dir) / "tokenizers", None
    except (ValueError, OSError) as err:
        if data_dir is not None:
            return None, f"--data-dir {data_dir}: {err}"
        if os.environ.get(ENV_VAR):
            return None, f"{ENV_VAR}={os.environ[ENV_VAR]}: {err}"
        return None, None  # no data directory here: the weights and config alone


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="repro export-hf", description=__doc__.split("\n")[0].split(": ", 1)[1],
                           epilog="example: repro export-hf ckpt/ hf-model/ && python -c \"import transformers; "
                                  "transformers.AutoModelForCausalLM.from_pretrained('hf-model')\"")
    parser.add_argument("checkpoint", help="a GPT or BERT checkpoint directory: repro train's --save directory (its "
                        "newest checkpoint) or one iter_N inside it, the harness's own (convert-hf, race-finetune "
                        "--save), or Megatron-LM's")
    parser.add_argument("out", help="the Hugging Face directory to write (created; files in it are replaced)")
    parser.add_argument("--data-dir", default=None, help="where the tokenizer files are (default: $REPRO_DATA, else "
                        "../shared/data); copied only for a model with the tokenizer's vocabulary (GPT-2's 50257, "
                        "BERT's uncased 30522)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from repro.paths import writable_dir_problem

    args = build_parser().parse_args(argv)
    for label, value in (("CHECKPOINT", args.checkpoint), ("OUT", args.out)):
        if not value.strip():
            print(f"repro export-hf: error: {label} {value!r} is empty: give a directory", file=sys.stderr)
            return 2
    problem = writable_dir_problem(args.out, create=False)  # made by the export, once the checkpoint has loaded
    if problem is not None:
        print(f"repro export-hf: error: {args.out} {problem}", file=sys.stderr)
        return 2
    tokenizers, error = _tokenizer_dir(args.data_dir)
    if error is not None:
        print(f"repro export-hf: error: {error}", file=sys.stderr)
        return 2
    try:
        hf_class, tokenizer = export_hf(args.checkpoint, args.out, tokenizer_dir=tokenizers)
    except ValueError as err:
        print(f"repro export-hf: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/config.json and model.safetensors ({hf_class})" + (
        f" and the {tokenizer} tokenizer" if tokenizer else ""))
    return 0
