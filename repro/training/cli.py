"""``repro train`` (= ``python -m repro.training``): train a GPT under tp x pp x dp from torchrun, srun or one process.

    torchrun --nproc-per-node 8 -m repro.training --tp 2 --pp 2 --dp 2 --steps 20
    srun -n 8 python -m repro.training --tp 2 --pp 2 --save ckpt --load ckpt --save-interval 100
    python -m repro.training --data data/wikitext103-valid --valid-data data/wikitext103-test --steps 200

Rank 0 prints Megatron-LM's ``iteration N/M | ... | lm loss: ... |`` lines every ``--log-interval`` iterations
(and every iteration to ``--log-jsonl``). ``--save DIR`` writes checkpoints (every ``--save-interval`` iterations
and at the end), ``--load DIR`` resumes from the newest one there (or starts fresh when there is none, so a requeued
job with ``--save D --load D`` continues). SIGTERM or SIGUSR1 (Slurm's ``--signal=B:USR1@120``, ``scancel
--signal=USR1``) finishes the step, saves and exits with code 75, which slurm/launch.sh turns into a requeue; so does
Ctrl-C (SIGINT), and a second Ctrl-C exits at once with code 130, saving nothing.
A failing rank ends every rank (see :mod:`repro.training.failfast`): ``--timeout-s`` bounds every collective of every
process group, the watchdog (:mod:`repro.training.watchdog`) the time without progress in a step, an evaluation, a
save or a load; a rank that gives up exits with code 124 and one line naming itself, what it was doing and the rank
it waits for. Bad options exit with code 2 and one line naming the value. A loss or gradient norm that turns inf or
NaN stops the run with one line naming the iteration and exit code 3, before any later save (``--on-nan continue``
trains on). A checkpoint that cannot be written (a full disk) stops every rank with one line and exit code 74; the
previous checkpoint stays the newest.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from repro.cliargs import sigint_exits_at_once
from repro.dist import init_distributed, init_parallel
from repro.dist.launch import RendezvousFailed, end_rank
from repro.training.argcheck import check_args
from repro.training.config import TrainConfig
from repro.training.log import arguments_block
from repro.training.failfast import (
    EXIT_HUNG, EXIT_NONFINITE, EXIT_WRITE_FAILED, UsageError, agree_on_setup, interrupted_before_training,
    run_fail_fast,
)
from repro.training.options import explicit_options, option_parser
from repro.training.preemption import EXIT_PREEMPTED, PreemptionFlag, note_preempted, note_rank

PROG = "repro train"
#: a rank that refuses a command without saying why (rank 0 says it) waits this long before it exits: a launcher
#: such as torchrun stops every rank once one exits, which could cut rank 0 off before its line
SILENT_RANK_GRACE_S = 2.0
#: where the synthetic held-out batches start: far beyond any training sample index
SYNTHETIC_VALID_START = 2**40


def build_parser() -> argparse.ArgumentParser:
    """The options of ``repro train`` (:func:`~repro.training.options.option_parser`)."""
    return option_parser(PROG, __doc__.splitlines()[0])


def _sources(config: TrainConfig):
    """(training source, validation or None)."""
    from repro.training.data import SyntheticSamples
    from repro.training.loop import Validation

    data, seq_len, seed = config.data, config.model.seq_len, config.training.seed
    if data.data == "synthetic":
        train = SyntheticSamples(vocab_size=config.model.vocab, seq_len=seq_len, seed=seed)
    else:
        from repro.training.corpus import TokenCorpus

        train = TokenCorpus(data.data).samples(seq_len, seed=seed)  # check_args: its ids < the vocabulary
    valid = None
    if data.valid_data is not None:
        from repro.training.corpus import TokenCorpus

        held_out = TokenCorpus(data.valid_data).samples(seq_len, seed=seed)
        valid = Validation(held_out, data.eval_interval, data.eval_iters, 0)
    elif data.eval_interval and data.data == "synthetic":
        valid = Validation(train, data.eval_interval, data.eval_iters, SYNTHETIC_VALID_START)
    return train, valid


def train(config: TrainConfig, *, on_action: Callable[[str, int], None] | None = None) -> int:
    """Run the training this rank takes part in (``config``: resolved by :func:`~repro.training.argcheck.
    check_args`); returns the process's exit code (0, or 75 when preempted)."""
    save = config.checkpoint.save
    # until the run holds anything, a Ctrl-C ends it at once, whatever library code it lands in (see
    # sigint_exits_at_once); from --save's lock on, it stops at a step boundary (PreemptionFlag)
    with sigint_exits_at_once(interrupted_before_training(PROG)):
        # the run's modules load here, where a Ctrl-C is one line (the first import of torch.optim loads torch's
        # compiler stack, and on torch 2.4 sympy and mpmath: seconds)
        import repro.training.checkpoint  # noqa: F401
        import repro.training.trainer  # noqa: F401
        from repro.training.dirlock import hold_directory

        # a bad MASTER_PORT, or one in use, is one line and exit code 2 (a UsageError), not a traceback
        try:
            launch = agree_on_setup(lambda: init_distributed(timeout_s=config.failures.timeout_s))
        except RendezvousFailed as err:  # nobody to agree with: each rank says it
            print(f"{PROG}: error: {err} (exit code {EXIT_HUNG})", file=sys.stderr, flush=True)
            return EXIT_HUNG
    with PreemptionFlag() as preemption:  # from here on: a signal during setup stops after the first step
        # --save belongs to this job from here until the process ends: rank 0 takes it, every rank learns the
        # outcome (a second run is refused in one line before it loads or writes anything)
        lock = agree_on_setup(lambda: hold_directory(save) if save and launch.rank == 0 else None)
        try:
            return _train_holding(config, launch, lock, preemption, on_action=on_action)
        finally:
            if lock is not None:
                lock.release()


