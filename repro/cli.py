"""The ``repro`` command.

    repro list [--scale S]                      experiments: points, ranks, nodes, GPUs, budgets, newest runs per scale
    repro run EXP [EXP ...] [--scale S]         run locally (world size 1 in-process, larger ones on local ranks)
    repro submit EXP --scale paper [--dry-run]  sbatch slurm/EXP.sbatch sized from the points' declared resources
    repro figures [--scale any]                 results/figures/*.png|svg (another scale: results/figures-SCALE/)
    repro claims [--scale any]                  results/claims.md and results/claims.csv (another: claims-SCALE.*)
    repro reproduce [--scale ci]                run everything, then figures and claims (scale any), showing what changed

Scales: ci, smoke, node, paper. ``run`` and ``submit`` default to the experiment's CPU scale (ci, else smoke), so a
bare command stays small; ``figures`` and ``claims`` default to ``any`` (per experiment, its paper-scale rows when
it has some, else ci, else smoke); ``reproduce`` defaults to ``ci``, which runs ci where an experiment declares it and smoke
otherwise; its figures and claims report take every experiment's most decisive rows (``any``), so that running at
one scale never drops another scale's evidence (the committed GPU runs among them). Every ``--help`` says the same.

Errors (unknown experiment or scale, too little memory, no GPU for a GPU point, no Slurm for submit, an optional
package such as datasets or matplotlib missing where a command needs it, a $REPRO_RESULTS_DIR or
$REPRO_EXTRA_EXPERIMENTS that cannot be used) print one line and exit with status 2; a failed point or job exits
with 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from repro import results as R
from repro.about import VersionAction
from repro.cliargs import OneLineParser
from repro.subcommands import FORWARDED, forward
from repro.experiments import EXTRA_ENV, SCALES, Registry, registry
from repro.experiments.base import Experiment, Point
from repro.harness.machine_fit import DEVICES, NeedsGPU
from repro.harness.resources import cpu_scale_of, format_time, resources_of
from repro.harness.runner import budget_for, plan_run
from repro.environment import SettingError, check_environment
from repro.harness.submit import SlurmMissing, SubmitError
from repro.harness.submit_cli import add_submit_parser, run_submit
from repro.optional import MissingPackage
from repro.paths import writable_dir_problem

SCALE_CHOICES = list(SCALES)


def _scale(value: str, *, allow_any: bool = False) -> str:
    allowed = SCALE_CHOICES + (["any"] if allow_any else [])
    if value not in allowed:
        raise ValueError(f"unknown scale {value!r}; scales are {', '.join(allowed)}")
    return value


def _registry(args: argparse.Namespace) -> Registry:
    """The registry; a shipped module that failed to load is a warning, one that ``$REPRO_EXTRA_EXPERIMENTS``
    names is bad input (ValueError: one line, exit 2, before any work)."""
    reg = registry()
    extra = {spec.strip() for spec in os.environ.get(EXTRA_ENV, "").split(",")}  # as the registry reads it
    for module, error in reg.errors.items():
        reason = error.strip().splitlines()[-1]
        if module in extra:  # the loader's own words when it names the variable, without the exception's type
            raise ValueError(reason.split(": ", 1)[-1] if EXTRA_ENV in reason
                             else f"{EXTRA_ENV} names {module!r}, which was not loaded: {reason}")
        print(f"repro: warning: {module} was not loaded: {reason}", file=sys.stderr)
    return reg


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def _scale_summary(exp: Experiment, scale: str) -> tuple[str, str, str, str, str]:
    """(points, ranks, nodes, GPUs per node, needs GPU) of one scale, in words."""
    points = exp.points[scale]
    resources = [resources_of(p, experiment=exp, scale=scale) for p in points]
    gpus = [r.gpus_per_node for r in resources]
    needs = sum(p.needs_gpu for p in points)
    return (f"{len(points)}", _span([p.world_size for p in points]), _span([r.nodes for r in resources]),
            _span(gpus) if any(gpus) else "-", "all" if needs == len(points) else (f"{needs}" if needs else "no"))


def _describe_point(exp: Experiment, scale: str, point: Point) -> str:
    res = resources_of(point, experiment=exp, scale=scale)
    gpus = f", {res.gpus_per_node} GPU(s)/node" if res.gpus_per_node else ""
    return (f"  {exp.name}/{scale}/{point.name}: {point.world_size} rank(s), {point.memory_gib:g} GiB/rank"
            f"{', needs GPU' if point.needs_gpu else ''}; Slurm: {res.nodes} node(s) x "
            f"{point.world_size // res.nodes} task(s){gpus}, {res.cpus_per_task} CPU(s)/task, "
            f"{res.mem_gib:g} GiB/node, "
            f"{format_time(res.time_min)} ({'declared' if point.resources else 'derived'}); {dict(point.params)}")


def cmd_list(args: argparse.Namespace) -> int:
    if args.scale is not None:
        _scale(args.scale)  # before the table, so a bad scale (an empty one too) prints one line
    reg = _registry(args)
    rows = R.load_rows(args.results_dir)
    # the newest run of every (experiment, scale), in one pass over the rows (a filtered copy of them per scale cost
    # ~2 s of CPU with the committed results)
    newest = rows.groupby(["experiment", "scale"])["run_id"].max().to_dict() if len(rows) else {}
    header = ("experiment", "paper", "scale", "points", "ranks", "nodes", "GPUs per node", "GPU points",
              "time budget", "newest run")
    line = "{:28s} {:18s} {:6s} {:>6s} {:>7s} {:>5s} {:>13s} {:>10s} {:>11s}  {}"
    print(line.format(*header))
    for exp in reg:
        for index, scale in enumerate(s for s in SCALES if s in exp.points):
            budget, declared = budget_for(exp, scale)
            print(line.format(exp.name if index == 0 else "", exp.paper if index == 0 else "", scale,
                              *_scale_summary(exp, scale), f"{budget:.0f} s" + ("" if declared else "*"),
                              newest.get((exp.name, scale), "not run")))
        print(f"  {' '.join(exp.title.split())}")
    if args.scale is not None:
        scale = _scale(args.scale)
        for exp in reg:
            for point in exp.points.get(scale, ()):
                print(_describe_point(exp, scale, point))
    print(f"({len(reg)} experiments, each with a one-line description under its rows. points: how many the scale "
          "declares; ranks: their world sizes (processes); nodes and GPUs per node: the Slurm resources they declare, "
          "or derive from ranks and memory; GPU points: how many points need a GPU (no, all, or a count); time "
          "budget: what one run of the scale should take, * = the default budget; newest run: its run id. "
          "`repro list --scale S` lists every point of S.)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from repro.harness.runner import run_experiment

    reg = _registry(args)
    experiments = [reg.get(name) for name in args.experiments]  # all names checked before anything runs
    scales = {exp.name: _scale(args.scale) if args.scale is not None else cpu_scale_of(exp) for exp in experiments}
    for exp in experiments:  # every experiment's scale, points, devices and memory, before the first one runs
        plan_run(exp, scales[exp.name], points=args.point, device=args.device)
    status = 0
    for exp in experiments:
        scale = scales[exp.name]
        print(f"{exp.name} at scale {scale}:")
        report = run_experiment(exp, scale, points=args.point, results=args.results_dir, force=args.force,
                                device=args.device, progress=print)
        budget = f" (budget {report.budget_s:.0f} s{', OVER' if report.over_budget else ''})" if report.budget_s else ""
        print(f"{exp.name}: {'ok' if report.ok else 'FAILED'} in {report.elapsed_s:.1f} s{budget}; run "
              f"{report.run_id} -> {report.path}")
        for outcome in report.outcomes:
            if outcome.status == "failed":
                print(f"--- {exp.name}/{outcome.point} failed ---\n{outcome.message}", file=sys.stderr)
        if report.replaced:
            print(f"  --force replaced {len(report.replaced)} earlier run(s): "
                  + ", ".join(p.name for p in report.replaced))
        elif report.earlier:
            print(f"  kept {len(report.earlier)} earlier run(s) of these points (the newest wins in figures and "
                  "claims; --force replaces them)")
        status = status or (0 if report.ok else 1)
    return status


def cmd_submit(args: argparse.Namespace) -> int:
    exp = _registry(args).get(args.experiment)
    return run_submit(args, exp, _scale(args.scale) if args.scale is not None else cpu_scale_of(exp))


def cmd_figures(args: argparse.Namespace) -> int:
    from repro.harness.reproduce import make_figures

    reg = _registry(args)
    rendered = make_figures(reg, R.results_dir(args.results_dir), _scale(args.scale, allow_any=True), names=args.only)
    for name, files in rendered.files.items():
        print(f"{name}: " + ", ".join(str(f) for f in files))
    for name, error in rendered.errors.items():
        print(f"figure {name} failed:\n{error}", file=sys.stderr)
    return 1 if rendered.errors else 0


def cmd_claims(args: argparse.Namespace) -> int:
    from repro.claims_render import plain_headline
    from repro.harness.reproduce import make_claims

    reg = _registry(args)
    out = make_claims(reg, R.results_dir(args.results_dir), _scale(args.scale, allow_any=True))
    print(plain_headline(out.report))
    for problem in out.checks.problems:
        print(f"repro: warning: {problem.strip().splitlines()[0]}", file=sys.stderr)
    print(f"-> {out.claims_files[0]}, {out.claims_files[1]}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from repro.harness.reproduce import reproduce

    reg = _registry(args)
    if args.only:
        for name in args.only:
            reg.get(name)
    out = reproduce(reg, _scale(args.scale), root=args.results_dir, force=args.force, device=args.device,
                    only=args.only, say=lambda m: print(m, flush=True))
    return 0 if out.ok else 1


#: What --scale means, the same words for every command; each command's default and the reason for it follow.
SCALES_TEXT = "ci, smoke, node or paper"
RUN_SCALE_HELP = (f"{SCALES_TEXT} (default: the experiment's CPU scale, ci where it declares one, else smoke; so that "
                  "a plain `repro {command} EXP` is small enough for a laptop or a CI job)")
REPORT_SCALE_HELP = (f"whose rows to {{what}}: {SCALES_TEXT}, or any (default: any: per experiment, its newest "
                     "paper-scale rows when it has some, else ci, else smoke; so CI and cluster rows land in one "
                     "{where}); a single scale writes a view of its own (claims-SCALE.md, figures-SCALE/) and leaves "
                     "the report of every scale as it is)")


def _results_dir(text: str) -> Path:
    """--results-dir: a directory, or a path where one can be created."""
    problem = writable_dir_problem(text, write=False)  # main() checks it writable for the commands that write
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="repro", description="Reproduce the papers' figures and tables.")
    parser.add_argument("--version", action=VersionAction, help="print repro's version, its commit and torch's")
    parser.add_argument("--results-dir", type=_results_dir, default=None,
                        help="results root: runs/, figures/, claims.md, slurm-logs/ (default: $REPRO_RESULTS_DIR, "
                        "else results/ of the checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list experiments", description="Every registered experiment, one row per "
                       "declared scale (points, ranks, nodes, GPUs, time budget, newest run) and a one-line "
                       "description.")
    p.add_argument("--scale", help=f"also list every point of this scale: {SCALES_TEXT} (default: none, only the "
                   "table)")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("run", help="run experiments on this machine")
    p.add_argument("experiments", nargs="+", metavar="EXP", help="experiment name(s), as `repro list` shows them")
    p.add_argument("--scale", help=RUN_SCALE_HELP.format(command="run"))
    p.add_argument("--point", action="append", help="only this point (repeatable; default: every point of the "
                   "scale; `repro list --scale S` names them)")
    p.add_argument("--force", action="store_true", help="replace the earlier runs of these points (default: keep "
                   "them; the newest wins in figures and claims)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto: GPU points on a GPU when this machine has one, else CPU; cpu runs GPU points on CPU")
    p.set_defaults(func=cmd_run)
    add_submit_parser(sub, RUN_SCALE_HELP.format(command="submit")).set_defaults(func=cmd_submit)
    p = sub.add_parser("figures", help="draw the figures")
    p.add_argument("--scale", default="any", help=REPORT_SCALE_HELP.format(what="draw", where="figure"))
    p.add_argument("--only", action="append", metavar="FIGURE", help="only this figure (repeatable; default: all "
                   "of them)")
    p.set_defaults(func=cmd_figures)
    p = sub.add_parser("claims", help="write the claims report")
    p.add_argument("--scale", default="any", help=REPORT_SCALE_HELP.format(what="report", where="report"))
    p.set_defaults(func=cmd_claims)
    p = sub.add_parser("reproduce", help="run everything, then figures and claims")
    p.add_argument("--scale", default="ci", help=f"{SCALES_TEXT} (default: ci; every experiment at its CPU scale, ci "
                   "where it declares one and smoke otherwise, so one command reproduces all that a CPU machine "
                   "can in CI time); the figures and claims report then take every experiment's most decisive rows "
                   "(scale any), so the committed GPU and paper-scale runs stay in them")
    p.add_argument("--only", action="append", metavar="EXP", help="only this experiment (repeatable; default: "
                   "every registered one)")
    p.add_argument("--force", action="store_true", help="replace earlier runs instead of keeping them (default: "
                   "keep them)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto: GPU points on a GPU when this machine has one, else CPU; cpu runs GPU points on CPU")
    p.set_defaults(func=cmd_reproduce)
    for name, (_, text) in FORWARDED.items():
        sub.add_parser(name, help=text, add_help=False)  # listed here; main() hands its arguments over
    return parser


#: 128 + SIGINT, as a shell reports a process that Ctrl-C ended
EXIT_INTERRUPTED = 130

#: subcommands that write under the results directory: checked writable before they start
WRITES_RESULTS = ("run", "figures", "claims", "reproduce", "submit")


def _joined_sbatch_args(argv: list[str]) -> list[str]:
    """``--sbatch-arg --account=abc`` -> ``--sbatch-arg=--account=abc`` (argparse takes a value that starts with
    '-' for an option of its own)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--sbatch-arg" and arg.startswith("-"):
            out[-1] = f"--sbatch-arg={arg}"
        else:
            out.append(arg)
    return out


