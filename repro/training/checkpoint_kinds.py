"""Checkpoint directories that are not ``repro train``'s own, named by what they are (for ``--load``).

``repro train`` resumes only the checkpoints it writes (:mod:`repro.training.checkpoint`: ``iter_N/manifest.json``,
``trainer.json`` and a pointer). Other tools' directories look alike from outside (Megatron-LM even uses the same
pointer file name), and without a look inside, a Megatron-LM checkpoint read as "a save that did not finish" and a
Hugging Face or DeepSpeed directory as "no checkpoint, start from iteration 0". Each is recognised by its files
alone (nothing is unpickled) and named, with what can read it.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Megatron-LM's per-tensor-and-pipeline-rank folders: mp_rank_00, mp_rank_01_002
_MEGATRON_RANK = re.compile(r"mp_rank_\d{2}(_\d{3})?$")
_EVALUATE = "python -m evals lambada --checkpoint {path} (or wikitext)"


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def _megatron(path: Path) -> bool:
    folders = [path, *_subdirs(path)]
    return any(_MEGATRON_RANK.match(sub.name) for folder in folders for sub in _subdirs(folder))


def _deepspeed(path: Path) -> bool:
    folders = [path, *(p for p in _subdirs(path) if p.name.startswith("global_step"))]
    return any(f.name.endswith(("_model_states.pt", "_optim_states.pt")) for folder in folders
               for f in (folder.iterdir() if folder.is_dir() else ()))


def describe_foreign(directory: str | Path) -> str | None:
    """What ``directory`` is when it is a checkpoint of another tool (one line, with what reads it), else None."""
    path = Path(directory)
    if not path.is_dir():
        return None
    if (path / "repro_checkpoint.json").is_file():
        return (f"is a model checkpoint of the evaluation harness (repro_checkpoint.json), not one of repro train; "
                f"evaluate it with {_EVALUATE.format(path=path)}")
    if (path / "config.json").is_file() and (any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*"))):
        return (f"is a Hugging Face model directory (config.json and weights), not a checkpoint of repro train, which "
                f"resumes only its own; evaluate it with {_EVALUATE.format(path=path)}, or convert it for the "
                f"harness with python -m evals convert-hf --hf-dir {path} --out DIR")
    if _deepspeed(path) or ((path / "latest").is_file()
                            and any(p.name.startswith("global_step") for p in _subdirs(path))):
        return ("is a DeepSpeed checkpoint (global_step*/ *_model_states.pt), not a checkpoint of repro train, which "
                "resumes only its own; DeepSpeed's zero_to_fp32.py turns it into weights")
    if _megatron(path):
        return (f"is a Megatron-LM checkpoint (mp_rank_XX/model_optim_rng.pt), not a checkpoint of repro train, which "
                f"resumes only its own; evaluate it with {_EVALUATE.format(path=path)}")
    return None