def _train_holding(config: TrainConfig, launch, lock, preemption: PreemptionFlag, *, on_action) -> int:
    """:func:`train` once the run holds its --save directory (``lock`` on rank 0, None elsewhere)."""
    from repro.dist.device import select_device
    from repro.training.checkpoint import load_training_checkpoint
    from repro.training.log import TrainingLog
    from repro.training.trainer import PipelineTrainer

    steps, save, load, logging = config.training.steps, config.checkpoint.save, config.checkpoint.load, config.logging

    def setup():
        layout = config.parallelism
        groups = init_parallel(tp=layout.tp, pp=layout.pp, dp=layout.dp, timeout_s=config.failures.timeout_s)
        source, validation = _sources(config)
        device = select_device(config.training.device, local_rank=launch.local_rank)
        trainer = PipelineTrainer(config.gpt_config(), groups, config.train_settings(str(device)),
                                  on_action=on_action)
        return groups, trainer, source, validation

    groups, trainer, source, validation = agree_on_setup(setup)
    resolved = _resolved_arguments(config, groups)
    if groups.rank == 0:
        print(arguments_block(resolved), flush=True)
    with _watchdog(config, groups.rank) as watchdog:  # from the load on: a hang anywhere is one line, 124
        trainer.on_action = _beating(watchdog, on_action)
        resumed = None
        if load:
            watchdog.doing(f"loading checkpoint from {load}")
            resumed = agree_on_setup(lambda: load_training_checkpoint(
                load, trainer, progress=lambda phase: watchdog.doing(f"loading checkpoint: {phase}")))
        if resumed is not None and trainer.iteration >= steps:  # a finished run is done: nothing written
            if groups.rank == 0:
                print(f"resumed from checkpoint {resumed} at iteration {trainer.iteration}; nothing left to "
                      f"train: at iteration {trainer.iteration} of --steps {steps}", flush=True)
            preemption.finish()
            return 0
        # only now, with the load done, does anything go into --save or the logs
        if save and groups.rank == 0:
            _start_save_directory(save, resolved)
        log = TrainingLog(total_iters=steps, log_interval=logging.log_interval, jsonl=config.log_jsonl,
                          tensorboard_dir=logging.tensorboard_dir, enabled=groups.rank == 0,
                          wandb=_wandb_settings(config, resolved) if logging.wandb_project else None,
                          per="GPU" if trainer.device.type == "cuda" else "CPU rank")
        try:
            if resumed is not None:
                log.print(f"resumed from checkpoint {resumed} at iteration {trainer.iteration} "
                          f"({trainer.consumed_samples} samples consumed)")
            elif load:
                log.print(f"no checkpoint in {load}: starting from iteration 0")
            log.event("start", iteration=trainer.iteration, resumed=str(resumed) if resumed else None,
                      world_size=groups.world_size, tp=groups.tp_size, pp=groups.pp_size, dp=groups.dp_size,
                      slurm_job_id=os.environ.get("SLURM_JOB_ID"),
                      slurm_restart_count=os.environ.get("SLURM_RESTART_COUNT"))
            return _train_and_report(config, trainer, source, validation, log, preemption, watchdog.doing,
                                     lock, resumed)
        finally:
            log.close()


