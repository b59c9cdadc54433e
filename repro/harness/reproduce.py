"""``repro reproduce``: run every experiment at one scale, then draw the figures and write the claims report,
printing progress, each experiment's time against its budget, and what changed since the previous outputs.

``--scale ci`` means "every experiment at its CPU scale": ``ci`` where the experiment declares it, else ``smoke``
(the GPU experiments' toy size, whose budgets count towards the same 20-minute CI total); see :func:`scale_to_run`.

Also home of the two steps the CLI exposes alone: :func:`make_claims` (``repro claims``) and
:func:`make_figures` (``repro figures``).
"""

from __future__ import annotations

import hashlib
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from repro import claims as C
from repro import results as R
from repro.claims_render import plain_headline, render_markdown
from repro.experiments import Registry
from repro.experiments.base import Experiment
from repro.harness.data_check import set_aside_for_data
from repro.harness.machine_fit import NeedsGPU
from repro.harness.runner import RunReport, budget_for, plan_run, run_experiment
from repro.optional import MissingPackage
from repro.paper import load_claims

if TYPE_CHECKING:  # repro.figures needs matplotlib and seaborn; only drawing imports it (repro claims does not)
    from repro.figures import Rendered

CI_TOTAL_BUDGET_S = 20 * 60


def scale_to_run(experiment: Experiment, scale: str) -> str:
    """The scale ``reproduce --scale scale`` runs ``experiment`` at: ``ci`` falls back to ``smoke`` for experiments
    without a ``ci`` scale; any other scale is taken as asked (experiments without it are skipped)."""
    if scale == "ci" and "ci" not in experiment.points and "smoke" in experiment.points:
        return "smoke"
    return scale


@dataclass
class Outputs:
    report: pd.DataFrame
    checks: C.CheckSet
    claims_files: tuple[Path, Path]
    figures: Rendered | None = None


def _rows(root: Path, scale: str) -> pd.DataFrame:
    """The newest rows at ``scale`` (all scales for ``any``); ``ci`` also takes the smoke rows of experiments that
    have no ci rows, as ``reproduce --scale ci`` runs them at smoke (:func:`scale_to_run`)."""
    if scale != "ci":
        return R.load_rows(root, scale=None if scale == "any" else scale)
    rows = R.load_rows(root)
    if not len(rows):
        return rows
    with_ci = set(rows.loc[rows["scale"] == "ci", "experiment"])
    keep = (rows["scale"] == "ci") | ((rows["scale"] == "smoke") & ~rows["experiment"].isin(with_ci))
    return rows[keep].reset_index(drop=True)


def _check_scale(scale: str) -> str:
    """What the claims collector is asked for: ``ci`` rows hold ci, or smoke where an experiment has no ci, so
    ``any`` (per experiment: paper, else ci, else smoke; no paper rows are among them) picks the right ones."""
    return "any" if scale == "ci" else scale


def report_names(scale: str) -> tuple[str, str]:
    """Where the report of ``scale`` goes: ``claims.md`` / ``figures`` for ``any`` (every experiment at its most
    decisive scale: what the committed report is), a file and folder of their own for a one-scale view
    (``claims-ci.md``, ``figures-ci``), so that no command replaces the evidence of other scales with fewer rows."""
    return ("claims", "figures") if scale == "any" else (f"claims-{scale}", f"figures-{scale}")


def make_claims(reg: Registry, root: Path, scale: str) -> Outputs:
    """Collect the experiments' claim checks on the newest rows and write the report under root (claims.md /
    claims.csv for ``any``, :func:`report_names`)."""
    claims = load_claims()
    rows = _rows(root, scale)
    every = R.load_rows(root) if scale != "any" else rows  # claims a scale cannot decide come from their own
    checks = C.collect_checks(reg, rows, scale=_check_scale(scale), claims=claims, all_rows=every)
    report = C.build_report(checks, claims)
    runs = rows.groupby("experiment")["run_id"].nunique() if len(rows) else pd.Series(dtype=int)
    info = (f"Rows: {len(rows)} from {int(runs.sum())} run(s) of {len(runs)} experiment(s) under `results/runs/` "
            "(newest run of each point).")
    markdown = render_markdown(report, checks, scale=scale, rows_info=info)
    files = C.write_report(report, markdown, root, name=report_names(scale)[0])
    return Outputs(report, checks, files)


