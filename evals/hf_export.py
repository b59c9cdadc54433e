"""``repro export-hf CKPT OUT``: a GPT or BERT checkpoint as a Hugging Face directory that ``transformers`` loads.

GPT: the inverse of :func:`evals.hf_convert.convert_gpt2`. Any GPT checkpoint the harness reads (``repro train``'s
at any layout, the harness's own, Megatron-LM's) is consolidated to one state dict, renamed to ``GPT2LMHeadModel``'s
names (fused QKV rows back from ``(heads, 3, head_dim)`` to ``(3, heads, head_dim)``, linear weights transposed into
GPT-2's ``Conv1D`` layout). GPT-2's architecture is repro's (pre-LN, tanh GELU, learned positions, tied output).
BERT (the harness's own, RACE finetuning's ``--save``, Megatron-LM's): :mod:`evals.hf_bert`, as ``Bert*`` (post-LN)
or ``MegatronBert*`` (pre-LN, Megatron's placement), ``*ForMultipleChoice`` for RACE's finetuned model.

Written as ``config.json`` + ``model.safetensors`` (written here: an 8-byte header length, a JSON header, the raw
little-endian tensors; a tied tensor once, under the name Hugging Face loads it by: ``transformer.wte.weight``, not
``lm_head.weight``, which ``tie_word_embeddings`` ties to it) and the tokenizer's files, so that ``AutoTokenizer``
and lm-eval's ``HFLM`` load the directory as it is: GPT-2's BPE for a GPT whose vocabulary holds GPT-2's 50,257
tokens (also one padded above them, as Megatron's ``make-vocab-size-divisible-by`` or nanoGPT's 50,304), from the
data directory or, for an installed wheel, its own copies; BERT's uncased WordPiece for a BERT of its 30,522 tokens,
from the data directory. Where those files are nowhere, the command refuses in one line and writes nothing; a model
whose vocabulary no tokenizer here fits (a toy vocabulary) is written without one, and the command says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from repro.cliargs import OneLineParser
from repro.models.config import GPTConfig
from repro.text.data_files import DEFAULT_DATA_DIR_TEXT

GPT2_VOCAB = 50257
BERT_VOCAB_SIZE = 30522  # BERT's uncased WordPiece
_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def _qkv_to_hf(fused: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows (heads, 3, head_dim) -> (3, heads, head_dim): the inverse of ``_qkv_to_repro``."""
    rest = fused.shape[1:]
    return fused.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(fused.shape[0], *rest).contiguous()


