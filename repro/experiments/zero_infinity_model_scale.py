"""ZeRO-Infinity's memory wall at this machine's scale (ZeRO-Infinity Fig. 1 and 5a): the largest GPT each tier
trains here, stage 3 with every model state in memory or on NVMe.

For each tier the candidates (one hidden size, growing depth) are estimated first (repro/experiments/zero_model_scale.py:
16 B/param of model states plus the working set, against this machine's available memory and free disk), and the
largest that fits is built partitioned (no rank ever holds the model) and trained a few steps on one repeated
batch. Rows: parameters, model-state bytes and their ratio to the machine's memory, construction peak RSS and the
largest block held whole, training peak RSS per rank, losses, step times, the NVMe bytes moved per step and the
achieved disk bandwidth two ways, both ranks' bytes over the step time (``nvme_*_gbs``: what the step achieved,
I/O waiting for compute included) and over the time the tier's I/O was in flight (``nvme_*_busy_gbs``: the union
over both ranks of the intervals in which at least one read, resp. write, request was executing), beside the raw
O_DIRECT bandwidth of the same directory with the tier's request size and thread count, measured in the same run.
As reads and writes share the drive, the busy time is also split into reads alone, writes alone and both at once
(``nvme_regime_*``, ``repro.zero.offload.io_regimes``), each against the raw drive in that regime (``raw_mixed_*``:
readers and writers in flight together).
The learning rate is a training setting of each scale (``lr``), chosen once: at the paper scale 1e-5, the largest
of 1e-4, 3e-5, 1e-5 under which a 2-layer model of the same width (h 4096, vocabulary 1000, sequence 32, batch 2)
fell at every one of 5 steps on the repeated batch with AdamW (1e-4: 7.80, 0.019, 0.0012, 0.041 rising; 3e-5: flat
at 0.0026 from step 4; 1e-5: 7.80, 3.67, 0.79, 0.070, 0.0065); 1e-4 had made the 4B model's loss rise at step 3.
The claim needs the loss to fall at every step. The paper's single-DGX-2 results are set beside them scaled by memory: the
GPU-only 1T model needs 800 V100s (0.039 parameters per byte of GPU memory), while ZeRO-Infinity fine-tunes 1T on
one DGX-2 (16 x 32 GB GPU + 1.5 TB CPU memory: 0.50 parameters per byte of memory).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from repro.experiments.base import Experiment, Point, RunContext
from repro.verdicts import check_condition, not_run
from repro.vocabulary import ClaimCheck, Null

PAPER = "zero_infinity_2021"
#: parameters per byte of memory in the paper: GPU-only (1T needs 800 x 32 GB V100, abstract) and ZeRO-Infinity
#: (1T fine-tuned on one DGX-2: 16 x 32 GB of GPU memory + 1.5 TB of CPU memory, abstract)
PAPER_PARAMS_PER_BYTE = {"memory": 1e12 / (800 * 32e9), "nvme": 1e12 / (16 * 32e9 + 1.5e12)}
FAMILIES = {
    "ci": dict(vocab_size=128, hidden_size=64, num_attention_heads=4, max_position_embeddings=16,
               layers=(1, 2, 4, 6, 8, 12, 16)),
    "paper": dict(vocab_size=1000, hidden_size=4096, num_attention_heads=32, max_position_embeddings=32,
                  layers=(1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24)),
}
METRICS = ("candidate_host_bytes_per_rank", "candidate_disk_bytes", "params", "model_state_bytes",
           "model_state_over_memory", "construction_peak_rss_bytes", "construction_block_bytes",
           "train_peak_rss_bytes", "swap_used_bytes", "loss", "step_time_s", "update_time_s", "nvme_read_bytes",
           "nvme_written_bytes", "nvme_read_gbs", "nvme_write_gbs", "nvme_read_busy_s", "nvme_write_busy_s",
           "nvme_read_busy_gbs", "nvme_write_busy_gbs", "nvme_read_busy_over_raw", "nvme_write_busy_over_raw",
           "raw_read_gbs", "raw_write_gbs", "raw_mixed_read_gbs", "raw_mixed_write_gbs",
           "nvme_regime_s", "nvme_regime_gbs", "nvme_regime_over_raw",
           "paper_params_scaled", "machine_memory_bytes")


def _candidates(scale: str):
    from repro.models import GPTConfig

    family = dict(FAMILIES[scale])
    layers = family.pop("layers")
    return [GPTConfig(num_layers=n, hidden_dropout=0.0, attention_dropout=0.0, **family) for n in layers]


def _budgets(params: dict, path: str) -> tuple[int, int, int]:
    """(machine memory, memory budget, disk budget): the point's own numbers, else this machine's (available
    memory x 0.8, free disk under the NVMe path x 0.85)."""
    with open("/proc/meminfo", encoding="ascii") as handle:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle}
    stat = os.statvfs(path)
    memory = params.get("memory_budget_bytes") or int(info["MemAvailable"] * 0.8)
    disk = params.get("disk_budget_bytes") or int(stat.f_bavail * stat.f_frsize * 0.85)
    return info["MemTotal"], memory, disk


def _candidate_rows(table: list[dict], common: dict) -> list[dict]:
    """The host and disk bytes of every candidate size, whether it fits the budgets and which one was chosen."""
    rows = []
    for row in table:
        label = {**common, "num_layers": row["config"].num_layers, "candidate_params": row["psi"],
                 "fits": row["fits"], "chosen": row["chosen"], "evidence": "derived"}
        rows += [{"metric": "candidate_host_bytes_per_rank", "value": row["host_bytes_per_rank"], "unit": "bytes",
                  **label},
                 {"metric": "candidate_disk_bytes", "value": row["disk_bytes"], "unit": "bytes", **label}]
    return rows


def _model_rows(got: dict, per_rank: list[dict], machine_memory: int, tier: str, common: dict) -> list[dict]:
    """The model state against the machine's memory (ZeRO-Infinity Fig. 1 and 5a), and each rank's peak
    resident memory while building and training."""
    rows = [
        {"metric": "params", "value": got["psi"], "unit": "params", **common},
        {"metric": "model_state_bytes", "value": got["model_state_bytes"], "unit": "bytes", **common},
        {"metric": "model_state_over_memory", "value": got["model_state_bytes"] / machine_memory, "unit": "x",
         **common},
        {"metric": "machine_memory_bytes", "value": machine_memory, "unit": "bytes", **common},
        {"metric": "paper_params_scaled", "value": PAPER_PARAMS_PER_BYTE[tier] * machine_memory, "unit": "params",
         **{**common, "evidence": "arithmetic on the paper's numbers"}},
    ]
    for rank, mine in enumerate(per_rank):
        mine_common = {**common, "rank": rank}
        rows += [
            {"metric": "construction_peak_rss_bytes", "value": mine["construction_peak_rss"], "unit": "bytes",
             **mine_common},
            {"metric": "construction_block_bytes", "value": mine["construction_block_bytes"], "unit": "bytes",
             **mine_common},
            {"metric": "train_peak_rss_bytes", "value": mine["train_peak_rss"], "unit": "bytes", **mine_common},
            {"metric": "swap_used_bytes", "value": mine["swap_used"], "unit": "bytes", **mine_common},
        ]
    return rows


def _nvme_step_rows(step: int, per_rank: list[dict], slowest: float, raw: dict | None,
                    step_common: dict) -> list[dict]:
    """One step's NVMe traffic: bytes, bandwidth over the step and over the drive's busy time, and the busy time
    split into I/O regimes, each against the raw drive where it was measured."""
    from repro.zero.offload.aio import union_seconds
    from repro.zero.offload.io_regimes import REGIMES, regime_bandwidths, split_regimes

    read = sum(r["bytes_read"][step] for r in per_rank)
    written = sum(r["bytes_written"][step] for r in per_rank)
    busy = {d: union_seconds([i for r in per_rank for i in r[f"{d}_busy_intervals"][step]])
            for d in ("read", "write")}
    rows = [
        {"metric": "nvme_read_bytes", "value": read, "unit": "bytes", **step_common},
        {"metric": "nvme_written_bytes", "value": written, "unit": "bytes", **step_common},
        # both ranks share one drive: their bytes over the step's wall time (I/O overlaps compute, so
        # this is what the step achieved, a lower bound of the drive's busy bandwidth)
        {"metric": "nvme_read_gbs", "value": read / slowest / 1e9, "unit": "GB/s", **step_common},
        {"metric": "nvme_write_gbs", "value": written / slowest / 1e9, "unit": "GB/s", **step_common},
        # the same bytes over the time the drive had at least one of the tier's requests (either rank's)
        # executing in that direction: the bandwidth the tier achieved while moving data
        {"metric": "nvme_read_busy_s", "value": busy["read"], "unit": "s", **step_common},
        {"metric": "nvme_write_busy_s", "value": busy["write"], "unit": "s", **step_common},
        {"metric": "nvme_read_busy_gbs", "value": read / busy["read"] / 1e9 if busy["read"] else None,
         "unit": "GB/s", **step_common},
        {"metric": "nvme_write_busy_gbs", "value": written / busy["write"] / 1e9 if busy["write"] else None,
         "unit": "GB/s", **step_common},
    ]
    if raw is not None:
        rows += [{"metric": f"nvme_{d}_busy_over_raw", "unit": "fraction", **step_common,
                  "value": (b / busy[d] / 1e9) / raw[f"{d}_gbs"] if busy[d] else None}
                 for d, b in (("read", read), ("write", written))]
    # the busy time split into reads alone, writes alone and both at once (io_regimes), each direction's
    # bandwidth in a regime against the raw drive in the same regime
    regimes = regime_bandwidths(split_regimes([b for r in per_rank for b in r["read_blocks"][step]],
                                              [b for r in per_rank for b in r["write_blocks"][step]]))
    for regime in REGIMES:
        rows.append({"metric": "nvme_regime_s", "value": regimes[f"{regime}_s"], "unit": "s",
                     "regime": regime, **step_common})
    for key, reference in (("read_alone", "read_gbs"), ("write_alone", "write_gbs"),
                           ("read_both", "mixed_read_gbs"), ("write_both", "mixed_write_gbs")):
        got_gbs = regimes[f"{key}_gbs"]
        rows.append({"metric": "nvme_regime_gbs", "value": got_gbs, "unit": "GB/s", "regime": key,
                     **step_common})
        if raw is not None:
            rows.append({"metric": "nvme_regime_over_raw", "unit": "fraction", "regime": key,
                         "value": None if got_gbs is None else got_gbs / raw[reference], **step_common})
    return rows


def _step_rows(got: dict, per_rank: list[dict], tier: str, raw: dict | None, common: dict) -> list[dict]:
    """Each training step: its loss, the slowest rank's step and update times and, on the NVMe tier, its traffic."""
    rows = []
    for step, loss in enumerate(got["losses"]):
        step_common = {**common, "step": step}
        slowest = max(r["step_s"][step] for r in per_rank)
        rows += [
            {"metric": "loss", "value": loss, "unit": "nats", **step_common},
            {"metric": "step_time_s", "value": slowest, "unit": "s", **step_common},
            {"metric": "update_time_s", "value": max(r["update_s"][step] for r in per_rank), "unit": "s",
             **step_common},
        ]
        if tier == "nvme":
            rows += _nvme_step_rows(step, per_rank, slowest, raw, step_common)
    return rows


