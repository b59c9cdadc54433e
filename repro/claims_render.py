"""The claims report in numbers and words: counts by verdict, evidence class, paper and origin of the paper value,
and ``results/claims.md``. The report itself (one row per claim) is :func:`repro.claims.build_report`.

The headline counts decisive independent evidence only: measured, simulated, predicted or derived values within the
tolerance where the row's stated null model is not, once per independent quantity. Agreements the null matches too
(``agrees, not decisive``) are counted apart, as are the paper's own arithmetic on its printed numbers
(``consistency``: "the paper's arithmetic checks out: N of M"), conformance to the design (``conforms``), rows that
restate a quantity another row counts (``same quantity``), configurations and fit inputs (``not counted``), claims
the rows' scale cannot decide (``not decidable``) and rows compared on another class of GPU than the paper's (``on
other hardware``, :mod:`repro.cross_hardware`).
"""

from __future__ import annotations

import re

import pandas as pd

from repro.claims import PENDING, CheckSet
from repro.vocabulary import COUNTED_EVIDENCE, EVIDENCE, VERDICTS
from repro.paper import PAPER_TITLES
from repro.verdicts import is_missing

#: Evidence label of rows no experiment maps.
UNMAPPED = "unmapped"
#: Where a paper value comes from (``verbatim_or_derived`` of the claims table), in words.
ORIGINS = {"verbatim": "printed in the paper", "derived": "computed from the paper's numbers",
           "secondary": "from a secondary source"}


#: The column of compared rows measured on another class of GPU than the paper's (repro.cross_hardware): counted
#: apart from the verdicts, never in the headline.
OTHER_HARDWARE = "on other hardware"
COLUMNS = (*VERDICTS, OTHER_HARDWARE)


def other_hardware(report: pd.DataFrame) -> pd.Series:
    """Rows compared (reproduced or differs) on another class of GPU than the paper's."""
    hardware = report["hardware"].fillna("") if "hardware" in report else pd.Series("", index=report.index)
    return (hardware != "") & report["verdict"].isin(["reproduced", "differs", "agrees, not decisive"])


def _counted_verdict(report: pd.DataFrame) -> pd.Series:
    """The verdict a summary counts: :data:`OTHER_HARDWARE` for :func:`other_hardware` rows."""
    return report["verdict"].where(~other_hardware(report), OTHER_HARDWARE).rename("verdict")


def summary(report: pd.DataFrame) -> pd.DataFrame:
    """Counts of each verdict per paper (plus a total row)."""
    table = pd.crosstab(report["paper"], _counted_verdict(report)).reindex(columns=list(COLUMNS), fill_value=0)
    table["total"] = table.sum(axis=1)
    table.loc["all"] = table.sum(axis=0)
    return table


def summary_by_evidence(report: pd.DataFrame) -> pd.DataFrame:
    """Counts of each verdict per (paper, evidence class): classes in :data:`EVIDENCE` order, then ``pending``
    (rows without a value yet), then ``unmapped``."""
    evidence = report["evidence"].fillna("").replace("", UNMAPPED)
    order = {name: i for i, name in enumerate((*EVIDENCE, PENDING, UNMAPPED))}
    table = pd.crosstab([report["paper"], evidence.rename("evidence")], _counted_verdict(report))
    table = table.reindex(columns=list(COLUMNS), fill_value=0)
    table = table.iloc[sorted(range(len(table)), key=lambda i: (table.index[i][0], order[table.index[i][1]]))]
    table["total"] = table.sum(axis=1)
    return table


def headline(report: pd.DataFrame) -> dict[str, int]:
    """The counts the report leads with: claims reproduced by independent evidence (per class and per origin of the
    paper value), those that differ, the paper's arithmetic (consistent of all consistency rows), and the rows
    shown but not counted."""
    verdict, evidence, elsewhere = report["verdict"], report["evidence"], other_hardware(report)
    independent = evidence.isin(COUNTED_EVIDENCE) & ~elsewhere
    reproduced = (verdict == "reproduced") & independent
    origin = report["verbatim_or_derived"].fillna("")
    return {
        "claims": len(report),
        "reproduced": int(reproduced.sum()),
        "differs": int(((verdict == "differs") & independent).sum()),
        "not_decisive": int(((verdict == "agrees, not decisive") & independent).sum()),
        "conforms": int((verdict == "conforms").sum()),
        "conformance": int(verdict.isin(["conforms", "does not conform"]).sum()),
        "other_hardware": int(elsewhere.sum()),
        "other_hardware_agree": int((elsewhere & (verdict != "differs")).sum()),
        "consistent": int((verdict == "consistent").sum()),
        "consistency": int(verdict.isin(["consistent", "inconsistent"]).sum()),
        "same_quantity": int((verdict == "same quantity").sum()),
        "not_counted": int((verdict == "not counted").sum()),
        "not_decidable": int((verdict == "not decidable").sum()),
        **{f"reproduced_{c}": int((reproduced & (evidence == c)).sum()) for c in COUNTED_EVIDENCE},
        **{f"origin_{o}": int((reproduced & (origin == o)).sum()) for o in ORIGINS},
    }


