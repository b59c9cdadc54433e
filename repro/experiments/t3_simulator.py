"""T3 (Pati et al., ASPLOS'24): its simulated results from an analytic model of its simulated GPU.

T3's numbers come from Accel-Sim modelling an 80-CU GPU (1.4 GHz, 16 MB L2, 1 TB/s HBM2, a ring of 150 GB/s links
with 500 ns latency), not from hardware, so like GNA's simulator tables they can be reproduced on a CPU by modelling
that GPU (``repro.overlap.t3sim``): tile/wave GEMMs with L2 reuse, ring reduce-scatter and all-gather with their DRAM
traffic, and the schedules T3 compares (sequential, Ideal-GEMM-RS-Overlap, T3, T3 with memory-controller
arbitration (MCA) and near-memory reduction (NMC), and Fig. 6's CU split) for the OP, FC-2, IP and FC-1 sublayers of
Megatron GPT-2 8.3B and T-NLG 17B at TP 8/16, and GPT-3, PaLM and MT-NLG at TP 32. End-to-end numbers come from a
whole layer built from the performance model's op list (``t3sim.endtoend``), never from T3's percentages. T3's
share of time in "non-sliced attention ops" (40-45 %, from MLPerf v1.1's BERT) is set beside the same op list's
share in the attention kernels between the QKV and output projections, for BERT-large at MLPerf's shape: 17.6 %
(not decidable: what T3 counts as non-sliced is not in the sources; the row's note says what the model charges).

Evidence: three constants are fitted (``t3sim.fit``): the CUs' GEMM rate on ``ideal_overlap_geomean``, the HBM
share of interleaved streams on ``t3_geomean``, the CUs' collective throughput on ``cu_split_8cu_ar_slowdown``;
those rows are ``fitted``, and so is any other statistic over the same set of values (``FITTED_SETS``: the maximum
of the 16 sublayer speedups whose geomean the fit set, ``ideal_overlap_max`` and ``t3_max``). Rows a
fitted constant enters are ``predicted``; data movement and the NMC reduce-scatter
(no fitted constant enters) are ``simulated``; the closed forms of T3's reduce-scatter reads and writes at its TP
degrees are ``conformance`` (any correct model of the design gives them); the GPU's settings are
``configuration``. Tolerances, one rule for all: 5 percentage points for a quantity in % (at most a quarter of the
paper's value), 10 % for one in x (T3's own simulator is within 6 % of hardware; the secondary sources print whole
percents). Each counted row is set against the naive model a reviewer reaches for first, computed in the rows
(``null_*`` metrics, ``t3sim.nulls``) on the same fitted GPU, and names the quantities it was computed from
(:mod:`repro.experiments.t3_simulator_claims` says which, and why).

The ``cpu`` point predicts this machine's measurement of the overlapped sublayers (``t3_overlap``) from components
measured now the way ``t3_overlap`` times its modes (``t3sim.cpu_components``: GEMMs, element-wise work,
collectives, and one chunk's GEMM beside its collective; no schedule is measured or fitted; as many rounds as
``t3_overlap`` keeps the fastest of) and composes the schedules (``t3sim.cpu``: each schedule summed round by round,
each rank's compute thread pinned to its own core; it says why, and on which development runs that was chosen).
Each prediction is compared with two measurements of ``t3_overlap``'s modes: ``paired_measured_ms``, the modes' own
closures timed in the calibration's rounds (same load), and ``measured_ms``, the newest ``t3_overlap`` run. The
second inherits this machine's drift: the same OP GEMM call's fastest of 20 rounds was 1.85 ms, then 3.0 ms a minute
later, in one process.

The point calibrates ``CPU_REPEATS`` (5) times, each repeat with its own paired modes, and its result per schedule
is the median over repeats of predicted / paired (``cpu_prediction_ratio``; every repeat's rows are kept). Why:
one repeat's ratio moves by up to +-15 % from run to run (FC-2 sequential 0.87 to 1.20 in 8 development runs), as
wide as the 20 % it is held to, so a single repeat's verdict on ten ratios was a draw: the committed run at d5b831f
(one repeat) had 9 of 10 within 20 % (sequential OP, FC-2, IP, FC-1, FC-2/RS 1.08, 0.79, 1.01, 0.96, 1.00;
overlapped 1.19, 0.93, 0.98, 0.93, 1.05). The repeats were added after that run, and their count chosen before
any run of them; three development runs of this code (2026-11-24, 64-77 s each) then gave 30 of 30 medians within
20 % (0.91 to 1.05), 146 of the 150 single repeats. The committed run at 66969c2 (clean tree), median
predicted/paired, sequential OP, FC-2, IP, FC-1, FC-2/RS: 1.03, 0.95, 0.95, 1.00, 0.94; overlapped: 0.99, 0.97,
0.92, 0.96, 1.03: 10 of 10 within 20 % (50 single repeats: 0.91 to 1.09). Against the newest ``t3_overlap`` run
(its own process, 11 s before): 0.70 to 0.94, 5 of 10 within 20 %. That run's first three sublayers came out
slower than the same closures timed anywhere else that minute (OP sequential 4.62 ms; 3.21 ms paired; 3.32, 3.58,
4.63 ms in three further ``t3_overlap`` runs; 2.94 and 3.44 ms timed twice in one process, so not a start-up
effect): a separate run's fastest of 20 rounds moves by up to ~40 %, which is why the verdict statistic is paired.
"""