def _raw_disk_rows(raw: dict, common: dict) -> list[dict]:
    """The raw drive's read, write and mixed bandwidth, with how it was measured."""
    how = {"direct_io": raw["direct"], "bytes_moved": raw["bytes"], "block_bytes": raw["block_bytes"],
           "io_threads": raw["io_threads"]}
    rows = [{"metric": "raw_read_gbs", "value": raw["read_gbs"], "unit": "GB/s", **common, **how},
            {"metric": "raw_write_gbs", "value": raw["write_gbs"], "unit": "GB/s", **common, **how}]
    return rows + [{"metric": f"raw_mixed_{d}_gbs", "value": raw[f"mixed_{d}_gbs"], "unit": "GB/s", **common,
                    **how, "note": "readers and writers in flight at once"} for d in ("read", "write")]


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    """Choose the largest candidate that fits this machine's budgets on the point's tier, train it a few steps
    on every rank, and return rank 0's rows (the other ranks return none)."""
    import torch
    import torch.distributed as dist

    from repro.dist import init_parallel
    from repro.experiments.zero_measure import nvme_dir
    from repro.experiments.zero_model_scale import largest_fitting, placement, scale_run
    from repro.zero.offload.bandwidth import raw_disk_bandwidth

    groups = init_parallel()
    torch.set_num_threads(1)
    tier, params = point.params["tier"], point.params
    path = nvme_dir(str(ctx.scratch_dir))
    machine_memory, memory_budget, disk_budget = _budgets(params, path)
    shape = dict(world_size=groups.dp_size, micro_batch=params["micro_batch"], seq_len=params["seq_len"],
                 bucket_numel=params["bucket_numel"])
    table = largest_fitting(_candidates(ctx.scale), tier=tier, memory_budget=memory_budget,
                            disk_budget=disk_budget, **shape)
    common = {"tier": tier, "nd": groups.dp_size, "memory_budget_bytes": memory_budget,
              "disk_budget_bytes": disk_budget}
    rows = _candidate_rows(table, common)
    chosen = [row["config"] for row in table if row["chosen"]]
    if not chosen:
        return rows
    config = chosen[0]
    log_path = os.environ.get("REPRO_SCALE_LOG")  # progress of a long run, one file per rank

    def log(message: str) -> None:
        if log_path:
            with open(f"{log_path}.rank{groups.rank}", "a", encoding="utf-8") as handle:
                handle.write(message + "\n")

    got = scale_run(config, placement(tier, path, params["bucket_numel"]), groups, steps=params["steps"],
                    micro_batch=params["micro_batch"], seq_len=params["seq_len"], lr=params["lr"], log=log)
    per_rank = [None] * groups.world_size
    dist.all_gather_object(per_rank, got)
    raw = raw_disk_bandwidth(path, params["raw_bytes"]) if tier == "nvme" and groups.rank == 0 else None
    if groups.rank != 0:
        return []
    common = {**common, "num_layers": config.num_layers, "hidden_size": config.hidden_size,
              "vocab_size": config.vocab_size, "seq_len": params["seq_len"], "micro_batch": params["micro_batch"],
              "psi": got["psi"], "lr": params["lr"], "evidence": "measured"}
    rows += _model_rows(got, per_rank, machine_memory, tier, common) + _step_rows(got, per_rank, tier, raw, common)
    return rows + (_raw_disk_rows(raw, common) if raw is not None else [])


