"""The toy end-to-end run: every harness on real models trained here, in minutes on a CPU.

1. Train a small GPT (GPT-2 BPE, 4 layers, hidden 128) on ``wiki.valid.tokens`` for ``train_seconds``.
2. Save it as a repro checkpoint; evaluate it on WikiText-103 test (Megatron windows + lm-eval documents) and the
   full LAMBADA test under all definitions; optionally lm-eval itself through the adapter (the reconciliation
   table's last column); re-evaluate part of LAMBADA at tp=2 from the same checkpoint.
3. Finetune a small random-init BERT with a multiple-choice head on a RACE train subset; dev/test accuracy.

The numbers are real and far from the paper's (a 7M-parameter model trained for minutes on 0.24M tokens of
validation text versus 355M-8.3B parameters trained on 174 GB); the run shows the machinery, not the claims.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from evals.checkpoints import save_consolidated
from repro.text.detokenize import wikitext_detokenize
from evals.loaders import load_wikitext
from evals.race_finetune import FinetuneConfig
from evals.race_run import RaceFinetuneSpec, run_race_finetune
from evals.reconcile import markdown, reconciliation_rows
from evals.tasks import MIN_WIKITEXT_TOKENS, EvalSpec, run_at_tp, run_eval
from repro.text.tokenization import gpt2_tokenizer
from evals.toy_train import TrainConfig, train_gpt
from repro.models import GPTConfig, merge_state_dicts

TOY_GPT = dict(hidden_size=128, num_layers=4, num_attention_heads=4, max_position_embeddings=128,
               hidden_dropout=0.0, attention_dropout=0.0)


@dataclass(frozen=True)
class ToySpec:
    out_dir: str = "scratch/evals_toy"
    data_dir: str | None = None
    train_seconds: float = 240.0
    train_seq_len: int = 128
    train_batch_size: int = 8
    eval_stride: int = 32
    race_train_questions: int = 2000
    race_eval_questions: int = 300
    with_lm_eval: bool = True
    tp_check: int = 500
    eval_limit: int | None = None  # LAMBADA passages and WikiText articles (None: the full test sets)
    wikitext_max_tokens: int | None = None  # BPE prefix for Megatron's windows (None: all 270,330)
    progress: bool = True

    def __post_init__(self) -> None:
        """Counts checked before the minutes of training: whole numbers >= 1 (``tp_check`` >= 0, 0 skips it)."""
        for name in ("race_train_questions", "race_eval_questions", "eval_limit", "wikitext_max_tokens", "tp_check"):
            value = getattr(self, name)
            lowest = 0 if name == "tp_check" else MIN_WIKITEXT_TOKENS if name == "wikitext_max_tokens" else 1
            if value is not None and value < lowest:
                raise ValueError(f"{name}={value} must be an integer >= {lowest}")


def train_toy_gpt(spec: ToySpec) -> tuple[Path, dict[str, Any]]:
    tokenizer = gpt2_tokenizer(spec.data_dir)
    tokens = torch.tensor(tokenizer.encode(wikitext_detokenize(load_wikitext("valid", spec.data_dir).records)))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, **TOY_GPT)
    # a time-boxed run: the cosine schedule follows wall time (see toy_train.lr_at)
    train = TrainConfig(seq_len=spec.train_seq_len, batch_size=spec.train_batch_size, max_steps=1_000_000,
                        max_seconds=spec.train_seconds, lr=2e-3, min_lr=2e-4, warmup_steps=30)
    model, log = train_gpt(config, tokens, train, progress=spec.progress)
    path = Path(spec.out_dir) / "gpt"
    info = {"params": sum(p.numel() for p in model.parameters()), "train_tokens_available": int(tokens.numel()),
            **log.__dict__}
    save_consolidated(path, merge_state_dicts([model.state_dict()], config), architecture="gpt", config=config,
                      meta={"trained_on": "wikitext103/wiki.valid.tokens", **info})
    return path, info


def run_toy(spec: ToySpec) -> tuple[list[dict[str, Any]], str]:
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    checkpoint, train_info = train_toy_gpt(spec)
    timings["train_gpt"] = time.perf_counter() - start

    base = EvalSpec(task="wikitext", checkpoint=str(checkpoint), data_dir=spec.data_dir, seq_len=spec.train_seq_len,
                    batch_size=32, limit=spec.eval_limit, progress=spec.progress,
                    options={"stride": spec.eval_stride, "max_tokens": spec.wikitext_max_tokens})
    start = time.perf_counter()
    rows = run_eval(base)
    timings["eval_wikitext"] = time.perf_counter() - start
    start = time.perf_counter()
    rows += run_eval(replace(base, task="lambada", options={}))
    timings["eval_lambada"] = time.perf_counter() - start

    measured = None
    if spec.with_lm_eval:
        try:
            from evals.lm_eval_adapter import lm_eval_measure

            start = time.perf_counter()
            measured = lm_eval_measure(str(checkpoint), spec.data_dir, spec.eval_limit, spec.train_seq_len, 32)
            timings["lm_eval_itself"] = time.perf_counter() - start
        except ImportError as err:
            print(f"lm-eval column skipped: {err}")
    table = reconciliation_rows(rows, measured)

    tp_rows: list[dict[str, Any]] = []
    if spec.tp_check:
        start = time.perf_counter()
        check = replace(base, task="lambada", limit=spec.tp_check, progress=False, options={})
        tp_rows = [run_eval(check), run_at_tp(replace(check, tp=2))]
        timings["tp_check"] = time.perf_counter() - start

    start = time.perf_counter()
    race_rows = run_race_finetune(RaceFinetuneSpec(
        train_limit=spec.race_train_questions, eval_limit=spec.race_eval_questions, data_dir=spec.data_dir,
        finetune=FinetuneConfig(epochs=1.0, batch_size=16, lr=2e-4), progress=spec.progress,
        save_to=str(out / "bert_race")))
    timings["race_finetune"] = time.perf_counter() - start

    report = render_report(train_info, table, tp_rows, race_rows, timings)
    (out / "report.md").write_text(report)
    (out / "rows.json").write_text(json.dumps(rows + race_rows, indent=1, default=str))
    return rows + race_rows, report


def render_report(train_info, table, tp_rows, race_rows, timings) -> str:
    lines = ["# Toy end-to-end evaluation run", "",
             f"GPT: {train_info['params']:,} parameters, {train_info['steps']} steps, {train_info['tokens']:,} "
             f"training tokens in {train_info['seconds']:.0f} s on wiki.valid.tokens "
             f"({train_info['train_tokens_available']:,} BPE tokens); train loss {train_info['first_loss']:.2f} -> "
             f"{train_info['final_loss']:.2f}.", "",
             markdown(table, title="Reconciliation table (toy GPT)"), ""]
    if tp_rows:
        lines += ["### Same checkpoint at tp=1 and tp=2 (LAMBADA subset)", "",
                  "| metric | definition | tp=1 | tp=2 |", "|---|---|---|---|"]
        for a, b in zip(*tp_rows):
            lines.append(f"| {a['metric']} | {a['definition']} | {a['value']:.6f} | {b['value']:.6f} |")
        lines.append("")
    lines += ["### RACE (random-init BERT, finetuned on a train subset)", "", "| metric | definition | value |",
              "|---|---|---|"]
    for r in race_rows:
        value = f"{r['value']:.4f}" if isinstance(r["value"], float) else str(r["value"])
        lines.append(f"| {r['metric']} | {r['definition']} | {value} {r['unit']} |")
    lines += ["", "Timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()), "",
              "These numbers are far from the papers' (a tiny model trained for minutes); they show that every "
              "harness runs end to end on repro models."]
    return "\n".join(lines)
