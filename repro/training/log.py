"""What the trainer reports: Megatron-LM's ``iteration ... |`` lines on rank 0, every step as JSONL, TensorBoard.

A line every ``log_interval`` iterations averages the interval as Megatron's ``training_log`` does (a timestamp, time
per iteration, model TFLOP/s per rank by the paper's formula under Megatron's key ``throughput per GPU (TFLOP/s/GPU)``
on GPUs, ``throughput per CPU rank (TFLOP/s/rank)`` on a CPU, where no GPU is counted, tokens/s, MFU, the largest
rank's peak memory, learning rate, lm loss, loss scale, grad norm, skipped iterations; the lm loss of a line is the
interval's mean, as Megatron's, and :attr:`TrainingLog.last_window` says which iterations the last line averaged);
:func:`arguments_block` is Megatron's list of arguments, printed once at the start. The JSONL file gets one record per
iteration (and per validation), appended, so a requeued job continues the same file; TensorBoard scalars go to
``tensorboard_dir`` and W&B gets the same numbers (``wandb``: ``wandb.init``'s arguments); the start check refuses
either when its package is not installed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO


#: the per-iteration numbers TensorBoard and W&B get (as "lm loss", "learning rate", ...)
SCALARS = ("lm_loss", "learning_rate", "grad_norm", "loss_scale", "tokens_per_s", "tflops_per_rank", "mfu",
           "max_memory_mib")


class TrainingLog:
    """Rank 0's report of a run (other ranks pass ``enabled=False`` and print nothing)."""

    def __init__(self, *, total_iters: int, log_interval: int = 1, jsonl: str | Path | None = None,
                 tensorboard_dir: str | Path | None = None, enabled: bool = True, stream: TextIO | None = None,
                 wandb: dict[str, Any] | None = None, per: str = "GPU") -> None:
        if not isinstance(log_interval, int) or log_interval < 1:
            raise ValueError(f"log_interval={log_interval!r} must be a positive integer")
        self.total_iters, self.log_interval, self.enabled = total_iters, log_interval, enabled
        self.stream = stream if stream is not None else sys.stdout
        #: what one rank is in the throughput key: "GPU" (Megatron's key), or "CPU rank" on a CPU
        self.per = per
        #: (first iteration, last iteration, mean lm loss) of the last printed line; None before the first
        self.last_window: tuple[int, int, float] | None = None
        self._window: list[dict[str, Any]] = []
        self._jsonl = None
        self._tb = None
        if enabled and jsonl is not None:
            Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(jsonl, "a", buffering=1)  # noqa: SIM115 - closed in close()
        if enabled and tensorboard_dir is not None:  # the start check made sure tensorboard is installed
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tensorboard_dir))
        self._wandb = None
        if enabled and wandb is not None:  # wandb.init(project, name, dir, group, entity, config)
            import wandb as wandb_module

            self._wandb = wandb_module.init(**{k: v for k, v in wandb.items() if v is not None})

    def print(self, line: str) -> None:
        if self.enabled:
            print(line, file=self.stream, flush=True)

    def error(self, line: str) -> None:
        """A run's one error line (a non-finite loss, a failed save): on stderr, where a batch script looks."""
        if self.enabled:
            sys.stdout.flush()
            print(line, file=sys.stderr, flush=True)

    def event(self, kind: str, **fields: Any) -> None:
        """A record of something other than a step (start, resume, save, validation, preemption, end)."""
        self._write({"event": kind, "time": time.time(), **fields})
        if self._tb is not None and kind == "validation":
            self._tb.add_scalar("lm loss validation", fields["lm_loss"], fields["iteration"])
        if self._wandb is not None and kind == "validation":
            self._wandb.log({"lm loss validation": fields["lm_loss"]}, step=fields["iteration"])

    def step(self, record: dict[str, Any]) -> None:
        """One training iteration's numbers (``iteration`` counts from 1 here, as Megatron prints it)."""
        if not self.enabled:
            return
        self._write({"event": "iteration", "time": time.time(), **record})
        scalars = {key.replace("_", " "): record[key] for key in SCALARS if record.get(key) is not None}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, record["iteration"])
        if self._wandb is not None:
            self._wandb.log(scalars, step=record["iteration"])
        self._window.append(record)
        if record["iteration"] % self.log_interval == 0 or record["iteration"] == self.total_iters:
            self.print(self.line(self._window))
            window = self._window
            self.last_window = (window[0]["iteration"], window[-1]["iteration"],
                                sum(r["lm_loss"] for r in window) / len(window))
            self._window = []

    def _write(self, record: dict[str, Any]) -> None:
        """Append one JSONL record. A file that stops taking writes (a full disk) ends the JSON log with one line,
        not the run: the checkpoints that follow say for themselves whether they could be written."""
        if self._jsonl is None:
            return
        try:
            self._jsonl.write(json.dumps(record) + "\n")
        except OSError as err:
            self._give_up_jsonl(err)

    def _give_up_jsonl(self, err: OSError) -> None:
        name = getattr(self._jsonl, "name", "the JSONL log")
        try:
            self._jsonl.close()
        except OSError:
            pass
        self._jsonl = None
        self.print(f"warning: cannot write {name} ({err.strerror or err}); the JSON log stops here, training goes "
                   "on")

    def line(self, window: list[dict[str, Any]]) -> str:
        last = window[-1]
        n = len(window)

        def mean(key: str) -> float:
            return sum(r[key] for r in window) / n

        norms = [r["grad_norm"] for r in window if r.get("grad_norm") is not None]
        width = len(str(self.total_iters))
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.get("time", time.time())))
        mfus = [r["mfu"] for r in window if r.get("mfu") is not None]
        memory = ([f"{last['memory_kind']} (MiB, largest rank): {last['max_memory_mib']:.1f}"]
                  if last.get("max_memory_mib") is not None else [])
        parts = [
            f" [{stamp}] iteration {last['iteration']:>{width}}/{self.total_iters:>{width}}",
            f"consumed samples: {last['consumed_samples']:>8}",
            f"elapsed time per iteration (ms): {1000 * mean('iteration_s'):.1f}",
            # a CPU rank's TFLOP/s are small (1e-5..1e-2): six decimals, so that a slow step does not print 0
            f"throughput per {self.per} (TFLOP/s/{self.per.split()[-1]}): "
            f"{mean('tflops_per_rank'):.{4 if self.per == 'GPU' else 6}f}",
            f"tokens per second: {mean('tokens_per_s'):.1f}",
            f"MFU: {100 * sum(mfus) / len(mfus):.1f} %" if mfus else "MFU: n/a",
            *memory,
            f"learning rate: {last['learning_rate']:.6E}",
            f"global batch size: {last['global_batch_size']:>5}",
            f"lm loss: {mean('lm_loss'):.6E}",
            f"loss scale: {last['loss_scale']:.1f}",
            f"grad norm: {sum(norms) / len(norms):.3f}" if norms else "grad norm: n/a",
            f"number of skipped iterations: {last['skipped_iterations']:>3}",
            f"number of nan iterations: {sum(1 for r in window if not math.isfinite(r['lm_loss'])):>3}",
        ]
        return " | ".join(parts) + " |"

    def close(self) -> None:
        if self._jsonl is not None:
            try:
                self._jsonl.close()
            except OSError as err:  # the last buffered line could not be written
                self._give_up_jsonl(err)
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def arguments_block(values: dict[str, Any]) -> str:
    """The resolved arguments as Megatron-LM prints them at start-up: one ``  name .... value`` line each, sorted,
    between two rulers."""
    width = max((len(name) for name in values), default=0) + 4
    lines = [f"  {name} {'.' * (width - len(name))} {value}" for name, value in sorted(values.items())]
    return "\n".join(["------------------------ arguments ------------------------", *lines,
                      "-------------------- end of arguments ---------------------"])