def claims(rows) -> list[ClaimCheck]:
    if rows is None or len(rows) == 0 or "tier" not in rows:
        return [not_run(PAPER, "finetune_1T_one_dgx2", evidence="measured")]
    measured = rows[(rows["metric"] == "model_state_over_memory") & (rows["tier"] == "nvme")]
    losses = rows[(rows["metric"] == "loss") & (rows["tier"] == "nvme")].sort_values("step")
    if not len(measured) or not len(losses):
        return [not_run(PAPER, "finetune_1T_one_dgx2", evidence="measured")]
    ratio = float(measured["value"].iloc[-1])
    null = no_offload_null(rows, measured)
    values = [float(v) for v in losses["value"]]
    # the loss on the repeated batch must be finite and fall at every step, not only end below where it started
    falling = len(values) >= 2 and all(math.isfinite(v) for v in values) and all(
        later < earlier for earlier, later in zip(values, values[1:]))
    return [check_condition(
        PAPER, "finetune_1T_one_dgx2", ratio, holds=ratio > 1.0 and falling,
        tolerance="model states > machine memory, loss falling at every step", evidence="measured", null=null,
        basis="zero_infinity_model_scale:nvme:model_state_over_memory",
        note="measured: model states (16 B/param) over this machine's memory for the largest GPT trained with "
             "params, optimizer states and gradients on NVMe; the loss on a repeated batch falls at every step "
             f"({', '.join(f'{v:.3f}' for v in values)})")]