def make_figures(reg: Registry, root: Path, scale: str, checks: C.CheckSet | None = None,
                 names: list[str] | None = None, formats: tuple[str, ...] | None = None) -> Rendered:
    """Draw the figures from the newest rows and the claim checks into root/figures: each as PNG, SVG and its data
    file, or only the ``formats`` given (``("json",)``: what each figure shows, no pixels)."""
    from repro.figures import FORMATS, FigureContext, render_all, writing

    claims = load_claims()
    rows = _rows(root, scale)
    if checks is None:
        every = R.load_rows(root) if scale != "any" else rows
        checks = C.collect_checks(reg, rows, scale=_check_scale(scale), claims=claims, all_rows=every)
    ctx = FigureContext(claims=claims, rows=rows, checks=checks.checks, scale=scale,
                        out_dir=root / report_names(scale)[1],
                        known=frozenset(reg.names()))
    with writing(FORMATS if formats is None else formats):
        rendered = render_all(ctx, names)
        if names is None:  # the experiments' own figures (Experiment.figure), after the shared ones
            for exp in reg:
                if exp.figure is None:
                    continue
                mine = rows[rows["experiment"] == exp.name].reset_index(drop=True) if len(rows) else rows
                try:
                    rendered.files[f"{exp.name} (own)"] = list(exp.figure(mine, claims, ctx.out_dir))
                except Exception:  # noqa: BLE001 - reported like the shared figures
                    rendered.errors[f"{exp.name} (own)"] = traceback.format_exc()
    return rendered


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


@dataclass
class Reproduction:
    runs: list[RunReport] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    outputs: Outputs | None = None
    value_changes: pd.DataFrame | None = None
    verdict_changes: pd.DataFrame | None = None
    changed_figures: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        figures_ok = self.outputs is None or self.outputs.figures is None or not self.outputs.figures.errors
        return all(r.ok for r in self.runs) and figures_ok


def reproduce(reg: Registry, scale: str, *, root: Path | None = None, force: bool = False, device: str = "auto",
              only: list[str] | None = None, figures: list[str] | None = None,
              say: Callable[[str], None] = print) -> Reproduction:
    """Run ``only`` (default: every experiment) at ``scale``, then the ``figures`` (default: all) and the claims
    report; report what changed. An experiment named in ``only`` that cannot run at ``scale`` here (no such scale,
    too little memory, no GPU with ``device="cuda"``) is a ValueError before anything runs, as ``repro run`` says
    it; the others are skipped with the reason."""
    names = only or reg.names()
    experiments = [reg.get(n) for n in names]
    for exp in experiments if only else ():  # asked for by name: refused before any work, not skipped
        plan_run(exp, scale_to_run(exp, scale), device=device, skip_needs_gpu=True)
    import repro.figures  # noqa: F401 - before the runs: a missing matplotlib or seaborn stops here, not after them

    root = R.results_dir(root)
    before_rows = _rows(root, scale)
    old_claims_path = root / "claims.csv"
    before_claims = pd.read_csv(old_claims_path) if old_claims_path.exists() else pd.DataFrame()
    figure_dir = root / "figures"
    before_figs = {p.name: _digest(p) for p in figure_dir.glob("*.png")} if figure_dir.exists() else {}
    out = Reproduction()
    out.skipped.update(set_aside_for_data(experiments, say=say))  # no data here: one line, and they are skipped
    start = time.perf_counter()
    for index, exp in enumerate(experiments, 1):
        if exp.name in out.skipped:
            say(f"[{index}/{len(experiments)}] {exp.name}: skipped, it {out.skipped[exp.name]}")
            continue
        run_scale = scale_to_run(exp, scale)
        budget, declared = budget_for(exp, run_scale)
        points = len(exp.points.get(run_scale, ()))
        say(f"[{index}/{len(experiments)}] {exp.name}: {points} point(s) at scale {run_scale}, budget {budget:.0f} s"
            + ("" if declared else " (default)"))
        try:
            report = run_experiment(exp, run_scale, results=root, force=force, device=device, skip_needs_gpu=True,
                                    progress=say)
        except KeyboardInterrupt:
            finished = ", ".join(r.experiment for r in out.runs) or "none"
            rest = ", ".join(e.name for e in experiments[index:]) or "none"
            say(f"interrupted (SIGINT) during {exp.name}, which was stopped; finished and kept: {finished}; not "
                f"started: {rest}; figures and claims were not regenerated (repro claims / repro figures)")
            raise
        except (ValueError, NeedsGPU, MissingPackage) as err:
            out.skipped[exp.name] = str(err)
            say(f"    skipped: {err}")
            continue
        out.runs.append(report)
        status = "ok" if report.ok else "FAILED"
        over = " (OVER BUDGET)" if report.over_budget else ""
        say(f"    {status} in {report.elapsed_s:.1f} s{over}; rows -> {report.path}")
    say("figures and claims ...")
    # the report and figures take every experiment's most decisive rows (scale any), the committed GPU and paper
    # runs included: running at one scale adds rows, it never drops another scale's evidence
    outputs = make_claims(reg, root, "any")
    outputs.figures = make_figures(reg, root, "any", outputs.checks, names=figures)
    out.outputs = outputs
    out.elapsed_s = time.perf_counter() - start
    out.value_changes = R.value_changes(before_rows, _rows(root, scale)) if len(before_rows) else None
    out.verdict_changes = C.verdict_changes(before_claims, outputs.report) if len(before_claims) else None
    after_figs = {p.name: _digest(p) for p in figure_dir.glob("*.png")}
    out.changed_figures = sorted(n for n, d in after_figs.items() if before_figs.get(n) != d)
    _summarise(out, scale, say)
    return out


