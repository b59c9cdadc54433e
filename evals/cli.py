"""``python -m evals``: the evaluation harnesses from the command line.

Every command reads the verified data directory (``--data-dir``, else ``$REPRO_DATA``, else ``../shared/data`` beside a
checkout, else the per-user data directory: :func:`repro.text.data_files.default_data_dir`), prints a table, and writes
result rows with provenance to ``results/evals/<command>/<run_id>.jsonl`` (``--results-dir`` to change the root,
``--no-write`` to skip). Bad input, and an optional package a command needs but that is not installed (``datasets``,
``tokenizers``, ``lm-eval``), print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from repro.cliargs import OneLineParser, int_at_least, non_negative_int, positive_float, positive_int, seed
from repro.optional import MissingPackage
from repro.text.data_files import DEFAULT_DATA_DIR_TEXT
from evals.tasks import MIN_WIKITEXT_TOKENS, WIKITEXT_TOKENS_WHY

EPILOG = """
definitions (see evals/README.md for which paper uses which):
  WikiText-103  token ppl: exp(NLL / (T-1)) over GPT-2 BPE tokens with Megatron's overlapping windows
                adjusted ppl: exp(NLL / (T_o-1)), T_o = 245,566 original tokens (Megatron-LM Table 3)
                word ppl / bits per byte: lm-eval's wikitext task (per article, disjoint windows)
  LAMBADA       strict (whole last word, Megatron --strict-lambada), nonstrict (last BPE token),
                lm_eval (lambada_openai)
  RACE          finetuned multiple-choice BERT (Megatron, Table 5) and lm-eval's zero-shot race task

examples:
  python -m evals count
  python -m evals lambada --checkpoint ~/gpt2-medium --batch-size 16
  python -m evals wikitext --checkpoint ~/megatron_lm_345m --seq-len 1024 --stride 32 --device cuda
  python -m evals wikitext --checkpoint scratch/toy/gpt --tp 2 --seq-len 128 --stride 32
  python -m evals convert-hf --hf-dir ~/gpt2-medium --out scratch/gpt2-medium-tp2 --tp 2
  python -m evals toy-e2e --train-seconds 240