def no_offload_null(rows, measured) -> Null:
    """The naive model of the claim: no offload, so the model states (16 B/param) must fit this machine's memory.
    Its value is the ratio of the largest of the point's candidates that would (at best 1.0, the bound itself, when
    the rows hold no candidates); it cannot exceed memory, so it fails the claim's condition by construction: the
    claim is decisive only in that the suite trained past it."""
    memory = rows[(rows["metric"] == "machine_memory_bytes") & (rows["tier"] == "nvme")]
    candidates = rows[(rows["metric"] == "candidate_disk_bytes") & (rows["tier"] == "nvme")]
    value = 1.0
    if len(memory) and len(candidates) and "candidate_params" in candidates:
        total = float(memory["value"].iloc[-1])
        states = [16 * float(p) for p in candidates["candidate_params"].dropna() if 16 * float(p) <= total]
        value = max(states, default=0.0) / total
    return Null("no offload: the largest candidate whose 16 B/param model states fit this machine's memory",
                value, holds=value > 1.0)


def figure(rows, paper_claims, out_dir: Path) -> list[Path]:
    """Largest trainable model per tier here vs the paper's scaled by memory; step time and disk bandwidth."""
    from repro.optional import require

    matplotlib = require("matplotlib", "the ZeRO-Infinity model-scale figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures.common import caption, rows_provenance, save_figure

    if rows is None or len(rows) == 0 or "tier" not in rows:
        return []
    scales = set(rows["scale"]) if "scale" in rows else set()
    scale = next((s for s in ("paper", "ci", "smoke") if s in scales), "ci")
    if scales:
        rows = rows[rows["scale"] == scale].reset_index(drop=True)  # one scale: the one the claim is decided at
    tiers = [t for t in ("memory", "nvme") if len(rows[(rows["metric"] == "params") & (rows["tier"] == t)])]
    if not tiers:
        return []
    fig, (ax_size, ax_bw) = plt.subplots(1, 2, figsize=(11, 4.6))
    x = range(len(tiers))
    measured = [float(rows[(rows["metric"] == "params") & (rows["tier"] == t)]["value"].iloc[-1]) / 1e9
                for t in tiers]
    paper = [float(rows[(rows["metric"] == "paper_params_scaled") & (rows["tier"] == t)]["value"].iloc[-1]) / 1e9
             for t in tiers]
    ax_size.bar([i - 0.2 for i in x], measured, 0.4, label="measured here (trained)", color="#55A868")
    ax_size.bar([i + 0.2 for i in x], paper, 0.4, label="paper, scaled by memory", color="#4C72B0")
    memory = float(rows[rows["metric"] == "machine_memory_bytes"]["value"].iloc[-1])
    ax_size.axhline(memory / 16 / 1e9, color="grey", ls="--", lw=1, label="16 B/param = machine memory")
    for i, t in enumerate(tiers):
        step = rows[(rows["metric"] == "step_time_s") & (rows["tier"] == t)]["value"]
        ax_size.annotate(f"{measured[i]:.2f}B\n{step.iloc[-1]:.0f} s/step", (i - 0.2, measured[i]), ha="center",
                         va="bottom", fontsize=9)
    ax_size.set_xticks(list(x), [{"memory": "memory only", "nvme": "NVMe (params+opt+grads)"}[t] for t in tiers])
    ax_size.set_ylabel("largest GPT trained (billion parameters)")
    ax_size.set_title("Model scale per tier (cf. ZeRO-Infinity Fig. 1 / 5a)")
    ax_size.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    bw = rows[rows["tier"] == "nvme"]
    names = [("nvme_read_gbs", "tier read\n/ step time"), ("nvme_read_busy_gbs", "tier read\n/ I/O time"),
             ("raw_read_gbs", "raw read"), ("nvme_write_gbs", "tier write\n/ step time"),
             ("nvme_write_busy_gbs", "tier write\n/ I/O time"), ("raw_write_gbs", "raw write")]
    values = []
    for metric, _ in names:
        got = bw[bw["metric"] == metric]["value"].dropna() if len(bw[bw["metric"] == metric]) else []
        values.append(float(got.iloc[-1]) if len(got) else 0.0)
    colors = ["#55A868", "#8172B2", "#999999"] * 2
    ax_bw.bar(range(len(names)), values, color=colors)
    ax_bw.set_xticks(range(len(names)), [label for _, label in names], fontsize=9)
    for i, value in enumerate(values):
        ax_bw.text(i, value, f"{value:.2f}", ha="center", va="bottom", fontsize=9)
    ax_bw.set_ylabel("GB/s (both ranks, last step)")
    ax_bw.set_title("Achieved NVMe bandwidth vs raw O_DIRECT, same run")
    fig.tight_layout()
    caption(fig, "ZeRO-Infinity model scale on this machine. Left: the largest GPT trained per tier (memory only; "
            "parameters, optimizer states and gradients on NVMe), beside the paper's model scale (Rajbhandari et al. "
            "2021, Fig. 1/5a) scaled by this machine's memory, with the step time; the dashed line is the model whose "
            "16 B/param of model states equal the machine's memory. Right: the NVMe tier's achieved bandwidth over "
            "the step time and over its own I/O time, beside the raw O_DIRECT bandwidth measured in the same run.")
    return save_figure(fig, out_dir, "zero_infinity_model_scale", rows_provenance(rows, scale))


_CI = dict(micro_batch=2, seq_len=16, bucket_numel=20_000, steps=3, raw_bytes=16 << 20, lr=1e-4,
           memory_budget_bytes=2 * (600 << 20) + 8_000_000, disk_budget_bytes=24_000_000)
_PAPER = dict(micro_batch=1, seq_len=32, bucket_numel=50_000_000, steps=3, raw_bytes=2 << 30, lr=1e-5)

EXPERIMENT = Experiment(
    name="zero_infinity_model_scale",
    paper=PAPER,
    title="ZeRO-Infinity: the largest GPT each tier (memory, NVMe) trains on this machine",
    points={
        "ci": (Point("memory", {"tier": "memory", **_CI}, world_size=2, memory_gib=0.8),
               Point("nvme", {"tier": "nvme", **_CI}, world_size=2, memory_gib=0.8)),
        "paper": (Point("memory", {"tier": "memory", **_PAPER}, world_size=2, memory_gib=10.0),
                  # 4.03B at 03ac63f: train peak RSS 5.83 GiB per rank (gloo pieces' and pools' memory included)
                  Point("nvme", {"tier": "nvme", **_PAPER}, world_size=2, memory_gib=8.0)),
    },
    run_point=run_point,
    claims=claims,
    figure=figure,
    description=__doc__ or "",
    budget_s={"ci": 60},
    metrics=METRICS,
    # A model larger than memory is what the ci point, by design, does not train: only the paper point decides.
    decided_at={"finetune_1T_one_dgx2": "paper"},
)
