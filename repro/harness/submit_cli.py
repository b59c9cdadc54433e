"""``repro submit``: its options and what it does with them (the resources and the batch files are
:mod:`repro.harness.submit` and :mod:`repro.harness.sbatch`).

``--dry-run`` prints the sbatch command lines and writes nothing; where the batch file those lines name does not
exist yet (an installed wheel in a fresh folder: ``./slurm/EXP.sbatch``), it says so and how to write it:
``--write-only`` writes the batch file and, for a wheel, the launcher it runs (``./slurm/launch.sh``), and prints the
same lines, submitting nothing.
"""

from __future__ import annotations

import argparse
import os

from repro import results as R
from repro.cliargs import positive_float
from repro.experiments.base import Experiment
from repro.harness import submit as S
from repro.harness.submit import check_sbatch_arg


def add_submit_parser(sub, scale_help: str) -> argparse.ArgumentParser:
    """The ``submit`` subcommand's parser (its ``func`` is set by the caller)."""
    p = sub.add_parser("submit", help="submit an experiment to Slurm, sized from its points' resources",
                       description="One job per distinct resource shape of the chosen points (node and paper scales; "
                       "an array over that shape's points), or one job for a ci/smoke scale. Each job asks for the "
                       "nodes, tasks per node (= world size / nodes), GPUs per node, CPUs per task, memory and time "
                       "the points declare (repro list --scale S shows them); the options below override them. Logs: "
                       "<results>/slurm-logs/repro-EXP-<array job id>_<task>.out for an array task, "
                       "repro-EXP-<job id>.out for a single job.")
    p.add_argument("experiment", metavar="EXP", help="experiment name, as `repro list` shows it")
    p.add_argument("--scale", help=scale_help + "; node and paper are the cluster sizes")
    p.add_argument("--point", "--points", nargs="+", action="extend", metavar="POINT",
                   help="only these points (default: every point of the scale)")
    p.add_argument("--gpus-per-node", metavar="N", help="GPUs per node, >= 0 (default: as declared); nodes are "
                   "re-derived at one rank per GPU unless --nodes is given")
    p.add_argument("--nodes", metavar="N", help="nodes, >= 1, dividing each point's world size (default: as declared)")
    p.add_argument("--cpus-per-task", metavar="N", help="CPUs per rank, >= 1 (default: as declared)")
    p.add_argument("--cpu", action="store_true", help="run GPU points on CPU (REPRO_DEVICE=cpu, no GPUs asked; "
                   "default: GPU points get GPUs)")
    p.add_argument("--array", action=argparse.BooleanOptionalAction, default=None,
                   help="one point per array task (default: when a job has several points, or only some of the "
                   "scale's; --no-array runs a whole scale of one shape in one job)")
    p.add_argument("--max-parallel", metavar="N", help="at most N array tasks at once, Slurm's array throttle "
                   "(--array=0-7%%N; default: as many as the cluster lets run)")
    p.add_argument("--partition", help="Slurm partition, or several separated by commas (default: the cluster's "
                   "default partition)")
    p.add_argument("--time", help="time limit per job: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, > 0 "
                   "(default: as declared)")
    p.add_argument("--mem", metavar="GIB", help="GiB per node, >= 0; 0 = all of the node's (default: as declared)")
    p.add_argument("--sbatch-arg", action="append", metavar="OPTION",
                   help="one more sbatch option, --name=value or --flag, e.g. --sbatch-arg=--account=abc "
                   "(repeatable; default: none; the options above are set with their own flags)")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch command lines only, writing nothing "
                   "(needs no Slurm; default: submit)")
    p.add_argument("--write-only", action="store_true", help="write slurm/EXP.sbatch (and, installed from a wheel, "
                   "the launcher it runs, slurm/launch.sh) and print the sbatch command lines, submitting nothing: "
                   "to submit them by hand (needs no Slurm; default: submit)")
    p.add_argument("--wait", action="store_true", help="wait for the jobs, printing every state change and a "
                   "summary while nothing changes, then their final states and exit codes (default: return once "
                   "submitted)")
    p.add_argument("--timeout", type=positive_float, default=3600.0, metavar="SECONDS",
                   help="how long --wait waits; the jobs go on after it")
    p.add_argument("--progress-every", type=positive_float, default=60.0, metavar="SECONDS",
                   help="while waiting, print a summary after this many seconds without a state change")
    return p


def run_submit(args: argparse.Namespace, exp: Experiment, scale: str) -> int:
    """Check every option, then print (``--dry-run``), write (``--write-only``) or submit, and wait (``--wait``)."""
    if args.wait and (args.dry_run or args.write_only):
        flag = "--dry-run" if args.dry_run else "--write-only"
        raise ValueError(f"--wait with {flag}: {flag} submits nothing, so there is no job to wait for")
    if args.dry_run and args.write_only:
        raise ValueError("--dry-run with --write-only: a dry run writes nothing; give one of them")
    extra = [check_sbatch_arg(arg) for arg in args.sbatch_arg or ()]
    options = dict(points=args.point, gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                   cpus_per_task=args.cpus_per_task, cpu=args.cpu, array=args.array, partition=args.partition,
                   max_parallel=args.max_parallel,
                   time_limit=args.time, mem_gb=args.mem, extra=extra,
                   log_dir=R.results_dir(args.results_dir) / "slurm-logs")
    S.plans(exp, scale, write_files=False, **options)  # every value checked before Slurm is looked for
    submits = not (args.dry_run or args.write_only)
    if submits:
        S.require("sbatch")  # before anything is written
    jobs = S.plans(exp, scale, write_files=not args.dry_run, **options)
    for job in jobs:
        print(f"sbatch command ({len(job.points)} point(s): {', '.join(job.points)}): " + " ".join(job.argv))
    batch = S.sbatch_path(exp.name, S.SLURM_DIR)
    if args.dry_run and not batch.exists():  # the lines above name it: say that it is not there yet
        print(f"note: {batch} does not exist yet (--dry-run writes nothing): repro submit writes it, with the "
              f"launcher it runs, when it submits; to submit these lines by hand, write it first with: repro submit "
              f"{exp.name} --scale {scale} --write-only")
    if not submits:
        return 0
    env = {"REPRO_DEVICE": "cpu"} if args.cpu else {}
    if args.results_dir or os.environ.get(R.RESULTS_ENV):
        env["REPRO_RESULTS_DIR"] = str(R.results_dir(args.results_dir).resolve())
    ids = []
    for job in jobs:
        job_id = S.submit(job, env=env)
        ids.append(job_id)
        print(f"submitted job {job_id} ({'array, ' if job.array else ''}log {job.log_pattern})")
    if not args.wait:
        return 0
    say = lambda message: print(message, flush=True)  # noqa: E731 - a line at a time, as the jobs change
    say(f"waiting for job {', '.join(ids)} (state changes as they happen, a summary every {args.progress_every:g} s "
        f"without one; --timeout {args.timeout:g} s; Ctrl-C stops the waiting, not the jobs)")
    states = S.wait_all(ids, timeout_s=args.timeout, say=say, progress_s=args.progress_every)
    for state in states:
        print(state.describe())
    return 0 if all(s.ok for s in states) else 1