"""


def _print_rows(rows: Sequence[dict[str, Any]]) -> None:
    from evals.records import table

    print(table(rows))


def _write(args, rows, task: str, started: float, config: dict) -> None:
    if args.no_write or not rows:
        return
    from evals.records import write_rows

    path = write_rows(rows, task=task, config=config, started=started, results_root=args.results_dir)
    print(f"rows written to {path}")


def cmd_count(args) -> list[dict]:
    from evals.counts import dataset_counts

    rows = dataset_counts(args.data_dir)
    for r in rows:
        print(f"  {r['dataset']:<12} {r['split']:<6} {r['level']:<7} {r['metric']:<26} {r['value']:>10,}")
    return rows


CHECKPOINT_HELP = ("checkpoint directory, format detected: repro (repro_checkpoint.json), repro train's (its --save "
                   "directory, or one iter_N/ with manifest.json and trainer.json, at any tp x pp x dp layout), "
                   "Hugging Face GPT-2 (config.json + weights) or Megatron-LM in its own format "
                   "(latest_checkpointed_iteration.txt, release/ or iter_*/ with mp_rank_XX[_YYY]/model_optim_rng.pt "
                   "tp/pp shards)")


def _device(args):
    """The device context of an evaluation (models on ``--device``); CUDA runs at --tp 1 in this process."""
    from evals.model_builders import eval_device

    if args.device != "cpu" and args.tp > 1:
        raise ValueError(f"--device {args.device} evaluates at --tp 1 only (tp > 1 runs gloo ranks on CPU); "
                         f"got --tp {args.tp}")
    return eval_device(args.device)


def eval_spec(args, task: str):
    """The spec of ``task`` from a command's options; a task option the command lacks (``reconcile`` takes only
    ``--stride``) keeps its default."""
    from evals.tasks import TASKS, EvalSpec

    options = {option.name: getattr(args, option.name) for option in TASKS[task].options if hasattr(args, option.name)}
    return EvalSpec(task=task, checkpoint=args.checkpoint, data_dir=args.data_dir, tp=args.tp, seq_len=args.seq_len,
                    batch_size=args.batch_size, limit=args.limit, progress=not args.quiet,
                    bootstrap_iters=args.bootstrap_iters, options=options)


def cmd_eval(args) -> list[dict]:
    from evals.tasks import run_at_tp, task_of_command

    with _device(args):
        rows = run_at_tp(eval_spec(args, task_of_command(args.command).name))
    _print_rows(rows)
    return rows


def cmd_reconcile(args) -> list[dict]:
    from evals.reconcile import markdown, reconciliation_rows
    from evals.tasks import run_at_tp

    with _device(args):
        rows = run_at_tp(eval_spec(args, "wikitext")) + run_at_tp(eval_spec(args, "lambada"))
    measured = None
    if args.with_lm_eval:
        from evals.lm_eval_adapter import lm_eval_measure

        measured = lm_eval_measure(args.checkpoint, args.data_dir, args.limit, args.seq_len, args.batch_size)
    print(markdown(reconciliation_rows(rows, measured), title=f"Reconciliation: {args.checkpoint}"))
    return rows


def cmd_race_finetune(args) -> list[dict]:
    from evals.race_finetune import FinetuneConfig
    from evals.race_run import RaceFinetuneSpec, run_race_finetune

    model = {"hidden_size": args.hidden_size, "num_layers": args.num_layers,
             "num_attention_heads": args.num_attention_heads, "max_position_embeddings": args.max_seq_length}
    spec = RaceFinetuneSpec(
        init=args.init, model=model, max_seq_length=args.max_seq_length, train_limit=args.train_limit,
        eval_limit=args.eval_limit, data_dir=args.data_dir, save_to=args.save, device=args.device,
        finetune=FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                                max_steps=args.max_steps),
        progress=not args.quiet,
    )
    rows = run_race_finetune(spec)
    _print_rows(rows)
    return rows


def cmd_convert_hf(args) -> list[dict]:
    from evals.checkpoints import save_consolidated, save_shard
    from evals.hf_convert import load_hf
    from repro.models import shard_state_dict

    loaded = load_hf(args.hf_dir, expect=args.arch)
    meta = {"converted_from": str(args.hf_dir), "hf_sha256": loaded.sha256}
    if args.tp == 1:
        save_consolidated(args.out, loaded.state_dict, architecture=args.arch, config=loaded.config, meta=meta)
    else:
        for rank in range(args.tp):
            save_shard(args.out, shard_state_dict(loaded.state_dict, loaded.config, rank, args.tp),
                       architecture=args.arch, config=loaded.config, tp_rank=rank, tp_size=args.tp, meta=meta)
    print(f"converted {args.hf_dir} ({args.arch}, {loaded.config.num_layers} layers, hidden "
          f"{loaded.config.hidden_size}) -> {args.out} at tp={args.tp}")
    return []


def cmd_toy(args) -> list[dict]:
    from evals.toy import ToySpec, run_toy

    spec = ToySpec(out_dir=args.out, data_dir=args.data_dir, train_seconds=args.train_seconds,
                   race_train_questions=args.race_train_questions, race_eval_questions=args.race_eval_questions,
                   with_lm_eval=not args.no_lm_eval, tp_check=args.tp_check, progress=not args.quiet,
                   eval_limit=args.eval_limit, wikitext_max_tokens=args.wikitext_max_tokens)
    rows, report = run_toy(spec)
    print(report)
    return rows


def _results_dir(text: str) -> str:
    """``--results-dir``: a directory, created when missing; a name too long, a file or a path under a file is
    refused while parsing, a directory that cannot be written by :func:`check_paths` (both before any work: the
    rows are written at the end, after the evaluation)."""
    from repro.paths import writable_dir_problem

    problem = writable_dir_problem(text, write=False)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return text


def _hf_dir_problem(text: str) -> str | None:
    """Why ``--hf-dir`` is not a Hugging Face model directory (None when it has a config.json)."""
    import os
    from pathlib import Path

    from repro.input_files import directory_problem, regular_file_problem

    from repro.paths import name_problem

    problem = name_problem(text)
    if problem is not None:
        return problem
    kind = directory_problem(text)
    if kind is not None:
        return (kind if "not a directory" not in kind
                else f"{kind}; it must be a Hugging Face model directory (config.json + weights)")
    if not os.path.lexists(Path(text) / "config.json"):
        return "holds no config.json: it is not a Hugging Face model directory"
    return regular_file_problem(Path(text) / "config.json") and (
        f"has a config.json that {regular_file_problem(Path(text) / 'config.json')}")


def check_paths(args: argparse.Namespace) -> str | None:
    """The first path or device of the command line that cannot be used, as one line (None when all can), checked
    before any work: the results root (unless --no-write), and each command's own directories and device."""
    from repro.paths import writable_dir_problem
    from repro.results import results_dir

    if not args.no_write:
        root = results_dir(args.results_dir)
        problem = writable_dir_problem(root, create=False)
        if problem is not None:
            origin = "--results-dir" if args.results_dir is not None else "results directory"
            return f"{origin} {str(root)!r} {problem}"
    outputs = {"race-finetune": ("--save", "save"), "convert-hf": ("--out", "out"), "toy-e2e": ("--out", "out")}
    flag, name = outputs.get(args.command, (None, None))
    if flag is not None and getattr(args, name) is not None:
        problem = writable_dir_problem(getattr(args, name), create=False)
        if problem is not None:
            return f"{flag} {getattr(args, name)!r} {problem}"
    if args.command == "convert-hf":
        problem = _hf_dir_problem(args.hf_dir)
        if problem is not None:
            return f"--hf-dir {args.hf_dir!r} {problem}"
    if args.command == "race-finetune":
        from evals.model_builders import check_device

        check_device(args.device)  # a ValueError naming the device
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="repro eval", description=__doc__,
                                     epilog=EPILOG)
    parser.add_argument("--data-dir", default=None, help=f"data directory (default: {DEFAULT_DATA_DIR_TEXT})")
    parser.add_argument("--results-dir", type=_results_dir, default=None,
                        help="results root (default $REPRO_RESULTS_DIR or results/)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not append result rows")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch intra-op threads (1 is fastest on a busy shared CPU)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    sub.add_parser("count", help="dataset sizes counted each protocol's way (no model)")

    def model_args(p, seq_len_help="window / context length (default: the model's max positions)"):
        p.add_argument("--checkpoint", required=True, help=CHECKPOINT_HELP)
        p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (spawns local processes)")
        p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (at --tp 1)")
        p.add_argument("--seq-len", type=positive_int, default=None, help=seq_len_help)
        p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per forward pass")
        p.add_argument("--limit", type=positive_int, default=None,
                       help="first N passages / articles only, N >= 1 (quick runs; default: all)")
        p.add_argument("--bootstrap-iters", type=non_negative_int, default=100_000, metavar="N",
                       help="resamples for a perplexity's standard error, as lm-eval's --bootstrap_iters "
                            "(0: no standard errors at all, as there)")

    from evals.tasks import TASKS

    for task in TASKS.values():  # one command per task record: the model options, then the task's own
        p = sub.add_parser(task.command, help=task.help)
        model_args(p)
        for option in task.options:
            p.add_argument(option.flag, **option.argparse_keywords())
    p = sub.add_parser("reconcile", help="one model under every definition, side by side")
    model_args(p)
    p.add_argument("--stride", type=positive_int, default=32,
                   help="new tokens scored per WikiText window (Megatron --overlapping-eval)")
    p.add_argument("--with-lm-eval", action="store_true", help="also run lm-eval itself through the adapter")

    p = sub.add_parser("race-finetune", help="finetune a multiple-choice BERT on RACE; dev/test accuracy")
    p.add_argument("--init", default=None,
                   help="pretrained BERT (repro, Hugging Face or Megatron-LM dir); default random init")
    p.add_argument("--hidden-size", type=positive_int, default=128, help="BERT hidden size (random init only)")
    p.add_argument("--num-layers", type=positive_int, default=2, help="BERT layers (random init only)")
    p.add_argument("--num-attention-heads", type=positive_int, default=4,
                   help="BERT attention heads (random init only)")
    p.add_argument("--max-seq-length", type=positive_int, default=256, help="Megatron uses 512")
    p.add_argument("--train-limit", type=non_negative_int, default=2000,
                   help="random train questions (0 = all 87,866)")
    p.add_argument("--eval-limit", type=non_negative_int, default=300,
                   help="first N questions per dev/test level (0 = all)")
    p.add_argument("--epochs", type=positive_float, default=1.0, help="passes over the train questions")
    p.add_argument("--batch-size", type=positive_int, default=16, help="questions per optimizer step")
    p.add_argument("--lr", type=positive_float, default=1e-4, help="Adam learning rate")
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop after this many steps (default: the epochs)")
    p.add_argument("--seed", type=seed, default=1234, help="seed of the init, shuffling and dropout, in [0, 2**63)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--save", default=None, help="write the finetuned model as a repro checkpoint here")

    p = sub.add_parser("convert-hf", help="Hugging Face GPT-2/BERT directory -> repro checkpoint (any tp)")
    p.add_argument("--hf-dir", required=True, help="local Hugging Face model directory (config.json + weights)")
    p.add_argument("--out", required=True, help="directory for the repro checkpoint")
    p.add_argument("--arch", default="gpt", choices=["gpt", "bert"], help="model family in --hf-dir")
    p.add_argument("--tp", type=positive_int, default=1, help="write tp shards (1: consolidated)")

    p = sub.add_parser("toy-e2e", help="train a small GPT on wiki.valid for a few CPU minutes, evaluate it on "
                                       "WikiText-103 and LAMBADA, finetune a small BERT on a RACE subset")
    p.add_argument("--out", default="scratch/evals_toy", help="checkpoints and the report go here")
    p.add_argument("--train-seconds", type=positive_float, default=240.0, help="CPU seconds of GPT training")
    p.add_argument("--race-train-questions", type=positive_int, default=2000, help="RACE questions to finetune on")
    p.add_argument("--race-eval-questions", type=positive_int, default=300, help="RACE questions to evaluate")
    p.add_argument("--no-lm-eval", action="store_true", help="skip the lm-eval column of the reconciliation table")
    p.add_argument("--tp-check", type=non_negative_int, default=500,
                   help="LAMBADA passages re-evaluated at tp=2 (0: skip)")
    p.add_argument("--eval-limit", type=positive_int, default=None,
                   help="first N LAMBADA passages / WikiText articles, N >= 1 (default: the full test sets)")
    p.add_argument("--wikitext-max-tokens", type=int_at_least(MIN_WIKITEXT_TOKENS, WIKITEXT_TOKENS_WHY), default=None,
                   help=f"BPE prefix of the WikiText stream for Megatron's windows, N >= {MIN_WIKITEXT_TOKENS} "
                        "(default: all)")
    return parser


COMMANDS = {"count": cmd_count, "reconcile": cmd_reconcile, "race-finetune": cmd_race_finetune,
            "convert-hf": cmd_convert_hf, "toy-e2e": cmd_toy}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("train_limit", "eval_limit"):
        if args.command == "race-finetune" and getattr(args, name, None) == 0:
            setattr(args, name, None)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    from evals.tasks import task_of_command

    try:
        from repro.environment import check_environment

        check_environment()  # the environment's settings, before any work
        problem = check_paths(args)
        if problem is not None:
            raise ValueError(problem)
        rows = (cmd_eval if task_of_command(args.command) else COMMANDS[args.command])(args)
    except (ValueError, MissingPackage) as err:  # bad input or a missing optional package: one line, no traceback
        print(f"repro eval: error: {err}", file=sys.stderr)
        return 2
    task = args.command.replace("-", "_")
    config = {k: v for k, v in vars(args).items() if k not in ("quiet", "no_write", "threads")}
    _write(args, rows, task, started, json.loads(json.dumps(config, default=str)))
    return 0
