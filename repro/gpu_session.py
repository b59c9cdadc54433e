"""The headline 1-GPU measurements in one command, within a hard deadline: ``python -m repro.gpu_session``.

A GPU is often lent for minutes (a ten-minute rental, a shared node's short limit), so the parts run in order of
value, each in its own process with its own time limit, and the limits add up to the deadline (540 s by default).
What each plan measures is data in :mod:`repro.gpu_plans`: ``headline`` (the default: provenance, Megatron's 1.2B
baseline with compiled layers and the plain GPT compiled whole, alternated in one process, GNA at FLUX 4K and
HunyuanVideo, the tests marked ``cuda``), ``zero_offload`` (ZeRO-Offload's largest model on one GPU), ``node`` (the
rest of the ``node`` scale that fits the machine), ``perf`` (the step taken apart) and ``probe`` (what the next
decisions need: GEMM rates, SDPA kernels, optimizer variants, the step's profile and variants, GNA's kernel options),
each its own command within 9 minutes.

A part gets ``min(its limit, time left)``; a part is skipped, saying so, when less than its minimum is left. Rows are
written as each variant or point finishes (``results/runs/<experiment>/<run>.jsonl``), so a part stopped at its limit
keeps what it measured. Everything goes to one folder (``--out``, default ``$OUT`` or ``/tmp/repro-gpu-session``):
``results/``, ``logs/<part>.log``, ``session.jsonl`` (one line per part as it ends) and ``summary.txt``. Commit the
runs under ``results/runs/`` as result runs: their provenance names the GPU.

``--rehearse`` runs the same parts through the same code on the CPU at toy sizes (the experiments' ``smoke`` points,
with ``REPRO_STANDIN_GPUS`` standing in for the GPUs; the tests part selects from ``tests/gpu_path`` only): 1-2
minutes on an idle 2-core machine, its 150 s of limits stretched 6x so that a busy machine finishes too (it checks the
code, not the CPU's speed); the tests run it, so the command cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, NoReturn

from repro.cliargs import OneLineParser, positive_float
from repro.gpu_plans import (DEFAULT_DEADLINE_S, PLANS, REHEARSAL_DEADLINE_S, REHEARSAL_SLACK, REPO, Part,
                             parts as plan_parts)
from repro.paths import appendable_file_problem, writable_dir_problem

PREFIX = "repro.gpu_session: error:"
#: the folder used when neither --out nor $OUT names one
DEFAULT_OUT = "/tmp/repro-gpu-session"


@dataclass
class Outcome:
    """How one part ended: ``ok``, ``failed`` (exit code), ``timed out`` (stopped at its limit) or ``skipped``."""

    part: str
    status: str
    returncode: int | None
    elapsed_s: float
    limit_s: float
    note: str = ""


def plan(out: Path, *, rehearse: bool, run_id: str, name: str = "headline") -> list[Part]:
    """The parts of plan ``name`` (:mod:`repro.gpu_plans`), in order of value."""
    return plan_parts(name, out, rehearse=rehearse, run_id=run_id)


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the part's process group, SIGKILL after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_part(part: Part, *, out: Path, limit_s: float, env: dict[str, str],
             stop_when: Callable[[], bool] | None = None, poll_s: float = 0.05) -> Outcome:
    """Run one part in its own process group, its output in ``logs/<name>.log``; stop it at ``limit_s`` (or as soon
    as ``stop_when()`` is true: a test's way to stop it mid-way, through the same path as a time limit)."""
    log_path = out / "logs" / f"{part.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(part.argv)}\n")
        log.flush()
        proc = subprocess.Popen(part.argv, cwd=REPO, env={**env, **part.env}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        stopped = None
        while proc.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed >= limit_s:
                stopped = f"stopped at its limit of {limit_s:.0f} s"
            elif stop_when is not None and stop_when():
                stopped = f"stopped after {elapsed:.1f} s (asked to)"
            if stopped:
                _stop(proc)
                break
            time.sleep(poll_s)
    elapsed = time.monotonic() - start
    if stopped:
        return Outcome(part.name, "timed out", proc.returncode, elapsed, limit_s, stopped)
    note = _tests_note(out) if part.name == "cuda_tests" else ""
    ok = proc.returncode == 0 or (part.name == "cuda_tests" and proc.returncode == 5)  # 5: no test selected
    return Outcome(part.name, "ok" if ok else "failed", proc.returncode, elapsed, limit_s, note)


def _tests_note(out: Path) -> str:
    """``N passed, F failed, S skipped`` from the JUnit file of the tests part."""
    path = out / "tests-cuda.xml"
    if not path.exists():
        return "no test report (no test selected)"
    import xml.etree.ElementTree as ET

    suites = ET.parse(path).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    if suite is None:
        return "empty test report"
    total, failures, errors, skipped = (int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped"))
    return f"{total - failures - errors - skipped} passed, {failures + errors} failed, {skipped} skipped"


def session_env(out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(PYTHONUNBUFFERED="1", REPRO_RESULTS_DIR=str(out / "results"))
    return env


def _lacking(part: Part) -> str:
    """Why this machine or torch cannot run ``part`` (one line), or ``""``: fewer GPUs than it needs (a stand-in
    count in the part's own environment counts), or an older torch."""
    import torch

    from repro.harness.machine_fit import STANDIN_ENV, gpu_count
    from repro.optional import torch_version

    if part.needs_gpus:
        gpus = int(part.env[STANDIN_ENV]) if STANDIN_ENV in part.env else gpu_count()[0]
        if gpus < part.needs_gpus:
            return f"needs {part.needs_gpus} GPUs or more; this machine has {gpus}"
    if part.needs_torch is None or torch_version() >= part.needs_torch[0]:
        return ""
    (major, minor), feature = part.needs_torch
    return f"needs torch >= {major}.{minor} ({feature}); this torch is {torch.__version__}"


def run_session(out: Path, *, deadline_s: float, rehearse: bool, parts: list[str] | None = None,
                plan_name: str = "headline", say: Callable[[str], None] = print,
                slack: float | None = None) -> list[Outcome]:
    """Run the plan's parts (``parts``: only these, by name) before ``deadline_s``; one line per part as it ends in
    ``session.jsonl``; returns the outcomes. Every limit and the deadline are multiplied by ``slack`` (default
    :data:`~repro.gpu_plans.REHEARSAL_SLACK` when rehearsing, else 1); a part that took longer than its own limit
    says so in its note."""
    slack = (REHEARSAL_SLACK if rehearse else 1.0) if slack is None else slack
    deadline_s *= slack
    from repro.provenance import new_run_id

    out.mkdir(parents=True, exist_ok=True)
    chosen = plan(out, rehearse=rehearse, run_id=new_run_id(), name=plan_name)
    if parts:
        unknown = sorted(set(parts) - {p.name for p in chosen})
        if unknown:
            raise ValueError(f"unknown part(s) {', '.join(map(repr, unknown))}; the parts are "
                             f"{', '.join(p.name for p in chosen)}")
        chosen = [p for p in chosen if p.name in parts]
    env, start, outcomes = session_env(out), time.monotonic(), []
    for part in chosen:
        left = deadline_s - (time.monotonic() - start)
        lacking = _lacking(part)
        if lacking:
            outcome = Outcome(part.name, "skipped", None, 0.0, part.limit_s, lacking)
        elif left < part.min_s * slack:
            outcome = Outcome(part.name, "skipped", None, 0.0, part.limit_s,
                              f"{left:.0f} s left of the {deadline_s:.0f} s deadline, it needs at least "
                              f"{part.min_s * slack:.0f} s")
        else:
            limit = min(part.limit_s * slack, left)
            say(f"=== {part.name} (limit {limit:.0f} s): {part.what}")
            outcome = run_part(part, out=out, limit_s=limit, env=env)
            if outcome.status != "timed out" and outcome.elapsed_s > part.limit_s:
                outcome.note = (outcome.note + "; " if outcome.note else "") + (
                    f"took {outcome.elapsed_s:.0f} s, over its own {part.limit_s:.0f} s limit "
                    f"(allowed x{slack:g}: rehearsal)")
        outcomes.append(outcome)
        with open(out / "session.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(asdict(outcome)) + "\n")
        say(f"=== {part.name}: {outcome.status} in {outcome.elapsed_s:.0f} s" +
            (f" ({outcome.note})" if outcome.note else "") +
            (f", log {out / 'logs' / (part.name + '.log')}" if outcome.status in ("failed", "timed out") else ""))
    summary = "\n".join(f"{o.part:14s} {o.status:9s} {o.elapsed_s:6.0f} s / {o.limit_s:.0f} s  {o.note}"
                        for o in outcomes)
    (out / "summary.txt").write_text(summary + f"\ntotal {time.monotonic() - start:.0f} s of {deadline_s:.0f}\n")
    return outcomes


def write_provenance(path: Path) -> dict:
    """Part 1: what this machine is (GPU, driver, torch, CUDA, cuDNN, triton, Python, CPUs, memory)."""
    import platform

    import torch

    from repro.dist.device import describe
    from repro.harness.machine_fit import available_memory_gib, gpu_count
    from repro.machine import cpu_count

    gpus, standin = gpu_count()
    info: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                  "cpus": cpu_count(), "memory_available_gib": round(available_memory_gib(), 1),
                  "gpus": gpus, "standin": standin}
    try:
        import triton  # type: ignore[import-not-found]

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["device"] = describe("cuda" if torch.cuda.is_available() else "cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    return info


class _Parser(OneLineParser):
    """:class:`~repro.cliargs.OneLineParser` with this command's prefix: its errors are one line, as the others'."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PREFIX} {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m repro.gpu_session", description=__doc__.split("\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="\n".join(__doc__.split("\n")[2:]))
    parser.add_argument("--out", default=None,
                        help=f"folder for results, logs and the summary (default: $OUT, else {DEFAULT_OUT})")
    parser.add_argument("--deadline-s", type=positive_float, default=None,
                        help=f"hard deadline for all parts in seconds (default {DEFAULT_DEADLINE_S:.0f}; "
                             f"{REHEARSAL_DEADLINE_S:.0f} with --rehearse)")
    parser.add_argument("--rehearse", action="store_true",
                        help="run the same parts on the CPU at toy sizes (a stand-in for one GPU)")
    parser.add_argument("--plan", default="headline", choices=PLANS,
                        help="what to measure (default headline; see the description above)")
    parser.add_argument("--part", action="append", default=None,
                        help="run only this part of the plan (repeatable; headline's: provenance, megatron_1gpu, gna, "
                             "cuda_tests)")
    parser.add_argument("--provenance", default=None, metavar="FILE", help=argparse.SUPPRESS)
    return parser


def shown(text: str) -> str:
    """A path as a message names it: quoted when it is blank, so that the empty value is seen."""
    return text if text.strip() else repr(text)


def out_problem(given: str | None, environ: Mapping[str, str]) -> tuple[Path, str | None]:
    """The session's folder (``--out``, else ``$OUT``, else :data:`DEFAULT_OUT`) and, when it cannot be used, the
    one line that says so, naming where it came from."""
    if given is not None:
        text, label = given, f"--out {shown(given)}"
    elif environ.get("OUT"):
        text = environ["OUT"]
        label = f"OUT={shown(text)} (the folder when --out is not given)"
    else:
        text, label = DEFAULT_OUT, f"the default folder {DEFAULT_OUT} (give --out)"
    problem = writable_dir_problem(text)
    return Path(text), (None if problem is None else f"{label} {problem}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.provenance is not None:
        problem = appendable_file_problem(args.provenance)
        if problem is not None:
            print(f"{PREFIX} --provenance {shown(args.provenance)} {problem}", file=sys.stderr)
            return 2
        write_provenance(Path(args.provenance))
        return 0
    out, problem = out_problem(args.out, os.environ)
    if problem is not None:
        print(f"{PREFIX} {problem}", file=sys.stderr)
        return 2
    deadline = args.deadline_s if args.deadline_s is not None else (
        REHEARSAL_DEADLINE_S if args.rehearse else DEFAULT_DEADLINE_S)
    try:
        outcomes = run_session(out.resolve(), deadline_s=deadline, rehearse=args.rehearse, parts=args.part,
                               plan_name=args.plan)
    except ValueError as err:
        print(f"{PREFIX} {err}", file=sys.stderr)
        return 2
    print((out / "summary.txt").read_text(), end="")
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