def _summarise(out: Reproduction, scale: str, say: Callable[[str], None]) -> None:
    say("")
    say(f"{'experiment':32s} {'points':>6s} {'time (s)':>9s} {'budget (s)':>10s}  status")
    for r in out.runs:
        failed = [o.point for o in r.outcomes if o.status == "failed"]
        gpu = [o.point for o in r.outcomes if o.status == "needs GPU"]
        status = "ok" if not failed else f"FAILED: {', '.join(failed)}"
        if r.over_budget:  # it ran, but slower than its scale promises (the ci total is the sum of these)
            status += f", OVER BUDGET by {r.elapsed_s - r.budget_s:.1f} s"
        if gpu:
            status += f" ({len(gpu)} point(s) need a GPU)"
        budget = f"{r.budget_s:.0f}" if r.budget_s else "-"
        say(f"{r.experiment:32s} {len(r.outcomes):6d} {r.elapsed_s:9.1f} {budget:>10s}  {status}")
    for name, why in out.skipped.items():
        say(f"{name:32s} {'-':>6s} {'-':>9s} {'-':>10s}  skipped: {why.splitlines()[0]}")
    total = sum(r.elapsed_s for r in out.runs)
    budgets = sum(r.budget_s or 0.0 for r in out.runs)
    say(f"experiments: {total:.1f} s (budgets {budgets:.0f} s); with figures and claims: {out.elapsed_s:.1f} s"
        + (f" (ci target < {CI_TOTAL_BUDGET_S} s)" if scale == "ci" else ""))
    if out.outputs is not None:
        say(f"claims: {plain_headline(out.outputs.report)} -> {out.outputs.claims_files[0]}")
        figs = out.outputs.figures
        if figs is not None:
            say(f"figures: {sum(len(v) for v in figs.files.values())} files under "
                f"{next(iter(figs.files.values()))[0].parent if figs.files else '-'}")
            for name, error in figs.errors.items():
                say(f"figure {name} FAILED: {error.strip().splitlines()[-1]}")
    if out.value_changes is not None:
        changes = out.value_changes
        new, gone = changes["old_value"].isna(), changes["new_value"].isna()
        changed = changes[~new & ~gone]
        say(f"since the previous rows: {len(changed)} value(s) changed, {int((new & ~gone).sum())} new row(s), "
            f"{int((gone & ~new).sum())} row(s) gone")
        for row in changed.head(15).itertuples():
            say(f"    {row.experiment}/{row.point} {row.metric}: {row.old_value} -> {row.new_value} {row.unit}")
    if out.verdict_changes is not None:
        say(f"changed claims since the previous report: {len(out.verdict_changes)}")
        for row in out.verdict_changes.head(15).itertuples():
            say(f"    {row.paper}/{row.claim_id}: {row.verdict_old} ({row.reproduced_value_old}) -> "
                f"{row.verdict_new} ({row.reproduced_value_new})")
    if out.changed_figures:
        say(f"figures that changed: {', '.join(out.changed_figures)}")