from __future__ import annotations

from repro.experiments.base import Experiment, Point, RunContext
from repro.experiments.t3_simulator_claims import (  # noqa: F401 - claims and FITTED_SETS are re-exported
    CPU_REPEATS, FITTED_SETS, PAPER, PCT_RELATIVE, PCT_TOLERANCE, SCHEDULES, X_TOLERANCE, MAPPED, class_of,
    pct, pct_geomean, select_rows, claims,
)
from repro.overlap.t3sim import cu_split, fit, nulls, simulate_sublayer
from repro.overlap.t3sim.endtoend import attention_core_share, layer_times
from repro.overlap.t3sim.hardware import REAL_GPUS, with_gemm_rate
from repro.overlap.t3sim.workloads import FORWARD, MLPERF_BERT, MODELS, SUBLAYERS, configurations, sublayer
from repro.paper import paper_value


def _sublayer_rows(gpu, fitted, model, tp, name, *, device: str) -> list[dict]:
    sub = sublayer(model, name, tp)
    r = simulate_sublayer(gpu, sub, contention=fitted.contention)
    common = dict(model=model.name, tp=tp, sublayer=name, group=model.group, gpu=device)
    rows = [dict(metric="time_us", value=getattr(r, f"{s}_s") * 1e6, unit="us", schedule=s, **common)
            for s in ("sequential", *SCHEDULES)]
    rows += [dict(metric="speedup_pct", value=pct(r.speedup(s)), unit="%", schedule=s, **common) for s in SCHEDULES]
    if device != "T3":
        return rows
    ideal_nmc = max(r.gemm_s, r.rs_nmc_s) + r.ag_s
    rows += [
        dict(metric="time_us", value=r.gemm_s * 1e6, unit="us", schedule="gemm", **common),
        dict(metric="time_us", value=r.rs_s * 1e6, unit="us", schedule="rs", **common),
        dict(metric="time_us", value=r.ag_s * 1e6, unit="us", schedule="ag", **common),
        dict(metric="nmc_rs_speedup_pct", value=pct(r.rs_s / r.rs_nmc_s), unit="%", **common),
        dict(metric="nmc_ideal_gain_pct", value=pct(r.ideal_s / ideal_nmc), unit="%", **common),
        dict(metric="rs_reads_ratio", value=r.rs_read_bytes / r.t3_rs_read_bytes, unit="x", **common),
        dict(metric="gemm_reads_ratio", value=r.gemm_read_bytes / r.gemm_read_bytes, unit="x", **common),
        dict(metric="writes_reduction_pct",
             value=100 * (1 - (r.t3_gemm_write_bytes + r.t3_rs_write_bytes) / (r.gemm_write_bytes + r.rs_write_bytes)),
             unit="%", **common),
        dict(metric="data_movement_reduction_pct", value=100 * (1 - r.t3_bytes / r.baseline_bytes), unit="%", **common),
    ]
    for cus in (8, 16):
        split = cu_split(gpu, sub, ar_cus=cus, cu_bytes_per_cycle=fitted.cu_bytes_per_cycle)
        naive = nulls.cu_ratio_split(split.gemm_s, split.allreduce_s, num_cus=gpu.num_cus, ar_cus=cus,
                                     fitted_ar8_slowdown=1 + fitted.ar8_slowdown_pct / 100)
        rows += [
            dict(metric="cu_split_speedup", value=split.speedup, unit="x", ar_cus=cus, **common),
            dict(metric="cu_split_ar_slowdown_pct", value=pct(split.allreduce_split_s / split.allreduce_s),
                 unit="%", ar_cus=cus, **common),
            dict(metric="cu_split_gemm_slowdown_pct", value=pct(split.gemm_split_s / split.gemm_s), unit="%",
                 ar_cus=cus, **common),
            dict(metric="null_cu_split_speedup", value=naive.speedup, unit="x", ar_cus=cus, **common),
            dict(metric="null_cu_split_ar_slowdown_pct", value=pct(naive.allreduce_slowdown), unit="%", ar_cus=cus,
                 **common),
            dict(metric="null_cu_split_gemm_slowdown_pct", value=pct(naive.gemm_slowdown), unit="%", ar_cus=cus,
                 **common),
        ]
    rows += [
        dict(metric="cu_split_ideal", value=split.ideal_speedup, unit="x", **common),
        dict(metric="null_cu_split_ideal", value=nulls.roofline_ideal_speedup(gpu, sub), unit="x", **common),
        dict(metric="null_data_movement_reduction_pct", value=100 * nulls.operands_once_reduction(gpu, sub, r),
             unit="%", **common),
    ]
    return rows


