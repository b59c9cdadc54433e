"""``python -m repro.training``: train a small GPT under tp x pp x dp, from torchrun, srun or a single process.

    torchrun --nproc-per-node 8 -m repro.training --tp 2 --pp 2 --dp 2 --steps 20
    srun -n 8 python -m repro.training --tp 2 --pp 2 --dp 2

Rank 0 prints one line per step (``step <i> loss <value>``). A failing rank exits at once and the others follow
(see :mod:`repro.training.failfast`): ``--timeout-s`` bounds every collective and receive, ``--watchdog-s`` the time
between two pipeline actions.
"""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from repro.dist import init_distributed, init_parallel
from repro.models import GPTConfig
from repro.training.failfast import Watchdog, run_fail_fast
from repro.training.trainer import train_gpt


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m repro.training", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--tp", type=int, default=1)
    add("--pp", type=int, default=1)
    add("--dp", type=int, default=None, help="default: world size / (tp x pp)")
    add("--steps", type=int, default=20)
    add("--micro-batches", type=int, default=4)
    add("--micro-batch-size", type=int, default=2)
    add("--seq-len", type=int, default=32)
    add("--layers", type=int, default=4)
    add("--hidden", type=int, default=64)
    add("--heads", type=int, default=4)
    add("--vocab", type=int, default=256)
    add("--lr", type=float, default=1e-3)
    add("--clip-grad", type=float, default=1.0)
    add("--zero-stage", type=int, default=0, choices=(0, 1))
    add("--seed", type=int, default=0)
    add("--timeout-s", type=float, default=30.0, help="process-group timeout of every collective / receive")
    add("--watchdog-s", type=float, default=60.0, help="exit when no pipeline action starts for this long")
    return parser.parse_args(argv)


def train(args: argparse.Namespace, *, on_action: Callable[[str, int], None] | None = None,
          on_step: Callable | None = None) -> list[float]:
    init_distributed(timeout_s=args.timeout_s)
    groups = init_parallel(tp=args.tp, pp=args.pp, dp=args.dp)
    config = GPTConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                       num_attention_heads=args.heads, max_position_embeddings=args.seq_len,
                       hidden_dropout=0.0, attention_dropout=0.0)

    def report(step, loss, trainer):
        if groups.rank == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
        if on_step is not None:
            on_step(step, loss, trainer)

    with Watchdog(args.watchdog_s) as watchdog:
        def action(kind: str, micro_batch: int) -> None:
            watchdog.beat()
            if on_action is not None:
                on_action(kind, micro_batch)

        return train_gpt(config, groups, args.steps, args.micro_batches, micro_batch_size=args.micro_batch_size,
                         seq_len=args.seq_len, lr=args.lr, clip_grad=args.clip_grad, zero_stage=args.zero_stage,
                         seed=args.seed, on_step=report, on_action=action)


def main(argv: Sequence[str] | None = None, *, on_action: Callable[[str, int], None] | None = None) -> int:
    args = parse_args(argv)

    def job() -> int:
        train(args, on_action=on_action)
        return 0

    return run_fail_fast(job)
