"""Loading the verified evaluation files through Hugging Face ``datasets`` (local files only, nothing downloaded).

Every loader verifies checksums first (:mod:`repro.text.data_files`) and returns plain Python values plus the data
checksum that result rows record as provenance. ``datasets`` is optional: it is imported by the loaders only
(:func:`repro.optional.require`), so importing this module, or any harness, does not need it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from repro.text.data_files import (
    LAMBADA_TEST, RACE_TRAIN, WIKITEXT_TEST, WIKITEXT_VALID, checksum_of, data_path, race_split_files,
)
from repro.optional import require

PathLike = str | os.PathLike | None


@dataclass(frozen=True)
class Loaded:
    """Loaded records and the sha256 identifying the bytes they came from."""

    records: Any
    data_sha256: str


def _datasets(purpose: str) -> ModuleType:
    """Hugging Face ``datasets``, quiet (no progress bars, errors only); one clear error when it is not installed."""
    datasets = require("datasets", purpose)
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def load_wikitext(split: str = "test", data_dir: PathLike = None) -> Loaded:
    """The whole WikiText-103 ``split`` file as one string, exactly as on disk (Megatron reads it whole)."""
    files = {"test": WIKITEXT_TEST, "valid": WIKITEXT_VALID, "validation": WIKITEXT_VALID}
    if split not in files:
        raise ValueError(f"WikiText-103 split {split!r} is not one of {sorted(files)} (train is not shipped)")
    path = data_path(files[split], data_dir)
    datasets = _datasets(f"reading the WikiText-103 {split} file")
    table = datasets.load_dataset("text", data_files={split: str(path)}, sample_by="document", split=split)
    return Loaded(records=table[0]["text"], data_sha256=files[split].sha256)


def load_lambada(data_dir: PathLike = None) -> Loaded:
    """The 5,153 LAMBADA test passages (OpenAI's detokenized version), in file order."""
    path = data_path(LAMBADA_TEST, data_dir)
    datasets = _datasets("reading the LAMBADA test file")
    table = datasets.load_dataset("json", data_files={"test": str(path)}, split="test")
    return Loaded(records=list(table["text"]), data_sha256=LAMBADA_TEST.sha256)


def load_race(split: str, level: str, data_dir: PathLike = None) -> Loaded:
    """RACE passages of ``split`` (train, dev, test) and ``level`` (middle, high), in numeric file order.

    Each record has keys article, questions, options, answers (one entry per question) and id.
    """
    if split == "train":
        if level not in RACE_TRAIN:
            raise ValueError(f"RACE level {level!r} is not one of {sorted(RACE_TRAIN)}")
        path = data_path(RACE_TRAIN[level], data_dir)
        datasets = _datasets("reading the RACE train file")
        table = datasets.load_dataset("json", data_files={"train": str(path)}, split="train")
        sha = RACE_TRAIN[level].sha256
    else:
        files = race_split_files(split, level, data_dir)
        datasets = _datasets(f"reading the RACE {split} files")
        table = datasets.load_dataset("json", data_files={split: [str(f) for f in files]}, split=split)
        sha = checksum_of(files)
    columns = ("article", "questions", "options", "answers", "id")
    records = [dict(zip(columns, row)) for row in zip(*(table[c] for c in columns))]
    for record in records:
        if not (len(record["questions"]) == len(record["options"]) == len(record["answers"])):
            raise ValueError(f"RACE passage {record['id']!r}: questions, options and answers differ in length")
    return Loaded(records=records, data_sha256=sha)