def gpt2_state(state: Mapping[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Consolidated repro GPT state dict -> ``GPT2LMHeadModel`` state dict (without lm_head, tied to wte): the
    inverse of :func:`evals.hf_convert.convert_gpt2`, by the same name table."""
    from evals.hf_convert import gpt2_names

    out = {}
    for ours, theirs, transposed in gpt2_names(config):
        tensor = state[ours]
        if ".attention.qkv." in ours:
            tensor = _qkv_to_hf(tensor, config.num_attention_heads)
        out[theirs] = tensor.t() if transposed else tensor
    out["transformer.wte.weight"] = out["transformer.wte.weight"][: config.vocab_size]
    # lm_head.weight is not stored: GPT2LMHeadModel ties it to wte (tie_word_embeddings), as GPT-2's own files do
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
    """The safetensors layout: u64 header length, JSON header (dtype, shape, byte offsets), tensor bytes. Every name
    gets its own bytes (safetensors has no aliasing): a tied tensor's second name is left out by the caller."""
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


@dataclass(frozen=True)
class TokenizerFiles:
    """The tokenizer an export carries: its name, the files (name in OUT -> source) and tokenizer_config.json."""

    name: str
    files: dict[str, Path]
    config: dict


def tokenizer_for(architecture: str, vocab_size: int, data_dir: str | os.PathLike | None = None
                  ) -> TokenizerFiles | None:
    """GPT-2's BPE for a GPT of at least its 50,257 tokens (a padded vocabulary too: the ids above are never
    produced), BERT's uncased WordPiece for a BERT of exactly its 30,522; None for any other vocabulary. Files
    checked against their pinned sha256; :class:`~repro.text.data_files.DataError` (one line naming the fetch)
    when they are nowhere."""
    from repro.text.data_files import BERT_VOCAB, data_path, gpt2_tokenizer_files

    if architecture == "gpt" and vocab_size >= GPT2_VOCAB:
        vocab, merges = gpt2_tokenizer_files(data_dir)
        return TokenizerFiles("GPT-2", {"vocab.json": vocab, "merges.txt": merges}, {
            "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>"})
    if architecture != "gpt" and vocab_size == BERT_VOCAB_SIZE:
        return TokenizerFiles("BERT uncased WordPiece", {"vocab.txt": data_path(BERT_VOCAB, data_dir)}, {
            "tokenizer_class": "BertTokenizer", "do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]",
            "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"})
    return None


def _write_tokenizer(out: Path, tokenizer: TokenizerFiles, max_length: int) -> None:
    for name, source in tokenizer.files.items():
        shutil.copyfile(source, out / name)
    (out / "tokenizer_config.json").write_text(json.dumps({**tokenizer.config, "model_max_length": max_length})
                                               + "\n")


def export_hf(checkpoint: str | Path, out: str | Path, *, with_tokenizer: bool = False,
              data_dir: str | os.PathLike | None = None) -> tuple[str, str | None]:
    """Write ``out`` (config.json, model.safetensors, and with ``with_tokenizer`` the tokenizer that fits the model,
    :func:`tokenizer_for`, found before anything is written) from any GPT or BERT checkpoint the harness reads;
    returns (the Hugging Face class written, the tokenizer's name or None when none was written)."""
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
    tokenizer = tokenizer_for(architecture, config.vocab_size, data_dir) if with_tokenizer else None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", state,
                      {"format": "pt", "exported_from": str(checkpoint), "source": loaded.source})
    (out / "config.json").write_text(json.dumps(config_json, indent=1) + "\n")
    if tokenizer is not None:
        _write_tokenizer(out, tokenizer, config.max_position_embeddings)
    return hf_class, tokenizer.name if tokenizer is not None else None


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


def _data_dir_problem(data_dir: str | None) -> str | None:
    """An error line when --data-dir, or a set $REPRO_DATA, names a directory that cannot be read (even where an
    installed wheel's own tokenizer copies would do: a setting that names nothing usable is a mistake)."""
    from repro.text.data_files import ENV_VAR, resolve_data_dir

    if data_dir is None and not os.environ.get(ENV_VAR):
        return None
    try:
        resolve_data_dir(data_dir)
    except (ValueError, OSError) as err:
        return f"--data-dir {data_dir}: {err}" if data_dir is not None else f"{ENV_VAR}={os.environ[ENV_VAR]}: {err}"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="repro export-hf", description=__doc__.split("\n")[0].split(": ", 1)[1],
                           epilog="example: repro export-hf ckpt/ hf-model/ && python -c \"import transformers; "
                                  "transformers.AutoModelForCausalLM.from_pretrained('hf-model')\"")
    parser.add_argument("checkpoint", help="a GPT or BERT checkpoint directory: repro train's --save directory (its "
                        "newest checkpoint) or one iter_N inside it, the harness's own (convert-hf, race-finetune "
                        "--save), or Megatron-LM's")
    parser.add_argument("out", help="the Hugging Face directory to write (created; files in it are replaced)")
    parser.add_argument("--data-dir", default=None, help=f"where the tokenizer files are (default: "
                        f"{DEFAULT_DATA_DIR_TEXT}; an installed wheel also carries GPT-2's): GPT-2's BPE for a GPT of "
                        "at least its 50257 tokens, BERT's uncased WordPiece for a BERT of its 30522; a model of "
                        "another vocabulary is written without a tokenizer")
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
    error = _data_dir_problem(args.data_dir)
    if error is not None:
        print(f"repro export-hf: error: {error}", file=sys.stderr)
        return 2
    try:
        hf_class, tokenizer = export_hf(args.checkpoint, args.out, with_tokenizer=True, data_dir=args.data_dir)
    except ValueError as err:  # a DataError too: the tokenizer's files are nowhere (nothing was written)
        print(f"repro export-hf: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/config.json and model.safetensors ({hf_class})" + (
        f" and the {tokenizer} tokenizer" if tokenizer else "; no tokenizer: none here has the model's vocabulary "
        f"(GPT-2's is 50257 tokens, BERT's 30522)"))
    return 0
