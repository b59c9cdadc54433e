"""A RACE finetuning run end to end: data -> tokenized samples -> finetune -> dev/test accuracy rows.

Megatron-LM's recipe (paper sec. 5.3, Table 5; tasks/race): BERT encoder from a pretrained checkpoint,
sequence length 512, question side <= 128 tokens, batch 32, lr 1e-5 (Table 6 of the paper's appendix lists
the per-model values), 3 epochs, accuracy on dev and test for middle, high and all. ``init=None`` starts from a
random BERT (the toy run: no pretrained BERT is available here), so its accuracy stays near chance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from evals.checkpoint_formats import load_checkpoint
from evals.checkpoints import save_consolidated
from evals.loaders import load_race
from evals.multiple_choice import MultipleChoiceModel
from evals.race_data import LEVELS, questions_of, tokenize_questions
from evals.stderr import mean_stderr
from evals.race_finetune import FinetuneConfig, accuracy_by_level, finetune, predict
from evals.records import row
from repro.text.tokenization import bert_tokenizer, check_vocab_compatible
from repro.models import BertConfig, merge_state_dicts


@dataclass(frozen=True)
class RaceFinetuneSpec:
    """``train_limit`` questions are drawn at random (seeded) from train middle+high; ``eval_limit`` keeps the
    first N questions of each dev/test level. ``None`` means all (the paper's setting)."""

    init: str | None = None  # BERT checkpoint (repro or Hugging Face); None: random init with ``model``
    model: dict[str, Any] = field(default_factory=lambda: {
        "hidden_size": 128, "num_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256})
    max_seq_length: int = 256
    train_limit: int | None = 2000
    eval_limit: int | None = 300
    finetune: FinetuneConfig = FinetuneConfig(epochs=1.0, batch_size=16, lr=1e-4)
    eval_splits: tuple[str, ...] = ("dev", "test")
    data_dir: str | None = None
    save_to: str | None = None
    device: str = "cpu"
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("train_limit", "eval_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be >= 1 (None: all questions)")
        if self.max_seq_length < 1:
            raise ValueError(f"max_seq_length={self.max_seq_length} must be >= 1")


def build_model(spec: RaceFinetuneSpec, vocab_size: int) -> tuple[MultipleChoiceModel, str, str | None]:
    if spec.init is None:
        config = BertConfig(vocab_size=vocab_size, **spec.model)
        torch.manual_seed(spec.finetune.seed)
        return MultipleChoiceModel(config), "random-init BERT", None
    loaded = load_checkpoint(spec.init, expect="bert")
    if loaded.config.vocab_size != vocab_size:
        raise ValueError(f"BERT checkpoint {spec.init!r} has vocab_size={loaded.config.vocab_size}, the WordPiece "
                         f"vocabulary has {vocab_size}")
    torch.manual_seed(spec.finetune.seed)
    model = MultipleChoiceModel(loaded.config)
    model.load_encoder(loaded.state_dict)
    return model, f"{loaded.source}:{spec.init}", loaded.sha256


def run_race_finetune(spec: RaceFinetuneSpec) -> list[dict[str, Any]]:
    tokenizer = bert_tokenizer(spec.data_dir)
    model, name, init_sha = build_model(spec, tokenizer.vocab_size)
    check_vocab_compatible(tokenizer, model.config.vocab_size)
    if spec.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(f"max_seq_length={spec.max_seq_length} exceeds max_position_embeddings="
                         f"{model.config.max_position_embeddings}")
    train_questions, shas = [], []
    for level in LEVELS:
        loaded = load_race("train", level, spec.data_dir)
        train_questions += questions_of(loaded.records, level)
        shas.append(loaded.data_sha256)
    if spec.train_limit is not None and spec.train_limit < len(train_questions):
        pick = torch.randperm(len(train_questions), generator=torch.Generator().manual_seed(spec.finetune.seed))
        train_questions = [train_questions[i] for i in pick[: spec.train_limit].tolist()]
    train = tokenize_questions(train_questions, tokenizer, spec.max_seq_length)
    model.to(spec.device)
    log = finetune(model, train, spec.finetune, progress=spec.progress, device=spec.device)
    settings = {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("data_dir", "progress", "save_to")}
    settings["train_questions"] = len(train_questions)
    kw = dict(task="race", model=name, checkpoint_sha256=init_sha, settings=settings)
    rows = [
        row("finetune_first_loss", log.first_loss, "nats", definition="megatron_finetune", data_sha256=",".join(shas), **kw),
        row("finetune_last_loss", log.last_loss, "nats", definition="megatron_finetune", data_sha256=",".join(shas), **kw),
        row("finetune_steps", log.steps, "count", definition="megatron_finetune", data_sha256=",".join(shas), **kw),
        row("finetune_seconds", log.seconds, "s", definition="megatron_finetune", data_sha256=",".join(shas), **kw),
    ]
    for split in spec.eval_splits:
        questions, split_shas = [], []
        for level in LEVELS:
            loaded = load_race(split, level, spec.data_dir)
            questions += questions_of(loaded.records, level)[: spec.eval_limit]
            split_shas.append(loaded.data_sha256)
        data = tokenize_questions(questions, tokenizer, spec.max_seq_length)
        accuracy = accuracy_by_level(predict(model, data, progress=spec.progress, device=spec.device),
                                     data.labels, data.levels)
        for level, result in accuracy.items():
            scores = [1.0] * result["correct"] + [0.0] * (result["total"] - result["correct"])  # lm-eval's mean_stderr
            error = mean_stderr(scores)
            rows.append(row("accuracy", 100.0 * result["accuracy"], "%", definition=f"megatron_finetune_{split}_{level}",
                            data_sha256=",".join(split_shas), stderr=None if error is None else 100.0 * error, **kw))
            rows.append(row("questions", result["total"], "count", definition=f"megatron_finetune_{split}_{level}",
                            data_sha256=",".join(split_shas), **kw))
    if spec.save_to:
        model.cpu()
        save_consolidated(spec.save_to, merge_state_dicts([model.state_dict()], model.config),
                          architecture="bert_multiple_choice", config=model.config, meta={"rows": len(rows)})
    return rows