def _results_dir_refusal(args: argparse.Namespace) -> str | None:
    """Why the results directory cannot be used (None when it can): ``$REPRO_RESULTS_DIR``, when no
    --results-dir overrides it, gets --results-dir's checks for every command (an empty value is unset, as
    :func:`repro.results.results_dir` reads it); a command that writes results also needs it writable."""
    env = os.environ.get(R.RESULTS_ENV)
    if args.results_dir is None and env:
        problem = ("is blank: give a path, or unset it" if not env.strip()
                   else writable_dir_problem(env, write=False))
        if problem is not None:
            return f"environment variable {R.RESULTS_ENV}: {env!r} {problem}"
    if args.command in WRITES_RESULTS:
        root = R.results_dir(args.results_dir)
        problem = writable_dir_problem(root, create=False)
        if problem is not None:  # before a point runs, not after (created by the command itself)
            option = "--results-dir" if args.results_dir else f"the results directory ({R.RESULTS_ENV} or results/)"
            return f"{option} {root} {problem}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # the environment's settings, before any command starts (and before a point of `repro run` runs)
        check_environment()
    except SettingError as err:
        print(f"repro: error: {err}", file=sys.stderr)
        return 2
    if argv and argv[0] in FORWARDED:
        return forward(argv)
    args = build_parser().parse_args(_joined_sbatch_args(argv))
    refusal = _results_dir_refusal(args)
    if refusal is not None:
        print(f"repro: error: {refusal}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (ValueError, NeedsGPU, FileNotFoundError, SlurmMissing, SubmitError, MissingPackage) as err:
        print(f"repro: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"repro {args.command}: interrupted (SIGINT)", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
