"""The ZeRO memory report: where one rank's peak memory goes, stage by stage.

DeepSpeed users often see ZeRO-3 take more memory than its estimator predicts and cannot tell why. This report
splits a rank's measured peak (RSS on CPU; the allocator's peak on GPU) into

    runtime          the process before the model exists (interpreter, torch, framework)
    model states     parameters, gradients, fp32 master weights, optimizer moments held in memory (the ledger),
                     printed beside the paper's formula (ZeRO sec. 5) so that excess shows up as its own line
    comm buffers     peak of reduce-scatter / all-reduce buffers (gradient buckets in flight)
    gathered params  peak of stage-3 parameters gathered for compute (prefetch included)
    io buffers       host staging buffers of the NVMe tier
    activations      tensors saved for backward (counted by a saved-tensors hook)
    rest             the peak minus all of the above: temporaries, allocator caching and fragmentation

The transient lines (comm buffers, gathered params, io buffers, activations) are each their own peak over the step;
they need not coincide, so their sum can exceed what the process held at its peak. Then ``rest`` is shown as 0 and
the excess as ``overlap`` (how much of the transient peaks did not coincide), never as a negative amount of memory.

for this implementation (measured by :func:`repro.experiments.zero_measure.measure_run`) and, when the bench has produced
them, for DeepSpeed on the same model (rows in the same schema; the library never imports DeepSpeed).

    python -m repro.harness.zero_report --world-size 2 --stages 0 1 2 3 --out report
    python -m repro.harness.zero_report --no-measure --rows .benchmarks/zero_bench_measurements.json --out report
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from repro.cliargs import OneLineParser, positive_int
from repro.input_files import read_config
from repro.optional import MissingPackage, require
from repro.perfmodel.zero_memory import K_ADAM, model_state_bytes

COLUMNS = ("runtime", "model_states", "comm_buffers", "gathered_params", "io_buffers", "activations", "rest")
MEMORY_TIERS = ("device", "cpu")  # tiers in the process's host memory on a CPU machine (nvme is on disk)


def formula_bytes(psi: int, stage: int, nd: int, dtype: str) -> float:
    """ZeRO sec. 5 for the run's precision. Mixed precision is the paper's (2 + 2 + K) psi with K = 12. In fp32
    the parameters are their own master weights: 4 + 4 bytes of parameters and gradients and K = 8 (momentum,
    variance), i.e. the paper's formula with twice the parameters and half the K. An implementation that keeps a
    separate fp32 master copy anyway shows it as excess over the formula."""
    if dtype in ("bf16", "fp16"):
        return model_state_bytes(num_params=psi, stage=stage, dp_size=nd, k=K_ADAM)
    return model_state_bytes(num_params=2 * psi, stage=stage, dp_size=nd, k=8 / 2)


def attribute(measurement: dict[str, Any], framework: str = "repro") -> dict[str, Any]:
    """One report row from a :func:`measure_run` result (or a peer's row in the same schema)."""
    ledger = measurement.get("ledger", {})
    tiers = ("device",) if measurement.get("device_peak") else MEMORY_TIERS  # a GPU's peak excludes host memory
    in_memory = sum(v for k, v in ledger.items() if k.split("/")[1] in tiers and
                    k.split("/")[0] in ("params", "grads", "master", "optimizer_states"))
    if "model_states_in_memory" in measurement:
        in_memory = measurement["model_states_in_memory"]
    # ZeRO-Infinity: model states in NVMe swap files (not in the process's memory; part of the formula's total)
    on_disk = measurement.get("model_states_on_disk", sum(
        v for k, v in ledger.items() if k.split("/")[1] == "nvme" and
        k.split("/")[0] in ("params", "grads", "master", "optimizer_states")))
    transient = measurement.get("transient_peak", {})
    spec = measurement.get("spec", {})
    zero = spec.get("zero", {})
    dtype = zero.get("dtype", "fp32")
    formula = measurement.get("formula_bytes") or formula_bytes(
        measurement["psi"], measurement["stage"], measurement["dp_size"], dtype)
    row = {
        "framework": framework, "stage": measurement["stage"], "nd": measurement["dp_size"], "dtype": dtype,
        "optimizer_tier": zero.get("offload_optimizer", {}).get("device", "none"),
        "param_tier": zero.get("offload_param", {}).get("device", "none"),
        "psi": measurement["psi"],
        # RSS on a CPU; the CUDA allocator's peak (and its level before the model) on a GPU
        "rss_peak": measurement.get("device_peak") or measurement["rss_peak"],
        "runtime": measurement.get("device_start") if measurement.get("device_peak") else measurement["rss_start"],
        "model_states": in_memory, "model_states_disk": on_disk, "model_states_formula": formula,
        "comm_buffers": measurement.get("comm_buffer_bytes", transient.get("comm_buffers", 0)),
        "gathered_params": measurement.get("gathered_param_bytes", transient.get("working_params", 0)),
        "io_buffers": measurement.get(
            "io_buffer_bytes", sum(v for k, v in ledger.items() if k.startswith("io_buffers"))),
        "activations": measurement.get("activation_bytes", 0),
        "step_time_s": measurement.get("step_time_s"),
        "notes": measurement.get("notes", ""),
    }
    known = sum(row[c] for c in COLUMNS if c != "rest")
    row["rest"] = max(row["rss_peak"] - known, 0)
    row["overlap"] = max(known - row["rss_peak"], 0)  # transient peaks that were not simultaneous
    return row


def report_frame(measurements: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Rows of :func:`attribute` for measurements carrying a ``framework`` key (default "repro")."""
    return pd.DataFrame([attribute(m, m.get("framework", "repro")) for m in measurements])


def render_markdown(frame: pd.DataFrame) -> str:
    """The report as a Markdown table; every memory column in MB (1e6 bytes) per rank."""
    head = ["framework", "stage", "tiers (opt/param)", "peak RSS (MB)", *(f"{c} (MB)" for c in COLUMNS),
            "overlap (MB)", "model states on disk (MB)", "formula (MB)", "model states - formula (MB)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in frame.sort_values(["stage", "optimizer_tier", "framework"]).to_dict("records"):
        mb = lambda value: f"{value / 1e6:.1f}"  # noqa: E731
        cells = [row["framework"], str(row["stage"]), f"{row['optimizer_tier']}/{row['param_tier']}",
                 mb(row["rss_peak"]), *[mb(row[c]) for c in COLUMNS], mb(row.get("overlap", 0)),
                 mb(row.get("model_states_disk", 0)), mb(row["model_states_formula"]),
                 mb(row["model_states"] + row.get("model_states_disk", 0) - row["model_states_formula"])]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r['framework']} stage {r['stage']}: {r['notes']}" for r in frame.to_dict("records") if r["notes"]]
    legend = ["", "MB = 1e6 bytes per rank. The transient columns are each their own peak over the step; 'overlap' is "
              "how far their sum exceeds the measured peak (they did not all peak at once), and 'rest' is then 0. "
              "Model states on disk are NVMe swap files (ZeRO-Infinity): outside the peak, inside the formula."]
    return "\n".join(lines + legend + ([""] + notes if notes else [])) + "\n"


def figure(frame: pd.DataFrame, path: Path) -> Path:
    """Stacked bars of the peak split, one bar per (framework, stage, tiers); the formula as a marker."""
    matplotlib = require("matplotlib", "the ZeRO memory figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = frame.sort_values(["stage", "optimizer_tier", "framework"]).reset_index(drop=True)
    labels = [f"{r.framework}\nZ{r.stage} {r.optimizer_tier}" for r in data.itertuples()]
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(data)), 5.5))
    bottom = [0.0] * len(data)
    for column in COLUMNS:
        values = [max(v, 0) / 1e6 for v in data[column]]
        ax.bar(range(len(data)), values, bottom=bottom, label=column)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.scatter(range(len(data)), [v / 1e6 + r / 1e6 for v, r in zip(data["model_states_formula"], data["runtime"])],
               marker="_", s=400, color="black", label="runtime + formula")
    ax.scatter(range(len(data)), [v / 1e6 for v in data["rss_peak"]], marker="o", s=18, color="red",
               label="measured peak")
    ax.set_ylim(0, 1.05 * max(max(bottom), float(data["rss_peak"].max()) / 1e6))
    ax.set_xticks(range(len(data)), labels, fontsize=7)
    ax.set_ylabel("MB per rank (peak RSS)")
    ax.set_title("Where a rank's peak memory goes (ZeRO stages)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _measure_all(rank: int, world_size: int, specs: list) -> list[dict]:
    from repro.dist import init_parallel
    from repro.experiments.zero_measure import measure_run

    groups = init_parallel()
    return [measure_run(spec, groups) for spec in specs]


def measure_stages(
    *, world_size: int, stages: Sequence[int], model_kwargs: dict[str, Any], dtype: str = "fp32",
    offload: str = "none", nvme_path: str | None = None, micro_batch: int = 2, seq_len: int = 64, steps: int = 3,
) -> list[dict[str, Any]]:
    """Rank 0's :func:`measure_run` results for each stage, run on ``world_size`` local processes."""
    from repro.dist import spawn
    from repro.models import GPTConfig
    from repro.zero.config import OffloadConfig, ZeroConfig
    from repro.experiments.zero_measure import RunSpec

    model = GPTConfig(**{"hidden_dropout": 0.0, "attention_dropout": 0.0, **model_kwargs})
    specs = []
    for stage in stages:
        tier = OffloadConfig(offload, nvme_path=nvme_path if offload == "nvme" else None)
        zero = ZeroConfig(stage=stage, dtype=dtype, offload_optimizer=tier,
                          offload_param=tier if stage == 3 else OffloadConfig())
        specs.append(RunSpec(model=model, zero=zero, micro_batch=micro_batch, seq_len=seq_len, steps=steps))
    return spawn(_measure_all, world_size, specs, timeout_s=1800)[0]


def _read_rows(path: Path) -> list[dict]:
    """The measurements of a --rows file: a JSON list of objects, each as :func:`_row_problem` wants it (a ValueError
    names the file and the rule)."""
    try:
        rows = json.loads(read_config(path, what="--rows").decode("utf-8"))
    except OSError as err:
        raise ValueError(f"--rows {path}: cannot read it ({err.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"--rows {path} is not valid JSON ({err})") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) and "framework" in row for row in rows):
        raise ValueError(f"--rows {path} must hold a JSON list of objects, each with a 'framework' key")
    for number, row in enumerate(rows, start=1):
        problem = _row_problem(row)
        if problem is not None:
            raise ValueError(f"--rows {path}: row {number} {problem}")
    return rows


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bytes(value: object) -> bool:
    """A count of bytes: a finite number >= 0 (JSON has no other numbers than int and float)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= 0)


#: what :func:`attribute` reads from every row: key -> (check, rule)
ROW_KEYS = {
    "framework": (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string"),
    "stage": (lambda v: _is_whole(v) and 0 <= v <= 3, "a ZeRO stage: 0, 1, 2 or 3"),
    "dp_size": (lambda v: _is_whole(v) and v >= 1, "a whole number >= 1 (data-parallel ranks)"),
    "psi": (lambda v: _is_whole(v) and v >= 1, "a whole number >= 1 (parameters of the model)"),
}
#: byte counts a row may carry (null: not measured); rss_peak and rss_start are required without a device_peak,
#: device_start with one
BYTE_KEYS = ("rss_peak", "rss_start", "device_peak", "device_start", "model_states_in_memory",
             "model_states_on_disk", "formula_bytes", "comm_buffer_bytes", "gathered_param_bytes", "io_buffer_bytes",
             "activation_bytes")


def _bad(key: str, value: object, rule: str) -> str:
    shown = repr(value)
    return f"has {key} {shown[:60] + '...' if len(shown) > 60 else shown}; it must be {rule}"


def _row_problem(row: dict[str, Any]) -> str | None:
    """Why one --rows measurement cannot be reported (``has stage 7; it must be ...``), or None."""
    needed = [*ROW_KEYS, *(("device_start",) if row.get("device_peak") else ("rss_peak", "rss_start"))]
    missing = [key for key in needed if row.get(key) is None]
    if missing:
        return f"lacks {', '.join(map(repr, missing))}: every row needs {', '.join(needed)}"
    for key, (check, rule) in ROW_KEYS.items():
        if not check(row[key]):
            return _bad(key, row[key], rule)
    for key in BYTE_KEYS:
        if row.get(key) is not None and not _is_bytes(row[key]):
            return _bad(key, row[key], "a number of bytes >= 0")
    for key, nested in (("ledger", True), ("transient_peak", False)):
        table = row.get(key, {})
        if not isinstance(table, dict) or not all(_is_bytes(v) and (not nested or str(k).count("/") == 1)
                                                  for k, v in table.items()):
            rule = "an object of 'kind/tier': bytes" if nested else "an object of name: bytes"
            return _bad(key, table, rule)
    zero = row.get("spec", {}).get("zero", {}) if isinstance(row.get("spec", {}), dict) else None
    if not isinstance(zero, dict) or zero.get("dtype", "fp32") not in ("fp32", "bf16", "fp16") or not all(
            isinstance(zero.get(tier, {}), dict) and isinstance(zero.get(tier, {}).get("device", "none"), str)
            for tier in ("offload_optimizer", "offload_param")):
        return _bad("spec", row.get("spec"), "an object whose 'zero' has a dtype (fp32, bf16, fp16) and "
                    "offload_optimizer/offload_param objects with a 'device' string")
    return None


def _check_out(text: str) -> Path:
    """``--out``: a file name prefix whose folder exists (or can be created) and accepts files; else a ValueError
    naming it."""
    from repro.paths import name_problem, writable_dir_problem

    empty = name_problem(text)
    if empty is not None:
        raise ValueError(f"--out {text!r} {empty}")
    if text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise ValueError(f"--out {text!r} must be a file name prefix such as reports/zero (it writes PREFIX.md, "
                         "PREFIX.json and PREFIX.png), not a directory")
    prefix = Path(text)
    name = name_problem(f"{prefix}.json")
    if name is not None:
        raise ValueError(f"--out {prefix} {name}")
    folder = writable_dir_problem(prefix.parent, create=False)  # probed, made only once the report is written
    if folder is not None:
        raise ValueError(f"--out {prefix}: its folder {prefix.parent} {folder}")
    return prefix


def _check_rows(text: str | None, no_measure: bool) -> list[dict]:
    """``--rows``: the measurements it holds ([] without one); a ValueError names an empty path, a file that
    cannot be read or a row that cannot be reported, and an empty list with ``--no-measure``."""
    from repro.paths import name_problem

    if text is None:
        return []
    empty = name_problem(text)
    if empty is not None:
        raise ValueError(f"--rows {text!r} {empty}")
    rows = _read_rows(Path(text))
    if not rows and no_measure:
        raise ValueError(f"--rows {text} holds no rows (an empty list): with --no-measure there is nothing to report")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="repro zero-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=positive_int, default=2,
                        help="data-parallel ranks (local processes)")
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], choices=(0, 1, 2, 3),
                        help="ZeRO stages to measure")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="training precision of the parameters")
    parser.add_argument("--offload", choices=("none", "cpu", "nvme"), default="none",
                        help="tier of optimizer states (and of parameters at stage 3)")
    parser.add_argument("--nvme-path", default=None, help="directory for NVMe swap files (with --offload nvme)")
    parser.add_argument("--hidden-size", type=positive_int, default=256, help="GPT hidden size of the measured model")
    parser.add_argument("--num-layers", type=positive_int, default=4, help="GPT layers")
    parser.add_argument("--num-heads", type=positive_int, default=4, help="attention heads")
    parser.add_argument("--vocab-size", type=positive_int, default=8192, help="vocabulary size")
    parser.add_argument("--seq-len", type=positive_int, default=64, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=positive_int, default=2, help="sequences per rank per step")
    parser.add_argument("--steps", type=positive_int, default=3, help="training steps measured")
    parser.add_argument("--rows", default=None,
                        help="JSON list of measurements to add, each with a 'framework' key (bench/test_zero_bench.py "
                             "writes repro's and DeepSpeed's on the bench model)")
    parser.add_argument("--no-measure", action="store_true", help="only render --rows, measure nothing here")
    parser.add_argument("--out", default="zero_memory_report",
                        help="output prefix: writes <out>.md, <out>.json and <out>.png")
    args = parser.parse_args(argv)
    if args.nvme_path is not None and args.offload != "nvme":
        parser.error(f"--nvme-path {args.nvme_path!r} is only used with --offload nvme (where its swap files go); "
                     "add --offload nvme or drop --nvme-path")
    if args.offload == "nvme" and not args.nvme_path:
        parser.error("--offload nvme needs --nvme-path DIR (where the swap files go)")
    if args.no_measure and args.rows is None:
        parser.error("--no-measure needs --rows")
    if args.hidden_size % args.num_heads:
        parser.error(f"--hidden-size {args.hidden_size} must be divisible by --num-heads {args.num_heads}")
    try:  # every input before the measurement, which takes minutes
        if args.offload == "nvme":
            from repro.zero.offload.nvme import check_nvme_path

            check_nvme_path(args.nvme_path)
        out = _check_out(args.out)
        rows = _check_rows(args.rows, args.no_measure)
    except ValueError as err:
        parser.error(str(err))
    try:  # before measuring: the report always draws <out>.png
        require("matplotlib", "the ZeRO memory figure")
    except MissingPackage as err:
        print(f"repro zero-report: error: {err}", file=sys.stderr)
        return 2
    measurements = [] if args.no_measure else [{**m, "framework": "repro"} for m in measure_stages(
        world_size=args.world_size, stages=args.stages, dtype=args.dtype, offload=args.offload,
        nvme_path=args.nvme_path, micro_batch=args.micro_batch, seq_len=args.seq_len, steps=args.steps,
        model_kwargs={"vocab_size": args.vocab_size, "hidden_size": args.hidden_size, "num_layers": args.num_layers,
                      "num_attention_heads": args.num_heads, "max_position_embeddings": args.seq_len})]
    measurements += rows
    frame = report_frame(measurements)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render_markdown(frame)
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(frame.to_json(orient="records", indent=1))
    figure(frame, Path(f"{out}.png"))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
