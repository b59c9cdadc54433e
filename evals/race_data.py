"""RACE (Lai et al. 2017) as the two protocols read it.

**Megatron-LM finetuning** (paper sec. 5.3, Table 5; tasks/race): every question becomes 4 sequences, one per
option: ``[CLS] question-with-option [SEP] article [SEP]``, the question side trimmed to 128 tokens, the whole
trimmed to ``max_seq_length``; a fill-in question (one containing "_") gets the option substituted for the blank,
otherwise the option is appended. Text is cleaned first (newlines and runs of spaces collapsed, " . " -> ". ").
Token types are 0 for the question side and 1 for the article side.

**lm-eval** (``race`` task): one document per article; its *last* question is asked, after the earlier questions of
the same article with their answers (see :mod:`evals.race_zeroshot`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from repro.text.tokenization import TextTokenizer

NUM_CHOICES = 4
MAX_QA_LENGTH = 128
LEVELS = ("middle", "high")


@dataclass(frozen=True)
class RaceQuestion:
    article: str
    question: str
    options: tuple[str, str, str, str]
    label: int  # index of the correct option
    level: str
    passage_id: str


def questions_of(records: Iterable[dict], level: str) -> list[RaceQuestion]:
    """Flatten RACE passages into questions (file order, then question order)."""
    out = []
    for record in records:
        for question, options, answer in zip(record["questions"], record["options"], record["answers"]):
            if len(options) != NUM_CHOICES:
                raise ValueError(f"RACE passage {record['id']!r}: question has {len(options)} options, expected 4")
            label = ord(answer) - ord("A")
            if not 0 <= label < NUM_CHOICES:
                raise ValueError(f"RACE passage {record['id']!r}: answer {answer!r} is not one of A-D")
            out.append(RaceQuestion(record["article"], question, tuple(options), label, level, record["id"]))
    return out


def clean_text(text: str) -> str:
    """Megatron's cleanup: newlines to spaces, whitespace runs to one space, " . " to ". " (three passes)."""
    text = re.sub(r"\s+", " ", text.replace("\n", " "))
    for _ in range(3):
        text = text.replace(" . ", ". ")
    return text


def question_with_option(question: str, option: str) -> str:
    return question.replace("_", option) if "_" in question else " ".join([question, option])


def pair_ids(question_ids: Sequence[int], article_ids: Sequence[int], max_seq_length: int,
             tokenizer: TextTokenizer) -> tuple[list[int], list[int], list[int]]:
    """``[CLS] A [SEP] B [SEP]`` trimmed to ``max_seq_length`` (the trim keeps a final [SEP]) and padded:
    returns (ids, token types, attention mask). Matches Megatron's build_tokens_types_paddings_from_ids."""
    ids = [tokenizer.cls_id, *question_ids, tokenizer.sep_id]
    types = [0] * len(ids)
    ids += list(article_ids)
    types += [1] * len(article_ids)
    if len(ids) >= max_seq_length:
        ids, types = ids[: max_seq_length - 1], types[: max_seq_length - 1]
    ids.append(tokenizer.sep_id)
    types.append(1)
    mask = [1] * len(ids)
    padding = max_seq_length - len(ids)
    return ids + [tokenizer.pad_id] * padding, types + [tokenizer.pad_id] * padding, mask + [0] * padding


@dataclass(frozen=True)
class RaceTensors:
    """Tokenized multiple-choice samples: ids/types/mask ``[N, 4, S]``, labels ``[N]``, levels (per question)."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    levels: tuple[str, ...]

    def __len__(self) -> int:
        return self.labels.shape[0]

    def subset(self, index: torch.Tensor) -> "RaceTensors":
        return RaceTensors(self.input_ids[index], self.token_type_ids[index], self.attention_mask[index],
                           self.labels[index], tuple(self.levels[i] for i in index.tolist()))


def tokenize_questions(questions: Sequence[RaceQuestion], tokenizer: TextTokenizer, max_seq_length: int,
                       max_qa_length: int = MAX_QA_LENGTH) -> RaceTensors:
    """Megatron's RACE samples for a BERT tokenizer (needs [CLS], [SEP], [PAD])."""
    if None in (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id):
        raise ValueError(f"tokenizer {tokenizer.name!r} lacks [CLS]/[SEP]/[PAD]; RACE finetuning needs a BERT vocab")
    if max_seq_length < 8:
        raise ValueError(f"max_seq_length={max_seq_length} is too short for [CLS] question [SEP] article [SEP]")
    article_cache: dict[str, list[int]] = {}
    ids, types, masks = [], [], []
    for q in questions:
        if q.article not in article_cache:
            article_cache[q.article] = tokenizer.encode(clean_text(q.article))
        article_ids = article_cache[q.article]
        qa_texts = [clean_text(question_with_option(q.question, option)) for option in q.options]
        for qa_ids in tokenizer.encode_batch(qa_texts):
            row = pair_ids(qa_ids[:max_qa_length], article_ids, max_seq_length, tokenizer)
            ids.append(row[0]), types.append(row[1]), masks.append(row[2])
    shape = (len(questions), NUM_CHOICES, max_seq_length)
    return RaceTensors(
        input_ids=torch.tensor(ids, dtype=torch.long).view(shape),
        token_type_ids=torch.tensor(types, dtype=torch.long).view(shape),
        attention_mask=torch.tensor(masks, dtype=torch.long).view(shape),
        labels=torch.tensor([q.label for q in questions], dtype=torch.long),
        levels=tuple(q.level for q in questions),
    )
