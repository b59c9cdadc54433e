"""Where every file of the data directory comes from on the internet, as data: ``repro data fetch`` reads this.

Each :class:`Source` is one download (a file, or an archive some of whose members are kept), the files it yields
in the data directory, and how each is checked: against the sha256 pinned in :mod:`repro.text.data_files` (the same
bytes the folders' SOURCE.md describe). Two files of the RACE folder are not published as such and are rebuilt
from the RACE archive by the rules their SOURCE.md states, then checked like the rest: ``race/SHA256SUMS`` (every
test/dev file's ``sha256  path`` line, paths sorted) and ``race/train-{high,middle}.jsonl.gz`` (each train file's
JSON object plus its ``source``, numeric file order, gzip level 9 with the member name and mtime 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.text.data_files import (BERT_VOCAB, GPT2_MERGES, GPT2_VOCAB, LAMBADA_TEST, RACE_MANIFEST, RACE_TRAIN,
                              WIKITEXT_TEST, WIKITEXT_VALID, DataFile)


@dataclass(frozen=True)
class Member:
    """A file of the data directory taken from a download: the download itself (``member=None``) or one member
    of the archive."""

    target: DataFile
    member: str | None = None


@dataclass(frozen=True)
class Source:
    """One download: its ``name`` for ``--only``, the URL, the file name a mirror serves it under, its size in
    bytes where its SOURCE.md records it (for progress; None otherwise) and what it yields."""

    name: str
    url: str
    filename: str
    members: tuple[Member, ...]
    approx_bytes: int | None = None
    license: str = ""

    @property
    def is_archive(self) -> bool:
        return any(m.member is not None for m in self.members)


OPENAI_GPT2 = "https://openaipublic.blob.core.windows.net/gpt-2"

SOURCES: tuple[Source, ...] = (
    Source("tokenizers", f"{OPENAI_GPT2}/encodings/main/encoder.json", "encoder.json", (Member(GPT2_VOCAB),),
           1_042_301, "openai/gpt-2 Modified MIT License"),
    Source("tokenizers", f"{OPENAI_GPT2}/encodings/main/vocab.bpe", "vocab.bpe", (Member(GPT2_MERGES),),
           456_318, "openai/gpt-2 Modified MIT License"),
    Source("tokenizers", "https://huggingface.co/google-bert/bert-large-uncased/resolve/main/vocab.txt",
           "vocab.txt", (Member(BERT_VOCAB),), 231_508, "google-research/bert Apache-2.0"),
    Source("lambada", f"{OPENAI_GPT2}/data/lambada_test.jsonl", "lambada_test.jsonl", (Member(LAMBADA_TEST),),
           1_819_752, "CC BY 4.0 (Paperno et al. 2016)"),
    Source("wikitext103", "https://wikitext.smerity.com/wikitext-103-v1.zip", "wikitext-103-v1.zip",
           (Member(WIKITEXT_TEST, "wikitext-103/wiki.test.tokens"),
            Member(WIKITEXT_VALID, "wikitext-103/wiki.valid.tokens")), None, "CC BY-SA 3.0"),
    Source("race", "http://www.cs.cmu.edu/~glai1/data/race/RACE.tar.gz", "RACE.tar.gz",
           (Member(RACE_MANIFEST, "RACE/"), Member(RACE_TRAIN["high"], "RACE/train/high/"),
            Member(RACE_TRAIN["middle"], "RACE/train/middle/")), None,
           "non-commercial research use only (CMU)"),
)

NAMES = tuple(dict.fromkeys(source.name for source in SOURCES))
