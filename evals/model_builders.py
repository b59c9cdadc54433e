"""Build repro models from loaded checkpoints, with the checks an evaluation needs at the boundary."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

import torch

from evals.checkpoint_formats import load_checkpoint
from evals.checkpoints import LoadedState
from evals.repro_lm import ReproCausalLM
from repro.text.tokenization import TextTokenizer, check_vocab_compatible
from repro.dist.comm import CommGroup
from repro.models import BertModel, GPTModel

_DEVICE: ContextVar[str] = ContextVar("evals_device", default="cpu")


def check_device(device: str) -> str:
    """"cpu", "cuda" or "cuda:N", and CUDA only where there is a GPU (ValueError naming the value otherwise)."""
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device {device!r} must be 'cpu', 'cuda' or 'cuda:N'")
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but this machine has no CUDA GPU")
    return device


@contextmanager
def eval_device(device: str) -> Iterator[str]:
    """Within the block, :func:`load_gpt_for_eval` places models on ``device`` (in this process; a tp > 1 run's
    spawned ranks stay on CPU)."""
    token = _DEVICE.set(check_device(device))
    try:
        yield device
    finally:
        _DEVICE.reset(token)


# Heads a BERT checkpoint may lack (e.g. an encoder-only HF export); they keep their fresh initialisation.
OPTIONAL_BERT_PREFIXES = ("pooler.", "lm_head.", "binary_head.")


def _tp(tp_group: CommGroup | None) -> tuple[int, int]:
    return (0, 1) if tp_group is None else (tp_group.rank, tp_group.size)


def gpt_from_state(loaded: LoadedState, *, tp_group: CommGroup | None = None, dtype=torch.float32) -> GPTModel:
    model = GPTModel(loaded.config, tp_group=tp_group).to(dtype)  # cast first: a float64 checkpoint stays exact
    model.load_state_dict(loaded.state_dict, strict=True)
    return model.eval()


def bert_from_state(loaded: LoadedState, *, tp_group: CommGroup | None = None, dtype=torch.float32) -> BertModel:
    model = BertModel(loaded.config, tp_group=tp_group).to(dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict, strict=False)
    bad_missing = [k for k in missing if not k.startswith(OPTIONAL_BERT_PREFIXES)]
    if bad_missing or unexpected:
        raise ValueError(f"BERT checkpoint does not match the model: missing {bad_missing}, unexpected {unexpected}")
    return model.eval()


def load_gpt_for_eval(
    path: str | Path, tokenizer: TextTokenizer, *, tp_group: CommGroup | None = None,
    max_length: int | None = None, dtype=torch.float32, device: str | None = None,
) -> tuple[ReproCausalLM, LoadedState]:
    """A GPT checkpoint (repro, Hugging Face or Megatron-LM) ready for scoring, checked against the tokenizer's
    vocabulary; on ``device`` (default: the enclosing :func:`eval_device`, else CPU)."""
    tp_rank, tp_size = _tp(tp_group)
    loaded = load_checkpoint(path, expect="gpt", tp_rank=tp_rank, tp_size=tp_size)
    check_vocab_compatible(tokenizer, loaded.config.vocab_size)
    model = gpt_from_state(loaded, tp_group=tp_group, dtype=dtype).to(check_device(device or _DEVICE.get()))
    return ReproCausalLM(model, max_length=max_length), loaded
