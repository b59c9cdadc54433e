"""The entry point sbatch, srun and torchrun invoke: ``python -m repro.harness.worker EXP --scale S ...``.

* ``--plan`` prints the points to run, one per line: ``name<TAB>world_size<TAB>needs_gpu<TAB>memory_gib``
  (``slurm/launch.sh`` reads it to size each launch); bad experiment or scale names fail here, before any srun.
  With ``--run-id R --skip-done`` it leaves out the points that this Slurm job already wrote to run R: a requeued
  job (``slurm/launch.sh`` requeues a preempted one) goes on with the points its earlier attempts did not finish.
* Under srun or torchrun with more than one rank (their variables are set), it initialises torch.distributed
  with :func:`repro.dist.init_distributed`, runs the point as the rank it is, and rank 0 appends the rows.
* Otherwise it runs the point(s) on this machine exactly like ``repro run`` (local processes when needed).

Exit status: 0 when every point succeeded, 1 when one failed, 2 for bad input, one line before any point runs
(unknown experiment, scale or point, a results directory that cannot be written, a launch variable that is not a
count, a run id that is not a real time, a corrupt run file for ``--skip-done``, too little memory, no GPU for a
GPU point).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from repro import provenance as P
from repro import results as R
from repro.cliargs import OneLineParser, non_negative_int
from repro.environment import check_environment
from repro.experiments import get_experiment
from repro.experiments.base import Experiment, Point, RunContext
from repro.harness.machine_fit import DEVICES, NeedsGPU, check_memory, resolve_device
from repro.harness.runner import RowWriter, run_experiment, run_rank
from repro.paths import name_problem, writable_dir_problem


def _points(experiment: Experiment, scale: str, name: str | None, index: int | None) -> list[Point]:
    points = list(experiment.points_for(scale))
    if name is not None:
        return [experiment.point_named(scale, name)]
    if index is not None:
        if not 0 <= index < len(points):
            raise ValueError(
                f"point index {index} is out of range: {experiment.name} has {len(points)} point(s) at scale "
                f"{scale!r} (array indices 0-{len(points) - 1})"
            )
        return [points[index]]
    return points


def written_by_this_job(results: Path, experiment: str, scale: str, run_id: str) -> set[str]:
    """Points of ``scale`` with rows in run ``run_id`` whose provenance names this Slurm job (the same job id on
    every attempt of a requeued job); empty outside Slurm or when the run has no file yet."""
    job = P.slurm_provenance()["job_id"]
    path = R.run_path(results, experiment, run_id)
    if job is None or not path.exists():
        return set()
    return {record["point"] for record in R.read_run(path)
            if record.get("scale") == scale and str((record.get("provenance") or {}).get("job_id")) == str(job)}


def _count_variable(name: str, default: str = "1") -> int:
    """Launch variable ``name`` (``default`` when unset) as a whole number >= 1; else one line (ValueError)."""
    text = os.environ.get(name, default)
    if not (text.strip().isascii() and text.strip().isdigit() and int(text) >= 1):
        raise ValueError(f"launch variable {name}={text!r} must be an integer >= 1 (a count of ranks)")
    return int(text)


def _launched_world_size() -> int:
    """Ranks the launcher started: torchrun's WORLD_SIZE, or an srun step's task count; 1 otherwise. A variable
    that is not a whole number >= 1 is one line (ValueError) naming it.

    The batch step of an sbatch job also sets SLURM_PROCID/SLURM_NTASKS, but it is one process: only a step
    started by srun (SLURM_STEP_ID set, not the batch step) counts as distributed.
    """
    if "WORLD_SIZE" in os.environ:
        return _count_variable("WORLD_SIZE")
    step = os.environ.get("SLURM_STEP_ID")
    if step is not None and step != "batch" and "SLURM_PROCID" in os.environ:
        if "SLURM_STEP_NUM_TASKS" in os.environ:
            return _count_variable("SLURM_STEP_NUM_TASKS")
        return _count_variable("SLURM_NTASKS")
    return 1


def _ranks_per_node() -> int:
    """Ranks on this node: LOCAL_WORLD_SIZE (torchrun), else SLURM_NTASKS_PER_NODE, else 1."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return _count_variable("LOCAL_WORLD_SIZE")
    return _count_variable("SLURM_NTASKS_PER_NODE")


def _results_dir_option(text: str) -> Path:
    """--results-dir: a path that names something (an empty one would be the current directory)."""
    problem = name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return Path(text)


def _checked_results(option: Path | None, *, write: bool, ranks: int) -> Path:
    """The results root, checked before any point runs: a directory that can be (created and) written, or only
    read for ``--skip-done``. Launched ranks create it (idempotent) rather than probe it: their probes would race."""
    root = R.results_dir(option)
    problem = writable_dir_problem(root, create=ranks > 1, write=write)
    if problem is not None:
        name = "--results-dir" if option is not None else f"the results directory ({R.RESULTS_ENV} or results/)"
        raise ValueError(f"{name} {root} {problem}")
    return root