def _layer_rows(gpu, fitted, *, gemm_speed: float = 1.0) -> list[dict]:
    """Each model's layer at each TP and mode: its share of time in the all-reduces and, at the fitted GEMM rate,
    its speedup under each schedule; beside them their nulls (``t3sim.nulls``): the FLOP-wise share, and Amdahl's
    law on the share of the layer in T3's sublayers with their geomean speedup."""
    faster = with_gemm_rate(gpu, gpu.flops_per_cu_cycle * gemm_speed)
    rows = []
    for model in MODELS.values():
        for tp in model.tp_sizes:
            for mode in ("training", "inference"):
                names = SUBLAYERS if mode == "training" else FORWARD
                results = {name: simulate_sublayer(faster, sublayer(model, name, tp), contention=fitted.contention)
                           for name in names}
                times = layer_times(faster, model, tp, mode=mode, contention=fitted.contention, results=results)
                common = dict(model=model.name, tp=tp, mode=mode, group=model.group, gemm_speed=gemm_speed)
                share = sum(r.sequential_s for r in results.values()) / times.schedule_s["sequential"]
                rows += [
                    dict(metric="comm_share_pct", value=100 * times.comm_share, unit="%", **common),
                    dict(metric="null_comm_share_pct", unit="%", **common, value=100 * nulls.flopwise_comm_share(
                        faster, model, tp, mode=mode, allreduces=len(names))),
                    dict(metric="sublayer_share_pct", value=100 * share, unit="%", **common),
                ]
                if gemm_speed == 1.0:
                    rows += [dict(metric="e2e_speedup_pct", value=pct(times.speedup(s)), unit="%", schedule=s,
                                  **common) for s in SCHEDULES]
                    rows += [dict(metric="null_e2e_speedup_pct", unit="%", schedule=s, **common, value=pct(
                        nulls.amdahl_layer_speedup(share, [r.speedup(s) for r in results.values()])))
                             for s in SCHEDULES]
    return rows


def _attention_rows(gpu) -> list[dict]:
    """Share of a layer's kernel time in the attention kernels no T3 sublayer holds (``endtoend.attention_core``):
    BERT-large at MLPerf's shape (T3's source for the share), and T3's models for comparison."""
    rows = []
    for model in (MLPERF_BERT, *MODELS.values()):
        for tp in model.tp_sizes:
            for mode in ("training", "inference"):
                rows.append(dict(metric="attention_core_share_pct", value=100 * attention_core_share(
                    gpu, model, tp, mode=mode), unit="%", model=model.name, tp=tp, mode=mode, group=model.group))
    return rows