#: The rule the headline counts by, in one sentence (README and claims.md quote it).
RULE = ("A claim counts as reproduced only when the suite's own evidence (measured, simulated, predicted or derived) "
        "agrees with the paper within the stated tolerance and the row's stated null model (no effect, linear "
        "scaling, the FLOP-wise ratio, ...) does not, once per independent quantity.")


def headline_sentence(report: pd.DataFrame) -> str:
    """The headline in one paragraph (the README quotes it; ``repro claims`` prints it)."""
    head = headline(report)
    by_class = ", ".join(f"{head['reproduced_' + c]} {c}" for c in COUNTED_EVIDENCE)
    by_origin = ", ".join(f"{head['origin_' + o]} {words}" for o, words in ORIGINS.items())
    return (f"**{head['reproduced']} of {head['claims']} claims reproduced decisively** ({by_class}); "
            f"{head['differs']} differ. Their paper values: {by_origin}. Counted apart: "
            f"{head['not_decisive']} agree but not decisively (the null model agrees too); "
            f"{head['conforms']} of {head['conformance']} conform to the paper's design (conformance, not "
            f"reproduction); {head['other_hardware']} claims compared on another class of GPU than the paper's, "
            f"through a share of peak, a ratio on one GPU or an estimate from one ({head['other_hardware_agree']} "
            f"agree, {head['other_hardware'] - head['other_hardware_agree']} differ); the paper's arithmetic "
            f"checks out for {head['consistent']} of {head['consistency']} claims computed from its own printed "
            f"numbers (consistency); {head['same_quantity']} claims restate a quantity another row counts; "
            f"{head['not_counted']} configuration or fitted rows are shown, never counted; "
            f"{head['not_decidable']} are not decidable.")


def plain_headline(report: pd.DataFrame) -> str:
    """The headline as a terminal prints it (what claims.md says, without the markdown)."""
    return headline_sentence(report).replace("**", "")


