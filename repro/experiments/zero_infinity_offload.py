"""ZeRO-Infinity measured on this machine: stage 3 with parameters and optimizer states on the device, in CPU
memory or on NVMe (a directory), and the NVMe tier's bandwidth against the raw drive's in the same run.

Rows per placement: model-state bytes per rank on each tier, their total per parameter (16 B/param for bf16
parameters and gradients with fp32 Adam, the figure ZeRO-Infinity sec. 3 uses), the step time and its slowdown
against no offload, and the model-state working memory (MSWM, sec. 3): the largest gathered parameter buffer plus
its full gradient buffer, 4 bytes x hd x 4hd for the h -> 4h linear layer. On a CPU-only machine the "device" and
"cpu" tiers are the same memory, so only the NVMe placement changes where bytes live.

Evidence: the bytes per parameter are the dtypes the run configures (``configuration``); MSWM is the 16-bit
parameter and gradient buffers of the largest layer, dtype sizes times the layer's shape (2 + 2 bytes x hd x 4hd):
any correct implementation that gathers one layer at a time holds exactly that, so the ledger's value is
``conformance`` (the implementation is the design), shown and tested, never counted as reproduced.
"""

from __future__ import annotations

from repro.experiments.base import Experiment, Point, RunContext
from repro.verdicts import check_condition, not_run
from repro.vocabulary import ClaimCheck
from repro.models import GPTConfig

PAPER = "zero_infinity_2021"
MODELS = {
    # vocabulary < 4 x hidden so that the h -> 4h linear layer is the largest operator, as MSWM assumes
    "ci": GPTConfig(vocab_size=256, hidden_size=128, num_layers=4, num_attention_heads=4,
                    max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0),
    "paper": GPTConfig(vocab_size=50257, hidden_size=8192, num_layers=8, num_attention_heads=64,
                       max_position_embeddings=1024, hidden_dropout=0.0, attention_dropout=0.0),
}
PLACEMENTS = {"none": ("none", "none"), "cpu": ("cpu", "cpu"), "nvme-optimizer": ("nvme", "none"),
              "nvme": ("nvme", "nvme")}


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.dist import init_parallel
    from repro.zero import OffloadConfig, ZeroConfig
    from repro.experiments.zero_measure import RunSpec, measure_run, nvme_dir
    from repro.zero.offload.bandwidth import raw_disk_bandwidth, tier_bandwidth

    groups = init_parallel()
    path = nvme_dir(str(ctx.scratch_dir))
    model = MODELS[point.params["model"]]
    rows, base_time = [], None
    for name, (optimizer_device, param_device) in PLACEMENTS.items():
        offload = {d: OffloadConfig(d, nvme_path=path if d == "nvme" else None) for d in ("none", "cpu", "nvme")}
        config = ZeroConfig(stage=3, dtype="bf16", offload_optimizer=offload[optimizer_device],
                            offload_param=offload[param_device])
        got = measure_run(RunSpec(model=model, zero=config, micro_batch=2, seq_len=point.params["seq_len"],
                                  steps=3), groups, device=ctx.device)
        psi, nd = got["psi"], got["dp_size"]
        common = {"placement": name, "optimizer_tier": optimizer_device, "param_tier": param_device, "nd": nd,
                  "psi": psi, "hidden_size": model.hidden_size}
        by_tier: dict[str, float] = {}
        for key, value in got["ledger"].items():
            kind, tier = key.split("/")
            if kind in ("params", "grads", "master", "optimizer_states"):
                by_tier[tier] = by_tier.get(tier, 0) + value
        base_time = got["step_time_s"] if name == "none" else base_time
        largest = got["transient_largest"]
        mswm = largest.get("working_params", 0) + largest.get("comm_buffers", 0)
        rows += [{"metric": f"model_state_bytes_{tier}", "value": value, "unit": "bytes", **common}
                 for tier, value in by_tier.items()]
        rows += [
            {"metric": "model_state_bytes_per_param", "value": sum(by_tier.values()) * nd / psi,
             "unit": "bytes/param", **common},
            {"metric": "step_time_s", "value": got["step_time_s"], "unit": "s", **common},
            {"metric": "slowdown_vs_none", "value": got["step_time_s"] / base_time, "unit": "x", **common},
            {"metric": "mswm_bytes", "value": mswm, "unit": "bytes", **common},
            {"metric": "mswm_over_hd2", "value": mswm / model.hidden_size ** 2, "unit": "bytes/hd^2", **common},
            {"metric": "rss_peak_bytes", "value": got["rss_peak"], "unit": "bytes", **common},
        ]
    if groups.rank == 0:
        size = point.params["bandwidth_bytes"]
        raw, tier = raw_disk_bandwidth(path, size), tier_bandwidth(path, size)
        for direction in ("read", "write"):
            common = {"direction": direction, "direct_io": bool(tier["direct"]), "bytes_moved": tier["bytes"]}
            rows += [
                {"metric": "raw_disk_gbs", "value": raw[f"{direction}_gbs"], "unit": "GB/s", **common},
                {"metric": "nvme_tier_gbs", "value": tier[f"{direction}_gbs"], "unit": "GB/s", **common},
                {"metric": "nvme_tier_over_raw", "value": tier[f"{direction}_gbs"] / raw[f"{direction}_gbs"],
                 "unit": "fraction", **common},
            ]
    return rows


def claims(rows) -> list[ClaimCheck]:
    if rows is None or len(rows) == 0:
        return [not_run(PAPER, "model_state_bytes", evidence="configuration"),
                not_run(PAPER, "mswm_bytes", evidence="conformance")]
    checks = []
    per_param = rows[(rows["metric"] == "model_state_bytes_per_param") & (rows["placement"] == "nvme")]
    if len(per_param):
        value = float(per_param["value"].iloc[0])
        checks.append(check_condition(  # the paper's value is a formula (192 nl hd^2): compared with 16 B/param
            PAPER, "model_state_bytes", value, holds=abs(value - 16) <= 0.32, tolerance="16 B/param ±2%",
            evidence="configuration", says=("equals 16 B/param", "differs from 16 B/param"),
            note="bytes per parameter over all tiers (bf16 params+grads, fp32 master+Adam moments) with params and "
                 "optimizer states on NVMe, 2 + 2 + 12 by the dtypes configured and read back by the ledger (it "
                 "supports the 16 B/param (192 nl hd^2) reading, not 20 B/param)"))
    mswm = rows[(rows["metric"] == "mswm_over_hd2") & (rows["placement"] == "nvme")]
    if len(mswm):
        value = float(mswm["value"].iloc[0])
        checks.append(check_condition(
            PAPER, "mswm_bytes", value, holds=abs(value - 16) <= 0.32, tolerance="16 hd^2 ±2%",
            evidence="conformance", basis="zero_infinity_offload:mswm_over_hd2", note="measured largest gathered 16-bit parameter buffer + its full 16-bit gradient buffer, / hd^2 (the "
                 "bias adds 16/hd)"))
    return checks


EXPERIMENT = Experiment(
    name="zero_infinity_offload",
    paper=PAPER,
    title="ZeRO-Infinity: stage 3 with cpu / NVMe offload measured; NVMe tier vs raw drive bandwidth",
    points={
        "ci": (Point("dp2", {"model": "ci", "seq_len": 32, "bandwidth_bytes": 128 << 20}, world_size=2,
                     memory_gib=0.6),),
        "paper": (Point("hd8192-dp8", {"model": "paper", "seq_len": 1024, "bandwidth_bytes": 8 << 30}, world_size=8,
                        needs_gpu=True, memory_gib=64.0),),
    },
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"ci": 40},
)