def _cpu_rows(repeats: int) -> list[dict]:
    """Predict ``t3_overlap``'s ci timing point from components of this machine measured now (``t3sim.cpu``: each
    component alone, timed as ``t3_overlap`` times its modes; no schedule is fitted), ``repeats`` times, each
    repeat beside the modes timed in its own rounds; the verdict statistic is the median ratio over repeats."""
    from repro.experiments.t3_overlap import EXPERIMENT as OVERLAP, WARMUP_ROUNDS
    from repro.overlap.t3sim.cpu import CpuSublayer, median_ratio, predict_all
    from repro.overlap.timing import transformer_sublayers
    from repro.results import load_rows

    point = next(p for p in OVERLAP.points_for("ci") if p.params["kind"] == "timing")
    params, tp = point.params, point.world_size
    specs = transformer_sublayers(int(params["hidden"]))
    subs = [CpuSublayer(name, specs[name].parallel, specs[name].in_features, specs[name].out_features,
                        int(params["tokens"]), tp, int(chunks)) for name in params["sublayers"]
            for chunks in params["chunks"]]
    measured = load_rows(experiments=["t3_overlap"], scale="ci")
    measured = measured[measured["point"] == point.name] if len(measured) else measured
    rows, pairs = [], {}
    for repeat in range(repeats):
        # as many rounds as t3_overlap keeps its fastest of: the fastest of more rounds lies lower, so components
        # summarised over more rounds than the measurement would under-predict it by that alone
        predicted, components = predict_all(subs, world_size=tp, rounds=int(params["rounds"]),
                                            warmup=WARMUP_ROUNDS, paired=True)
        for sub in subs:
            common = dict(sublayer=sub.name, tp=tp, num_chunks=sub.num_chunks, tokens=sub.tokens, repeat=repeat)
            rows += [dict(metric="cpu_component_ms", value=seconds * 1e3, unit="ms", component=name,
                          rounds=components.rounds, **common)
                     for name, seconds in components.of(sub.name, sub.num_chunks).items()]
            paired = components.modes_of(sub.name, sub.num_chunks)
            for mode, seconds in predicted[sub.name].items():
                hit = (measured[(measured["metric"] == f"{mode}_ms") & (measured["sublayer"] == sub.name)
                                & (measured["num_chunks"] == sub.num_chunks)]["value"] if len(measured) else [])
                value = float(hit.iloc[-1]) if len(hit) else None
                # paired: t3_overlap's mode timed in this repeat's rounds (same load); measured: its newest run
                rows.append(dict(metric="cpu_predicted_ms", value=seconds * 1e3, unit="ms", schedule=mode,
                                 paired_measured_ms=paired[mode] * 1e3, paired_ratio=seconds / paired[mode],
                                 measured_ms=value, measured_run=str(measured["run_id"].iloc[-1]) if len(hit) else None,
                                 ratio=seconds * 1e3 / value if value else None, **common))
                pairs.setdefault((sub.name, sub.num_chunks, mode), []).append((seconds, paired[mode]))
    for (name, chunks, mode), both in pairs.items():
        ratio = median_ratio([p for p, _ in both], [m for _, m in both])
        rows.append(dict(metric="cpu_prediction_ratio", value=ratio, unit="x", schedule=mode, sublayer=name, tp=tp,
                         num_chunks=chunks, tokens=int(params["tokens"]), repeats=len(both),
                         within_20pct=abs(ratio - 1) <= 0.2))
    return rows


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    kind = point.params["kind"]
    fitted = fit()
    if kind == "fit":
        return [dict(metric="fitted_constant", value=v, unit=u, name=n, fit_result=r) for n, v, u, r in (
            ("flops_per_cu_cycle", fitted.gpu.flops_per_cu_cycle, "FLOP/cycle", fitted.ideal_geomean_pct),
            ("contention", fitted.contention, "fraction of HBM bandwidth", fitted.t3_geomean_pct),
            ("cu_bytes_per_cycle", fitted.cu_bytes_per_cycle, "bytes/cycle", fitted.ar8_slowdown_pct))]
    if kind == "sublayers":
        return [row for model, tp, name in configurations()
                for row in _sublayer_rows(fitted.gpu, fitted, model, tp, name, device="T3")]
    if kind == "real_gpus":  # the same sublayers on real GPUs' datasheet numbers, for comparison
        return [row for label, gpu in REAL_GPUS.items() for model, tp, name in configurations("small")
                for row in _sublayer_rows(gpu, fitted, model, tp, name, device=label)]
    if kind == "layers":
        return (_layer_rows(fitted.gpu, fitted) + _layer_rows(fitted.gpu, fitted, gemm_speed=2.0)
                + _attention_rows(fitted.gpu))
    if kind == "cpu":
        return _cpu_rows(int(point.params["repeats"]))
    raise ValueError(f"point {point.name!r} has kind={kind!r}; expected fit, sublayers, real_gpus, layers or cpu")


# --- claims ------------------------------------------------------------------------------------------------


_LABELS = {"ideal": "Ideal GEMM-RS overlap", "t3": "T3 (no MCA)", "t3_mca": "T3-MCA"}
_PAPER_IDS = {"ideal": ("ideal_overlap_geomean", "ideal_overlap_max"), "t3": ("t3_geomean", "t3_max"),
              "t3_mca": ("sublayer_speedup_geomean", "sublayer_speedup_max")}


