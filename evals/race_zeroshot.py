"""Zero-shot RACE as lm-eval's ``race`` task defines it (GPT-3 paper protocol, Brown et al. 2020, sec. 3.6).

One document per article. The prompt is::

    "Article: " + article + "\\n\\n"
    + for each earlier question of the article:
          a fill-in question ending in "  _  ." -> the question with the answer put in the blank, + "\\n"
          otherwise                          -> "Question: " + q + "\\n" + "Answer: " + answer + "\\n"
    + the last question

and each of the 4 options is scored as the continuation ``" " + option``; the prediction is the option with the
highest summed log-likelihood (metric ``acc``; no length normalisation). lm-eval evaluates RACE-high test
(1,045 articles); middle and all are available here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from evals.lambada import encode_pair
from evals.race_data import NUM_CHOICES
from evals.scoring import CausalLM, score_continuations
from repro.text.tokenization import TextTokenizer

ANSWER_INDEX = {"A": 0, "B": 1, "C": 2, "D": 3}


@dataclass(frozen=True)
class RaceDocument:
    prompt: str
    options: tuple[str, ...]
    label: int
    level: str


def _answer(options: Sequence[str], letter: str) -> str:
    return options[ANSWER_INDEX[letter]]


def build_prompt(article: str, questions: Sequence[str], options: Sequence[Sequence[str]],
                 answers: Sequence[str]) -> str:
    text = "Article: " + article + "\n\n"
    for question, opts, letter in zip(questions[:-1], options[:-1], answers[:-1]):
        if question.endswith("  _  ."):
            text += question[:-5] + _answer(opts, letter) + "\n"
        else:
            text += "Question: " + question + "\n" + "Answer: " + _answer(opts, letter) + "\n"
    return text + questions[-1]


def documents_of(records: Sequence[dict], level: str) -> list[RaceDocument]:
    """lm-eval documents: articles grouped by text (file order kept), the last question is the one asked."""
    grouped: dict[str, dict] = {}
    for record in records:
        entry = grouped.setdefault(record["article"], {"questions": [], "options": [], "answers": []})
        for key in ("questions", "options", "answers"):
            entry[key].extend(record[key])
    docs = []
    for article, entry in grouped.items():
        last_options = tuple(entry["options"][-1])
        if len(last_options) != NUM_CHOICES:
            raise ValueError(f"RACE article {article[:40]!r}...: last question has {len(last_options)} options")
        docs.append(RaceDocument(
            prompt=build_prompt(article, entry["questions"], entry["options"], entry["answers"]),
            options=last_options, label=ANSWER_INDEX[entry["answers"][-1]], level=level,
        ))
    return docs


def lm_eval_problems(record: dict) -> str:
    """The ``problems`` column of EleutherAI/race (a Python-literal list) for one article, to feed lm-eval itself."""
    problems = [{"answer": a, "options": list(o), "question": q}
                for q, o, a in zip(record["questions"], record["options"], record["answers"])]
    return repr(problems)


@dataclass(frozen=True)
class RaceZeroShotResult:
    predictions: tuple[int, ...]
    labels: tuple[int, ...]
    levels: tuple[str, ...]

    def correct(self, level: str = "all") -> list[bool]:
        """Per document of ``level`` (or all): whether the prediction is the answer."""
        picked = [p == y for p, y, lv in zip(self.predictions, self.labels, self.levels) if level in ("all", lv)]
        if not picked:
            raise ValueError(f"no RACE documents of level {level!r}")
        return picked

    def accuracy(self, level: str = "all") -> float:
        picked = self.correct(level)
        return sum(picked) / len(picked)


def evaluate_race_zeroshot(model: CausalLM, tokenizer: TextTokenizer, docs: Sequence[RaceDocument], *,
                           batch_size: int = 8, progress: bool = True) -> RaceZeroShotResult:
    requests = [encode_pair(doc.prompt, " " + option, tokenizer) for doc in docs for option in doc.options]
    scores = score_continuations(model, requests, batch_size=batch_size, pad_id=tokenizer.eod_id or 0,
                                 desc="race zero-shot", progress=progress)
    predictions = []
    for i in range(len(docs)):
        logprobs = [s.logprob for s in scores[i * NUM_CHOICES:(i + 1) * NUM_CHOICES]]
        predictions.append(max(range(NUM_CHOICES), key=lambda k: (logprobs[k], -k)))
    return RaceZeroShotResult(tuple(predictions), tuple(d.label for d in docs), tuple(d.level for d in docs))