def _start_save_directory(save: str, resolved: dict) -> None:
    """Rank 0, once the load is done: remove saves an earlier run left unfinished, then write what this run is
    (``train_args.json``, beside the checkpoints)."""
    from repro.atomic_files import atomic_write
    from repro.training.checkpoint import remove_unfinished

    for folder in remove_unfinished(save):  # a save a second Ctrl-C (or a kill) cut short
        print(f"removed {folder}: an unfinished save of an earlier run (never published)", flush=True)
    atomic_write(Path(save) / "train_args.json", [json.dumps(resolved, indent=1).encode()])


def _train_and_report(config: TrainConfig, trainer, source, validation, log, preemption, activity, lock,
                      resumed) -> int:
    """The training loop, and how it ended as a logged line and the exit code (0, 3, 74 or 75; see README)."""
    from repro.training.loop import NonFiniteTraining, known_good_line, train_loop
    from repro.zero.checkpoint import CheckpointWriteError

    steps, save = config.training.steps, config.checkpoint.save
    try:
        outcome = train_loop(trainer, source, steps=steps, log=log, save=save,
                             save_interval=config.checkpoint.save_interval, validation=validation,
                             preemption=preemption, activity=activity, on_nan=config.failures.on_nan,
                             save_guard=(lock.check if lock is not None else lambda: None) if save else None,
                             resumed=resumed is not None)
    except CheckpointWriteError as err:  # every rank raises it, with the same reason
        log.error(f"{PROG}: error: {err}; {_last_checkpoint(save)} (exit code {EXIT_WRITE_FAILED})")
        return EXIT_WRITE_FAILED
    except NonFiniteTraining as err:  # every rank read the same numbers: every rank stops here
        log.error(f"{PROG}: error: {err}: stopping (exit code {EXIT_NONFINITE}; --on-nan continue trains on); "
                  f"{known_good_line(save, resumed, trainer.known_good_iteration)}")
        return EXIT_NONFINITE
    if outcome.preempted:
        resume = f"resume with --load {save}" if save else "nothing saved: no --save"
        log.print(f"exiting with code {EXIT_PREEMPTED} (preempted; {resume})")
        preemption.settle()  # saved: the same signal again (from another sender) must not turn 75 into death by it
        return EXIT_PREEMPTED
    if not outcome.losses:
        log.print(f"nothing left to train: at iteration {trainer.iteration} of --steps {steps}")
        preemption.finish()
        return 0
    log.print(_done_line(trainer.iteration, outcome.losses[-1], log.last_window))
    log.event("end", iteration=trainer.iteration, lm_loss=outcome.losses[-1])
    preemption.finish()
    return 0


def _resolved_arguments(config: TrainConfig, groups) -> dict:
    """Every setting as this run resolved it (the DeepSpeed config applied, dp, the batch and the vocabulary filled
    in), with the layout, the launch and the software, as JSON values."""
    import torch

    import repro

    values = config.arguments()
    values.update(world_size=groups.world_size, dp=groups.dp_size, torch_version=torch.__version__,
                  repro_version=repro.__version__)
    return json.loads(json.dumps(values, default=str))


def _done_line(iteration: int, loss: float, window: tuple[int, int, float] | None) -> str:
    """The closing line: the last iteration's own loss, and, where the last log line averaged several iterations
    (--log-interval > 1, as Megatron's lines do), that it is not the mean printed above."""
    line = f"training done: iteration {iteration} lm loss {loss:.6E} (iteration {iteration} alone"
    if window is not None and window[0] != window[1]:
        line += f"; the last log line's {window[2]:.6E} is the mean of iterations {window[0]}-{window[1]}"
    return line + ")"