def _fmt(value: object) -> str:
    if is_missing(value):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _short(text: object, width: int = 120) -> str:
    text = _fmt(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _null_cell(row) -> str:
    """The null model beside a compared row: its name and value (``none`` with no meaningful null: the note says
    why)."""
    name = _fmt(getattr(row, "null", ""))
    if not name:
        return ""
    value = _fmt(getattr(row, "null_value", None))
    return f"{name}: {value}" if value else name


def _table(frame: pd.DataFrame, keys: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(keys) + " | " + " | ".join(COLUMNS) + " | total |",
             "|" + "---|" * len(keys) + "---:|" * (len(COLUMNS) + 1)]
    for index, counts in frame.iterrows():
        index = index if isinstance(index, tuple) else (index,)
        lines.append("| " + " | ".join(map(str, index)) + " | " + " | ".join(str(int(counts[v])) for v in COLUMNS)
                     + f" | {int(counts['total'])} |")
    return lines


_MEASURED_ON = re.compile(r"measured on (?:another GPU: )?(?:NVIDIA|AMD|Tesla) ")


def gpu_rows(report: pd.DataFrame) -> pd.DataFrame:
    """Claims a GPU run speaks to: compared on one (``hardware`` named, or a CUDA device) or measured on one and
    left "needs GPU" (their note says where)."""
    hardware = report["hardware"].fillna("") if "hardware" in report else pd.Series("", index=report.index)
    cuda = report["device"].fillna("").str.contains("cuda")
    noted = report["note"].fillna("").str.contains(_MEASURED_ON)
    return report[(hardware != "") | cuda | noted]


def _gpu_section(report: pd.DataFrame) -> list[str]:
    rows = gpu_rows(report)
    if not len(rows):
        return []
    lines = ["", "## Measured on GPUs", "",
             "The claims GPU runs speak to, with the whole note (where the measurement ran, what it is compared "
             "as). By the cross-hardware rule (`repro/cross_hardware.py`), an absolute quantity (TFLOP/s, seconds, "
             "days) is compared only on the paper's class of GPU; a share of peak, a ratio of two runs on one GPU "
             f"or an estimate computed from one is compared on any GPU, and counted in the column "
             f"*{OTHER_HARDWARE}* off the paper's.", "",
             "| paper | claim_id | paper value | this suite | verdict | evidence | hardware | note |",
             "|---|---|---:|---:|---|---|---|---|"]
    for row in rows.itertuples():
        unit = "" if row.unit in ("-", "") else f" {row.unit}"
        lines.append(f"| {row.paper} | {row.claim_id} | {_fmt(row.paper_value)}{unit} | {_fmt(row.reproduced_value)} "
                     f"| **{row.verdict}** | {_fmt(row.evidence)} | {_fmt(row.hardware)} | {_fmt(row.note)} |")
    return lines


INTRO = (
    "Every claim of `results/paper/paper_claims.csv` that has a value, set beside what this suite computed or "
    "measured. Evidence classes, decided by the code that computes each row from what its inputs are: "
    "**measured** (by this suite, on the device in the `device` column of claims.csv), **simulated** (the suite's "
    "simulators), **predicted** (a model whose fit did not use the claim), **derived** (computed from something the "
    "suite built or counted itself) are independent evidence; **consistency** (the paper's own formula or "
    "arithmetic on numbers printed in the paper) only shows that the paper agrees with itself; **configuration** "
    "(a setting the suite was given) and **fitted** (an input of a fit) are shown, never counted; **pending**: no "
    "value yet (`evidence_when_run` in claims.csv says what its run will give); *unmapped*: no experiment maps the "
    "claim. **conformance** (a value any correct implementation of the paper's design gives: collective counts, "
    "bytes fixed by dtypes and shapes) is tested and shown, never counted. Every compared row of independent "
    "evidence names a **null model**, a naive prediction computed on the same inputs (columns `null` and "
    "`null_value`). Verdicts: reproduced (within the tolerance, the null outside) / agrees, not decisive (the null "
    "is within too) / differs (independent evidence), consistent / inconsistent (consistency), conforms / does not "
    "conform (conformance), same quantity (computed from a quantity another row counts: its `basis`), not counted, "
    "not decidable (the suite covers the claim's setting only in part, or not at the rows' scale), not run, needs "
    "GPU.")


def render_markdown(report: pd.DataFrame, checks: CheckSet, *, scale: str, rows_info: str = "") -> str:
    """The human-readable report: the verdict by paper and evidence class, the headline, per experiment, then per
    paper the checked claims in full."""
    lines = [f"# Claims report (scale: {scale})", "", INTRO, ""]
    lines += _table(summary_by_evidence(report), ("paper", "evidence")) + [""]
    lines += ["## Headline", "", RULE, "", headline_sentence(report), "",
              f"Regenerate with `repro claims --scale {scale}` (or `repro reproduce --scale ci`)."]
    if rows_info:
        lines += ["", rows_info]
    lines += ["", "### By paper", ""] + _table(summary(report), ("paper",))
    consistency = report[report["verdict"].isin(["consistent", "inconsistent"])]
    if len(consistency):
        ok = int((consistency["verdict"] == "consistent").sum())
        lines += ["", "## The paper's arithmetic checks out", "",
                  f"{ok} of {len(consistency)} claims that this suite computes only from numbers the paper prints "
                  "(its formulas on its own inputs) agree with the number it prints. This shows the papers are "
                  "self-consistent; it reproduces nothing, so these rows are not in the headline.", "",
                  "| paper | consistent | inconsistent |", "|---|---:|---:|"]
        for paper, group in consistency.groupby("paper"):
            lines.append(f"| {paper} | {int((group['verdict'] == 'consistent').sum())} | "
                         f"{int((group['verdict'] == 'inconsistent').sum())} |")
    lines += _gpu_section(report)
    if checks.scales:
        lines += ["", "## Experiments", "", "| experiment | rows used (scale) | claims mapped | reproduced | differs | "
                  "consistent |", "|---|---|---:|---:|---:|---:|"]
        for name in sorted(checks.scales):
            mine = checks.checks[checks.checks["experiment"] == name]
            n_rows = int(mine["rows"].iloc[0]) if len(mine) else 0
            counts = [int((mine["verdict"] == v).sum()) for v in ("reproduced", "differs", "consistent")]
            lines.append(f"| {name} | {n_rows} ({checks.scales[name]}) | {len(mine)} | "
                         + " | ".join(map(str, counts)) + " |")
    if checks.problems:
        lines += ["", "## Problems met while collecting claims", ""]
        lines += [f"- {p.strip().splitlines()[0]}" for p in checks.problems]
    for paper, group in report.groupby("paper", sort=False):
        lines += ["", f"## {PAPER_TITLES.get(paper, paper)}", ""]
        mapped = group[group["experiment"] != ""]
        if len(mapped):
            lines += ["| claim_id | quantity | setting | paper | paper value's origin | this suite | tolerance "
                      "| verdict | null model | evidence | command | note |",
                      "|---|---|---|---:|---|---:|---|---|---|---|---|---|"]
            for row in mapped.itertuples():
                unit = "" if row.unit in ("-", "") else f" {row.unit}"
                evidence = f"pending ({row.evidence_when_run})" if row.evidence == PENDING else row.evidence
                origin = ORIGINS.get(row.verbatim_or_derived, _fmt(row.verbatim_or_derived))
                lines.append(
                    f"| {row.claim_id} | {_fmt(row.quantity)} | {_fmt(row.setting)} | {_fmt(row.paper_value)}{unit} | "
                    f"{origin} | {_fmt(row.reproduced_value)} | {_fmt(row.tolerance)} | **{row.verdict}** | "
                    f"{_null_cell(row)} | {evidence} | `{row.command}` | {_short(row.note)} |")
        rest = group[group["experiment"] == ""]
        if len(rest):
            lines += ["", f"Not mapped by any experiment yet ({len(rest)} claims; full rows in `claims.csv`):", ""]
            for verdict, sub in rest.groupby("verdict", sort=True):
                lines.append(f"- *{verdict}*: " + ", ".join(f"`{c}`" for c in sub["claim_id"]))
    return "\n".join(lines) + "\n"
