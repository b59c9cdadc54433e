"""GNA speedups measured on this machine: the tile-sparse CPU kernel against dense SDPA, beside the tile bound.

The paper measures its Blackwell kernel (B200); here the same question (how much of the simulator's bound does a
tiled kernel realise, and does a perfectly block-sparse configuration reach it?) is asked of the CPU kernel of
``repro.gna.fast``, on problems shaped like the paper's (``repro.gna.benchmark``). The paper's measured speedups,
throughputs and runtimes need its B200 kernel and are reported as "needs GPU", with the CPU analogue in the note.
Timings use one thread per side (see ``bench/test_gna_bench.py`` for why).
"""

from __future__ import annotations

from repro.verdicts import needs_gpu
from repro.experiments.base import Experiment, Point, RunContext
from repro.vocabulary import ClaimCheck
from repro.gna.bench_problems import PAPER_SHAPED, SMALL  # the benchmark itself imports torch: run_point imports it

PAPER = "gna_2025"
CONFIGS = {c.name: c for c in PAPER_SHAPED + SMALL}

_MEASURED = ("speedup", "paired_speedup", "bound", "flopwise_bound", "fraction_of_bound", "dense_s", "gna_s",
             "flex_s", "flex_speedup", "gna_over_flex")
_UNITS = {"dense_s": "s", "gna_s": "s", "flex_s": "s", "fraction_of_bound": "fraction"}


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    import torch

    from repro.gna.benchmark import measure

    config = CONFIGS[point.params["config"]]
    threads = torch.get_num_threads()
    torch.set_num_threads(point.params.get("threads", 1))
    try:
        result = measure(config, backward=point.params["backward"], rounds=point.params.get("rounds", 5),
                         flex=point.params.get("flex", False))
    finally:
        torch.set_num_threads(threads)
    fixed = {k: v for k, v in result.items() if k not in _MEASURED}
    return [
        dict(metric=name, value=float(result[name]), unit=_UNITS.get(name, "x"), **fixed)
        for name in _MEASURED
        if name in result
    ]


# Claims that are B200 measurements: the paper's measured column of Tables 2-6 and its throughput / end-to-end
# statements. Their ids are read from the claims table by pattern, not listed by hand.
_GPU_IDS = ("fmha_peak_fp16_abstract", "cutlass_fmha_fp16", "gna_kernel_fp16_concl", "gna_kernel_fp8_concl",
            "e2e_min_abstract", "e2e_max_abstract", "e2e_max_intro", "cosmos_e2e_concl", "hunyuan_e2e_concl",
            "flux_e2e_concl")


def claims(rows) -> list[ClaimCheck]:
    from repro.paper import load_claims

    note = "needs the paper's Blackwell FNA kernel on a B200"
    if rows is not None and len(rows) and "metric" in rows:
        fraction = rows[(rows["metric"] == "fraction_of_bound") & (rows["block_sparse"] == True)]  # noqa: E712
        if len(fraction):
            note += (f"; CPU analogue: on block-sparse configs the CPU kernel reaches "
                     f"{fraction['value'].min():.2f}-{fraction['value'].max():.2f} of its tile bound over dense SDPA")
    from repro.experiments.gna_speedup_gpu import mapped_claim_ids

    table = load_claims()
    ids = table[table["paper"] == PAPER]["claim_id"]
    on_gpu = set(mapped_claim_ids())  # the measured end-to-end speedups: gna_speedup_gpu maps those
    measured = [i for i in ids if (i.endswith("_actual") or i in _GPU_IDS) and i not in on_gpu]
    return [needs_gpu(PAPER, claim_id, note) for claim_id in measured]


def _point(config: str, backward: bool, **params) -> Point:
    return Point(f"{config}_{'fwd_bwd' if backward else 'fwd'}", {"config": config, "backward": backward, **params},
                 memory_gib=2.0)


EXPERIMENT = Experiment(
    name="gna_speedup",
    paper=PAPER,
    title="GNA on CPU: measured speedup of the tile-sparse kernel over dense attention vs the simulator's bound",
    points={
        "ci": tuple(_point(c.name, b, rounds=3) for c in SMALL for b in (False, True)),
        "paper": tuple(_point(c.name, b, flex=not b and c.name != PAPER_SHAPED[-1].name)
                       for c in PAPER_SHAPED for b in (False, True)),
    },
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
)