def _wandb_settings(config: TrainConfig, resolved: dict) -> dict:
    """``wandb.init``'s arguments: Megatron's --wandb-project / --wandb-exp-name / --wandb-save-dir, the DeepSpeed
    config's group and team, and the resolved arguments as the run's config."""
    logging, save = config.logging, config.checkpoint.save
    name = logging.wandb_exp_name or (Path(save).name if save else None)
    # W&B makes a wandb/ folder inside the directory it is given (its dir=, as Megatron passes --wandb-save-dir):
    # the --save directory itself, so that the run lands in DIR/wandb/, not DIR/wandb/wandb/
    directory = logging.wandb_save_dir or save
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
    return {"project": logging.wandb_project, "name": name, "dir": directory, "group": logging.wandb_group,
            "entity": logging.wandb_entity, "config": resolved}


def _last_checkpoint(save: str) -> str:
    from repro.training.checkpoint import latest_iteration

    newest = latest_iteration(save)
    if newest is None:
        return f"no earlier checkpoint was saved in {save}"
    return (f"the last checkpoint, iteration {newest}, is intact: free space (or --save elsewhere) and resume with "
            f"--load {save}")


def _watchdog(config: TrainConfig, rank: int):
    """The run's watchdog (:mod:`repro.training.watchdog`): ``--watchdog-s`` without progress, or a collective past
    ``--timeout-s``, ends the rank with one line; heartbeats in the rendezvous store name the rank it waits for."""
    from repro.training.watchdog import Heartbeats, Watchdog, heartbeat_interval

    failures, training = config.failures, config.training
    limit, limit_name = ((failures.watchdog_s, "--watchdog-s") if failures.watchdog_s is not None
                         else (failures.timeout_s + 10, "--timeout-s + 10 ="))
    return Watchdog(limit, name="starting", rank=rank, limit_name=limit_name, group_timeout_s=failures.timeout_s,
                    heartbeats=Heartbeats.of_default_group(interval_s=heartbeat_interval(failures.timeout_s)),
                    slow_hint=f"no rank is waiting for another: if one micro-batch is only slow (--seq-len "
                              f"{config.model.seq_len}, --micro-batch-size {training.micro_batch_size} on "
                              f"{training.device}), raise --watchdog-s")


def _beating(watchdog, on_action):
    def action(kind: str, micro_batch: int) -> None:
        watchdog.beat()
        if on_action is not None:
            on_action(kind, micro_batch)
    return action


def main(argv: Sequence[str] | None = None, *, on_action: Callable[[str, int], None] | None = None) -> int:
    from repro.training.startcheck import speaks

    parser = build_parser()
    with sigint_exits_at_once(interrupted_before_training(PROG)):  # nothing to lose yet (see train)
        # argparse: one error line, exit code 2; printed by rank 0 alone (every rank finds the same)
        try:
            with contextlib.nullcontext() if speaks(UsageError(None)) else contextlib.redirect_stderr(io.StringIO()):
                args = parser.parse_args(argv)
        except SystemExit as exit_:
            if exit_.code and not speaks(UsageError(None)):
                time.sleep(SILENT_RANK_GRACE_S)  # so that rank 0 says why before a launcher stops it
            raise
        try:  # the options become one checked config, once; nothing changes them afterwards
            config = check_args(args, explicit_options(parser, argv))
        except UsageError as err:
            if speaks(err):  # rank 0; a machine's first rank for its memory and disks; every rank when RANK is bad
                print(f"{PROG}: error: {err}", file=sys.stderr)
            else:
                time.sleep(SILENT_RANK_GRACE_S)
            return 2
        note_rank("started")  # for repro.dist.torchrun: a signal after every started rank finished is no failure
    code = run_fail_fast(lambda: train(config, on_action=on_action), prog=PROG)
    if code == EXIT_PREEMPTED:
        note_preempted()  # for repro.dist.torchrun, which passes 75 on where torchrun's agent would say 1
    # every rank returns the same code; the process group ends here, not in the interpreter's exit (torch 2.4's
    # gloo destructor could abort there: exit code 134 instead of 75)
    return end_rank(code)
