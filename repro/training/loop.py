"""The training loop of ``repro train``: batches by consumed samples, logging, validation, saves, preemption.

Megatron-LM's ``train()`` in small: each iteration reads global batch ``consumed_samples .. + B`` of the training
source, steps, logs; every ``eval_interval`` iterations it computes the loss on fixed held-out batches; every
``save_interval`` iterations (and at the end) it saves; after every step the ranks agree whether a preemption
signal arrived (:mod:`repro.training.preemption`) and, if so, save and stop with ``preempted=True``.

``activity(what)`` is told what the loop starts next ("step 12", "evaluation at iteration 10: batch 1/2", "saving
checkpoint iteration 12: writing rank00001.pt"): the watchdog's heartbeat, and what it names when a rank hangs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch

from repro.training.checkpoint import save_training_checkpoint
from repro.training.failfast import ON_NAN
from repro.training.log import TrainingLog
from repro.training.preemption import PreemptionFlag
from repro.training.throughput import device_peak_flops, max_memory, model_flops


class SampleSource(Protocol):
    """Training data indexed by global sample position (``SyntheticSamples``, ``CorpusSamples``)."""

    def batch(self, start: int, count: int) -> torch.Tensor: ...


@dataclass
class Validation:
    """``iters`` fixed batches of ``source`` starting at sample ``start``, evaluated every ``interval`` iterations."""

    source: SampleSource
    interval: int
    iters: int = 2
    start: int = 0


class NonFiniteTraining(RuntimeError):
    """A step's loss or gradient norm was inf or NaN, and not on an fp16 step the loss scaler skipped. Raised before
    any later save. The newest checkpoint is not therefore good: it holds the updates that led to the non-finite
    values (weights near 1e30 are finite); the newest *known good* one is ``trainer.known_good_iteration``, whose
    weights gave a finite loss in the step after it."""

    def __init__(self, iteration: int, what: str, value: float) -> None:
        super().__init__(f"iteration {iteration}: {what} is {value}")
        self.iteration, self.what, self.value = iteration, what, value


@dataclass
class Outcome:
    losses: list[float] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)
    preempted: bool = False
    saved: list[str] = field(default_factory=list)


def _max_over_ranks(trainer, world) -> dict:
    """This job's peak memory so far, the largest of any rank (one MAX all-reduce per logged window, where the
    losses are read anyway): ``max_memory_mib`` and what it measures (``memory_kind``)."""
    mib, kind = max_memory(trainer.device)
    if world.size > 1:
        from repro.dist import comm

        value = torch.tensor([mib], dtype=torch.float64, device=trainer.device)
        comm.all_reduce(value, world, op=torch.distributed.ReduceOp.MAX)
        mib = float(value.item())
    return {"max_memory_mib": mib, "memory_kind": kind}


def _validate(trainer, validation: Validation, activity: Callable[[str], None],
              preemption: PreemptionFlag | None = None) -> float | None:
    """The mean validation loss; None when the ranks agreed on a preemption between two of its batches (the loop
    then saves and stops, as at a step boundary)."""
    b, losses = trainer.global_batch_size, []
    for j in range(validation.iters):
        if j and preemption is not None:
            activity(f"evaluation at iteration {trainer.iteration}: agreeing on preemption")
            if preemption.agreed(trainer.groups.world, trainer.device):
                return None
        activity(f"evaluation at iteration {trainer.iteration}: batch {j + 1}/{validation.iters}")
        losses.append(trainer.evaluate(validation.source.batch(validation.start + j * b, b)))
    return sum(losses) / len(losses)


def _validate_and_log(trainer, validation: Validation, doing: Callable[[str], None],
                      preemption: PreemptionFlag | None, log: TrainingLog, outcome: Outcome) -> None:
    """One validation (:func:`_validate`), printed as Megatron prints it and kept in ``outcome``."""
    value = _validate(trainer, validation, doing, preemption)
    if value is None:
        log.print(f" validation at iteration {trainer.iteration} cut short by a preemption signal")
        return
    outcome.validation.append((trainer.iteration, value))
    log.print(f" validation loss at iteration {trainer.iteration} | lm loss value: {value:.6E} |")
    log.event("validation", iteration=trainer.iteration, lm_loss=value)


def _log_preempted(log: TrainingLog, preemption: PreemptionFlag, iteration: int, save: str | None) -> None:
    """The line and event of a stop the ranks agreed on after ``iteration``: which signal, heard by which ranks."""
    log.print(f"received {preemption.describe()}: stopping after "
              f"iteration {iteration}" + ("" if save else " (no --save given: nothing is saved)"))
    log.event("preempted", iteration=iteration, signal=preemption.received,
              ranks={str(r): name for r, name in preemption.heard.items()})


class _StepReader:
    """The steps trained but not yet read, read in one host sync when the loop logs (Megatron's per-interval
    timing: nothing waits on the GPU per step), and the checkpoints whose next step has not been read yet (their
    weights' loss decides whether they are known good)."""

    def __init__(self, trainer, log: TrainingLog, outcome: Outcome, on_nan: str, resumed: bool) -> None:
        self.trainer, self.log, self.outcome, self.on_nan = trainer, log, outcome, on_nan
        b, s, config = trainer.global_batch_size, trainer.settings, trainer.config
        shape = dict(global_batch=b, seq_len=s.seq_len, num_layers=config.num_layers,
                     hidden_size=config.hidden_size, vocab_size=config.vocab_size)
        self.flops = model_flops(**shape, recompute=s.activation_checkpointing)
        self.mfu_flops = model_flops(**shape, recompute=False)
        self.peak = device_peak_flops(trainer.device)  # None on a CPU or an unknown GPU: no MFU
        self.tokens = b * s.seq_len
        self.world = trainer.groups.world
        #: checkpoints whose next step has not been read yet
        self.unconfirmed: set[int] = {trainer.iteration} if resumed else set()
        self.pending: list[tuple[dict, torch.Tensor, object]] = []  # steps not yet read: (record, loss, grad norm)
        self.skipped_before = trainer.skipped_steps  # fp16 steps the loss scaler skipped, up to the last step read
        self.window_start = time.perf_counter()

    def add(self, record: dict, loss: torch.Tensor, norm: object) -> None:
        self.pending.append((record, loss, norm))

    def read(self) -> None:
        """Read the losses and norms of the steps since the last read in one host sync, then log them; each step
        is credited the window's mean time. A non-finite loss or norm raises :class:`NonFiniteTraining` (``on_nan``
        "stop") once every step of the window is logged."""
        pending, world, peak = self.pending, self.world, self.peak
        if not pending:
            return
        lazy = [loss for _, loss, _ in pending] + [norm for _, _, norm in pending if isinstance(norm, torch.Tensor)]
        values = iter(torch.stack([v.reshape(()).to(torch.float64) for v in lazy]).tolist())
        losses = [next(values) for _ in pending]
        elapsed = (time.perf_counter() - self.window_start) / len(pending)
        memory = _max_over_ranks(self.trainer, world)
        bad = None
        for (record, _, norm), loss in zip(pending, losses):
            norm = next(values) if isinstance(norm, torch.Tensor) else norm
            self.outcome.losses.append(loss)
            self.log.step({**record, "lm_loss": loss, "iteration_s": elapsed, "tokens_per_s": self.tokens / elapsed,
                           "tflops_per_rank": self.flops / elapsed / world.size / 1e12,
                           "mfu": self.mfu_flops / elapsed / world.size / peak if peak else None, **memory,
                           "grad_norm": float(norm) if norm is not None else None})
            skipped = record["skipped_iterations"] > self.skipped_before  # fp16: the loss scaler's business
            self.skipped_before = record["skipped_iterations"]
            for what, value in (("lm loss", loss), ("grad norm", norm)):
                if bad is None and not skipped and value is not None and not math.isfinite(value):
                    bad = NonFiniteTraining(record["iteration"], what, value)
            if bad is None and math.isfinite(loss) and record["iteration"] - 1 in self.unconfirmed:
                self.unconfirmed.discard(record["iteration"] - 1)  # its weights gave this finite loss
                self.trainer.known_good_iteration = record["iteration"] - 1
        pending.clear()
        self.window_start = time.perf_counter()
        if bad is not None:
            self.log.event("nonfinite", iteration=bad.iteration, what=bad.what, value=str(bad.value))
            if self.on_nan == "stop":
                raise bad


def train_loop(
    trainer, source: SampleSource, *, steps: int, log: TrainingLog, save: str | None = None,
    save_interval: int | None = None, validation: Validation | None = None,
    preemption: PreemptionFlag | None = None, activity: Callable[[str], None] | None = None,
    save_at_end: bool = True, on_nan: str = "stop", save_guard: Callable[[], str | None] | None = None,
    resumed: bool = False,
) -> Outcome:
    """Train from ``trainer.iteration`` up to ``steps`` iterations (every rank calls it; rank 0's log prints);
    with ``save``, also save at the end (``save_at_end``) unless the last iteration was just saved. ``activity``
    is told what starts next (the module's docstring). ``on_nan`` (:data:`ON_NAN`): a non-finite loss or gradient
    norm raises :class:`NonFiniteTraining` once its step is read (before validation or a save), or is logged and
    trained past. ``save_guard``: see :func:`~repro.training.checkpoint.save_training_checkpoint`'s ``guard``.

    A checkpoint (one saved here, or the one the trainer ``resumed`` from) becomes known good once the step after
    it reads a finite loss: ``trainer.known_good_iteration``, saved in each checkpoint's trainer.json."""
    if on_nan not in ON_NAN:
        raise ValueError(f"on_nan={on_nan!r} must be one of {ON_NAN}")
    doing = activity or (lambda what: None)
    outcome = Outcome()
    b, world, first = trainer.global_batch_size, trainer.groups.world, trainer.iteration
    reader = _StepReader(trainer, log, outcome, on_nan, resumed)

    def checkpoint() -> None:
        started, iteration = time.perf_counter(), trainer.iteration
        path = save_training_checkpoint(
            save, trainer, progress=lambda phase: doing(f"saving checkpoint iteration {iteration}: {phase}"),
            guard=save_guard, extra={"known_good": trainer.known_good_iteration})
        reader.unconfirmed.add(iteration)
        outcome.saved.append(str(path))
        log.print(f"saved checkpoint at iteration {trainer.iteration:>7} to {path} "
                  f"({time.perf_counter() - started:.2f} s)")
        log.event("save", iteration=trainer.iteration, path=str(path))

    while trainer.iteration < steps:
        doing(f"step {trainer.iteration + 1}")
        batch = source.batch(trainer.consumed_samples, b)
        loss = trainer.step_lazy(batch)
        reader.add({
            "iteration": trainer.iteration, "consumed_samples": trainer.consumed_samples,
            "learning_rate": trainer.schedule.lr(trainer.iteration - 1), "global_batch_size": b,
            "loss_scale": trainer.loss_scale, "skipped_iterations": trainer.skipped_steps,
        }, loss, trainer.grad_norm_lazy)
        due = (trainer.iteration % log.log_interval == 0 or trainer.iteration == steps
               or (validation is not None and trainer.iteration % validation.interval == 0)
               or (save is not None and save_interval and trainer.iteration % save_interval == 0))
        if due:
            reader.read()
        if validation is not None and trainer.iteration % validation.interval == 0:
            _validate_and_log(trainer, validation, doing, preemption, log, outcome)
        saved = False
        if save is not None and save_interval and trainer.iteration % save_interval == 0:
            checkpoint()
            saved = True
        if preemption is not None:
            doing(f"agreeing on preemption after iteration {trainer.iteration}")
        if preemption is not None and preemption.agreed(world, trainer.device):
            reader.read()
            _log_preempted(log, preemption, trainer.iteration, save)
            if save is not None and not saved:
                checkpoint()
            outcome.preempted = True
            return outcome
    reader.read()
    last_saved = outcome.saved[-1] if outcome.saved else ""
    if save is not None and save_at_end and trainer.iteration > first and not last_saved.endswith(f"{trainer.iteration:07d}"):
        checkpoint()
    return outcome


def known_good_line(save: str | None, resumed: Path | None, known_good: int | None) -> str:
    """Which checkpoint to go back to after a non-finite step (the end of the exit-3 line): the newest known good
    one (``known_good``: its weights gave a finite loss in the step after it) under ``save`` or where the run
    ``resumed`` from, with the ``--load`` that resumes it; not merely the newest, which holds the updates that led to
    the non-finite values."""
    from repro.training.checkpoint import iteration_dir, latest_iteration
    from repro.zero.checkpoint import MANIFEST

    newest = latest_iteration(save) if save else None
    homes = [Path(save)] if save else []
    if resumed is not None:
        homes.append(resumed.parent if resumed.name.startswith("iter_") else resumed)
    found = next((iteration_dir(home, known_good) for home in homes if known_good is not None
                  and (iteration_dir(home, known_good) / MANIFEST).exists()), None)
    if found is None:
        if newest is None:
            return "no checkpoint was saved" if save else "no --save: nothing was saved"
        return (f"no checkpoint is known good (none was followed by a step with a finite loss); the newest, "
                f"iteration {newest} in {save}, holds the updates that led to it: start again (with a lower "
                "--lr), or from an earlier checkpoint you trust")
    tail = "" if newest in (None, known_good) else (
        f" (the newest, iteration {newest}, is not: it holds the updates that led to it)")
    return (f"the newest checkpoint known good is iteration {known_good}, {found} (its weights gave a finite loss "
            f"at iteration {known_good + 1}){tail}: resume from it with --load {found}"
            + (f" --save {save}" if save else ""))