def figure(rows, paper_claims, out_dir):
    """T3-style bars: speedup of each TP 8/16 sublayer under each schedule, then the geomean and max, with T3's
    printed geomean and max (secondary sources) as hatched bars beside the model's."""
    from repro.optional import require

    matplotlib = require("matplotlib", "the T3 sublayer figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    from repro.figures.common import caption, rows_provenance, save_figure

    sel = select_rows(rows, metric="speedup_pct", gpu="T3", group="small") if rows is not None and len(rows) else None
    if sel is None or not len(sel):
        return []
    sel = sel.copy()
    sel["label"] = (sel["model"].str.replace("Mega-", "") + "\nTP " + sel["tp"].astype(int).astype(str) + "\n"
                    + sel["sublayer"])
    labels = list(dict.fromkeys(sel["label"]))
    fig, ax = plt.subplots(figsize=(15, 5.2))
    width = 0.26
    colors = {"ideal": "#9ecae1", "t3": "#fdae6b", "t3_mca": "#31a354"}
    positions = list(range(len(labels) + 2))
    for i, schedule in enumerate(SCHEDULES):
        values = sel[sel["schedule"] == schedule].set_index("label")["value"]
        offset = (i - 1) * width
        ax.bar([x + offset for x in range(len(labels))], [values[label] for label in labels], width,
               color=colors[schedule], label=f"{_LABELS[schedule]} (model)")
        summary = [len(labels) + k + offset for k in range(2)]
        ax.bar([x - width / 4 for x in summary], [pct_geomean(values), values.max()], width / 2,
               color=colors[schedule])
        paper = [paper_value(PAPER, claim) for claim in _PAPER_IDS[schedule]]
        ax.bar([x + width / 4 for x in summary], paper, width / 2, color=colors[schedule], edgecolor="black",
               hatch="//", label="T3's number, same colour (secondary sources)" if i == 0 else None)
    ax.set_xticks(positions, labels + ["geomean\n(all 16)", "max\n(all 16)"], fontsize=9)
    ax.set_ylabel("sublayer speedup over sequential (%)")
    ax.set_xlabel("sublayer (model, tensor-parallel degree); T3's simulated 80-CU GPU, modelled")
    ax.axvline(len(labels) - 0.5, color="grey", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, frameon=False)
    caption(fig, "T3's sublayers in the suite's model of T3's simulated GPU (Pati et al. 2024, Fig. 13/16, as quoted "
            "by secondary sources): speedup over the sequential schedule of each tensor-parallel sublayer (TP 8 and "
            "16) under ideal overlap, T3 and T3 with memory-controller arbitration, then the geomean and maximum over "
            "all 16 beside T3's printed numbers (hatched). The model's three constants are fitted on the ideal and "
            "T3 geomeans (and the 8-CU all-reduce slowdown), so those geomeans, and the maxima over the same 16 "
            "sublayers, are fit outputs (not counted); the T3-MCA bars and the per-sublayer values are predictions.")
    rows = rows[rows["scale"] == sel["scale"].iloc[0]] if "scale" in rows and "scale" in sel else rows
    return save_figure(fig, Path(out_dir), "t3_simulator_sublayers",
                       rows_provenance(rows, str(sel["scale"].iloc[0]) if "scale" in sel else "any"))


_POINTS = (
    Point("fit", {"kind": "fit"}),
    Point("sublayers", {"kind": "sublayers"}),
    Point("layers", {"kind": "layers"}),
    Point("real_gpus", {"kind": "real_gpus"}),
    Point("cpu", {"kind": "cpu", "repeats": CPU_REPEATS}, world_size=1, memory_gib=1.0),
)

METRICS = (
    "fitted_constant", "time_us", "speedup_pct", "nmc_rs_speedup_pct", "nmc_ideal_gain_pct", "rs_reads_ratio",
    "gemm_reads_ratio", "writes_reduction_pct", "data_movement_reduction_pct", "cu_split_speedup",
    "cu_split_ar_slowdown_pct", "cu_split_gemm_slowdown_pct", "cu_split_ideal", "comm_share_pct", "e2e_speedup_pct",
    "cpu_predicted_ms", "cpu_component_ms", "cpu_prediction_ratio", "attention_core_share_pct",
    "sublayer_share_pct", "null_cu_split_speedup", "null_cu_split_ar_slowdown_pct", "null_cu_split_gemm_slowdown_pct",
    "null_cu_split_ideal", "null_data_movement_reduction_pct", "null_comm_share_pct", "null_e2e_speedup_pct",
)

EXPERIMENT = Experiment(
    name="t3_simulator",
    paper=PAPER,
    title="T3: sublayer and end-to-end speedups, data movement and CU split from a model of its simulated GPU",
    points={"ci": _POINTS, "paper": _POINTS},
    run_point=run_point,
    claims=claims,
    figure=figure,
    description=__doc__ or "",
    budget_s={"ci": 90.0, "paper": 120.0},  # ci measured 57 s at most (runs of 2026-11-24)
    metrics=METRICS,
)