def run_distributed(experiment: Experiment, point: Point, scale: str, *, run_id: str, results: Path,
                    device: str) -> int:
    """Run ``point`` as this rank of an srun/torchrun launch; rank 0 writes the rows."""
    from repro.dist import init_distributed

    world = _launched_world_size()
    if world != point.world_size:
        raise ValueError(
            f"{experiment.name} point {point.name!r} needs {point.world_size} ranks but the launcher started "
            f"{world}; launch it with exactly {point.world_size} (slurm/launch.sh does)"
        )
    launch = init_distributed("nccl" if device == "cuda" else "gloo")
    ranks_per_node = _ranks_per_node()
    if launch.local_rank == 0:
        check_memory(experiment.name, scale, point, ranks_here=ranks_per_node)
    scratch = Path(tempfile.mkdtemp(prefix=f"repro-{experiment.name}-r{launch.rank}-"))
    t0 = time.perf_counter()
    writer = RowWriter(results, experiment, scale, point, run_id, device, launch.launcher) if launch.rank == 0 else None
    ctx = RunContext(scale=scale, rank=launch.rank, world_size=launch.world_size, device=device,
                     scratch_dir=scratch, emit=writer)
    rows = run_rank(experiment, point, ctx)
    elapsed = time.perf_counter() - t0
    if writer is not None:
        early, rows = writer.written, writer.unwritten(rows)
        prov = P.provenance(config=point.params, world_size=launch.world_size, device=device, elapsed_s=elapsed,
                            launcher=launch.launcher)
        path = R.append_rows(results, experiment=experiment.name, scale=scale, point=point.name, run_id=run_id,
                             rows=rows, prov=prov)
        print(f"{experiment.name}/{point.name}: {len(rows) + early} row(s) in {elapsed:.1f} s -> {path}",
              flush=True)
    import torch.distributed as dist

    from repro.dist.launch import end_rank

    if dist.is_initialized():
        dist.barrier()  # every rank's rows written before any rank leaves
    return end_rank(0)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m repro.harness.worker", description=__doc__.split("\n")[0])
    parser.add_argument("experiment", help="experiment name, as `repro list` shows it")
    parser.add_argument("--scale", default="ci", help="ci, smoke, node or paper")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--point", help="point name (default: every point of the scale)")
    which.add_argument("--point-index", type=non_negative_int,
                       help="point by position, from 0 (a Slurm array task id)")
    parser.add_argument("--run-id", help="append to this run, a timestamp run id such as 20261127T222905.210778Z-4c66fb "
                                          "(default: a new run id)")
    parser.add_argument("--results-dir", type=_results_dir_option,
                        help="results root (default: $REPRO_RESULTS_DIR or results/)")
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto, cpu or cuda")
    parser.add_argument("--plan", action="store_true", help="print the points to run and exit")
    parser.add_argument("--skip-done", action="store_true",
                        help="with --plan and --run-id: leave out the points this Slurm job already wrote to the run "
                             "(an earlier attempt of a requeued job)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.skip_done and not (args.plan and args.run_id):
            raise ValueError("--skip-done needs --plan and --run-id (the run whose written points are left out)")
        if args.run_id is not None:
            P.check_run_id(args.run_id)
        check_environment()  # REPRO_GLOO_CHUNK_BYTES, REPRO_START_METHOD, LOCAL_WORLD_SIZE: before any point runs
        ranks = _launched_world_size()  # the launch variables, checked before any work
        P.slurm_provenance()
        experiment = get_experiment(args.experiment)
        points = _points(experiment, args.scale, args.point, args.point_index)
        if args.plan:
            if args.skip_done:
                results = _checked_results(args.results_dir, write=False, ranks=ranks)
                done = written_by_this_job(results, experiment.name, args.scale, args.run_id)
                for point in points:
                    if point.name in done:
                        print(f"repro worker: point {point.name} is already in run {args.run_id} (an earlier "
                              f"attempt of this job): skipped", file=sys.stderr)
                points = [p for p in points if p.name not in done]
            for point in points:
                print(f"{point.name}\t{point.world_size}\t{int(point.needs_gpu)}\t{point.memory_gib:g}")
            return 0
        results = _checked_results(args.results_dir, write=True, ranks=ranks)
        run_id = args.run_id or P.new_run_id()
        if ranks > 1:
            if len(points) != 1:
                raise ValueError("under srun/torchrun the worker runs one point: pass --point or --point-index")
            _ranks_per_node()
            # Under a launcher each rank takes one GPU (its local rank), so one visible GPU is enough.
            device = resolve_device(args.device, points[0], experiment=experiment.name,
                                    cuda_devices=points[0].world_size if _has_cuda() else 0)
            return run_distributed(experiment, points[0], args.scale, run_id=run_id, results=results, device=device)
        report = run_experiment(experiment, args.scale, points=[p.name for p in points], results=results,
                                device=args.device, run_id=run_id, progress=print)
    except (ValueError, NeedsGPU) as err:
        print(f"repro worker: error: {err}", file=sys.stderr)
        return 2
    for outcome in report.outcomes:
        if outcome.status == "failed":
            print(f"{experiment.name}/{outcome.point} failed:\n{outcome.message}", file=sys.stderr)
    if report.path:
        print(f"rows -> {report.path}")
    return 0 if report.ok else 1


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
