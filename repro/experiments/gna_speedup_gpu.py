"""GNA on a GPU: compiled FlexAttention with the GNA block mask against the fastest dense SDPA backend of the device,
at the paper's FLUX, HunyuanVideo and Cosmos shapes (GNA §4, Tables 2-5), beside the tile simulator's bound.

Every configuration of Tables 2-4 (and Table 5's two window-self-attention rows) is a point, forward and
forward + backward: token grid, window and stride from :mod:`repro.experiments.gna_simulator`; query / KV tiles as
there (FLUX Q 16x16 / KV 16x8, HunyuanVideo Q 4x8x8 / KV 2x8x8). The paper does not state Cosmos' tiles: its
points use HunyuanVideo's 3-D tiles (``tiles_stated`` is False in their rows). Heads and head_dim are the models' own
(public model configurations, not the paper: FLUX.1-dev and HunyuanVideo 24 x 128, Cosmos-7B 32 x 128); batch 1
(one image or video per forward, as in generation). bf16, one GPU. The memory estimate of every paper point
(dense backward and the fp32 reference check included) is at most 21 GiB, far below an H100's 80 GB, so no
point reduces heads; a smaller GPU would (``heads`` < ``model_heads`` in the rows then, with ``heads_note``).

Per point (:func:`repro.gna.gpu_benchmark.measure`): dense SDPA, the Flex kernel on tile-ordered tokens, and the
whole op (with token permutation), each timed after warm-up (3) over up to 10 iterations, fewer (not below 3) when
the point would pass its time cap (60 s, compilation included: the first point of a model and pass compiles for
a minute or two and then times 3 iterations). The dense contender is the fastest SDPA backend for the point's shape,
dtype and direction (:mod:`repro.gna.dense_baseline`): every backend torch offers (cuDNN, flash, memory-efficient,
math) is tried, those without a kernel for it skipped with their reason (``dense_probe_notes``), the others probed
for 3 iterations within a quarter of the time cap (``dense_probe_iters``, ``dense_probe_cap_s``), and the fastest,
named in ``dense_backend``, is timed in full and divides the speedups. Rows (:func:`point_rows`): dense and GNA
times, one ``dense_probe_s`` row per backend probed (``sdpa_backend``), measured speedup (kernel and op), the
simulator's bounds for these tiles (``bound``: the paper's NATTEN-Sim worst-tile bound; ``work_bound``: all
visited tiles), fraction of bound, block sparsity, and the op's max abs / relative error against dense SDPA with
the GNA mask at 256 sampled queries (out, and dq with backward; every query at smoke size).

Order: a forward point and a forward + backward point per configuration, the runner writing each point's rows
before the next starts. The paper scale starts with the forward points of §5's FLUX 4K and HunyuanVideo
configurations (:data:`FIRST_CONFIGS`), then their forward + backward points, then every other forward point, then
every other forward + backward point; points chosen with ``--point`` run in this order too. A time slot of a few
minutes (``repro run gna_speedup_gpu --scale paper --point flux1dev_4k_w80x80_s16x16_fwd --point
hunyuanvideo_w18x24x24_s16x8x8_fwd --point flux1dev_4k_w80x80_s16x16_fwd_bwd --point
hunyuanvideo_w18x24x24_s16x8x8_fwd_bwd`` under ``timeout``) thus measures forward for both shapes first, and
backward only with the time that remains; naming only the ``_fwd`` points runs forward only.

Scales: ``smoke`` runs two toy grids forward on CPU (Flex eager: FlexAttention has no CPU backward) through the same
code, in CI; ``paper`` needs a GPU (``repro run gna_speedup_gpu --scale paper --device cuda``).

Claims: the paper's measured end-to-end speedups (Tables 2-6 "actual", §5) are B200 runs of its own kernel inside
the models. A row of this experiment is an op-level measurement of Flex; the value compared is the end-to-end
speedup Amdahl's law makes of the measured forward op speedup (Table 1's attention share): an estimate, so
``predicted`` evidence, never ``measured``, and by the cross-hardware rule (:mod:`repro.cross_hardware`) a ratio on
one GPU, compared on any GPU and counted apart ("on other hardware") off a B200. The note gives the measured op
speedups (forward and forward + backward), the simulator's bound and the fraction of it realised. Amdahl flattens op
speedups: every op speedup above ~4x passes ±10 % of the paper's HunyuanVideo and FLUX cells, so each estimate is set
against its null, the FLOP-wise ratio of the configuration through the same Amdahl (the note gives the range of op
speedups that pass), and names the measured op speedup it was computed from (``basis``): the cells of Tables 2-6 and
§5 that restate one configuration at another number of self-attention steps count once.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING

from repro.verdicts import needs_gpu
from repro.cross_hardware import ESTIMATE, compare
from repro.experiments.base import Experiment, Point, Resources, RunContext
from repro.vocabulary import ClaimCheck
from repro.experiments.gna_simulator import MODELS, TABLE5, TABLE_ROWS, attention_share, table1_shares
from repro.experiments.gna_simulator_claims import MEASURED_REL
from repro.gna.gpu_config import GpuConfig, estimate_memory_gib, heads_that_fit
from repro.gna.spec import GNASpec
from repro.paper import evidence_from, paper_value
from repro.vocabulary import Null

if TYPE_CHECKING:  # torch, the benchmark and the simulator are imported where they run: the points are declared
    import torch  # without them (repro list, Slurm's planning step)

PAPER = "gna_2025"

#: Heads of the models' attention layers (public model configurations; head_dim 128 in all three).
MODEL_HEADS = {"flux1dev_4k": 24, "hunyuanvideo": 24, "cosmos7b": 32}


def _ints(values) -> tuple[int, ...]:  # gna_simulator holds grids, windows and tiles as the paper's numbers
    return tuple(int(v) for v in values)


#: Cosmos' tiles are not stated by the paper; HunyuanVideo's 3-D tiles stand in for them.
COSMOS_TILES = (_ints(MODELS["hunyuanvideo"].q_tile), _ints(MODELS["hunyuanvideo"].kv_tile))


def _shape(values) -> str:
    return "x".join(str(int(v)) for v in values)


def _paper_configs() -> dict[str, GpuConfig]:
    """Every (model, window, stride) of Tables 2-4 plus Table 5's, once each, cheapest model first."""
    combos = [(model, window, stride) for model, blocks in TABLE_ROWS.items()
              for window, strides, _ in blocks for stride in strides]
    combos += [("hunyuanvideo", window, stride) for window, stride in TABLE5.values()]
    order = {"flux1dev_4k": 0, "cosmos7b": 1, "hunyuanvideo": 2}
    configs: dict[str, GpuConfig] = {}
    combos = [(model, _ints(window), _ints(stride)) for model, window, stride in combos]
    for model, window, stride in sorted(dict.fromkeys(combos), key=lambda c: order[c[0]]):
        tiles = (_ints(MODELS[model].q_tile), _ints(MODELS[model].kv_tile)) if MODELS[model].q_tile else COSMOS_TILES
        name = f"{model}_w{_shape(window)}_s{_shape(stride)}"
        configs[name] = GpuConfig(name, model, _ints(MODELS[model].grid), GNASpec(_ints(window), stride=_ints(stride)),
                                  *tiles, heads=MODEL_HEADS[model])
    return configs


PAPER_CONFIGS = _paper_configs()
#: Toy grids for CPU: one perfectly block-sparse 2-D config, one 3-D config with partial and padded tiles.
SMOKE_CONFIGS = {
    c.name: c for c in (
        GpuConfig("toy2d_w16x16_s8x16", "toy", (16, 32), GNASpec((16, 16), stride=(8, 16)), (8, 16), (8, 16),
                  heads=2, head_dim=64),
        GpuConfig("toy3d_w4x8x8_s2x4x8", "toy", (4, 12, 16), GNASpec((4, 8, 8), stride=(2, 4, 8)), (2, 8, 8),
                  (2, 8, 8), heads=2, head_dim=64),
    )
}
CONFIGS = {**PAPER_CONFIGS, **SMOKE_CONFIGS}

_TIMES = ("dense_s", "gna_s", "gna_op_s", "dense_probe_s")
_RATIOS = ("speedup", "op_speedup", "bound", "work_bound", "flopwise_bound", "fraction_of_bound",
           "fraction_of_work_bound")
_ERRORS = tuple(f"{name}_max_{kind}_error" for name in ("out", "dq", "dk", "dv") for kind in ("abs", "rel"))
METRICS = _TIMES + _RATIOS + ("block_sparse", "sparsity", "dense_tflops", "gna_tflops", "peak_memory_gib") + _ERRORS
_UNITS = {**{m: "s" for m in _TIMES}, **{m: "x" for m in _RATIOS}, "fraction_of_bound": "fraction",
          "fraction_of_work_bound": "fraction", "block_sparse": "bool", "sparsity": "%", "dense_tflops": "TFLOP/s",
          "gna_tflops": "TFLOP/s", "peak_memory_gib": "GiB", **{m: "abs" for m in _ERRORS if "_abs_" in m},
          **{m: "fraction" for m in _ERRORS if "_rel_" in m}}
#: How each metric was obtained (DESIGN.md: evidence is labelled).
_EVIDENCE = {"bound": "simulated", "work_bound": "simulated", "flopwise_bound": "derived", "block_sparse": "simulated",
             "sparsity": "derived"}


def _device(ctx: RunContext) -> torch.device:
    from repro.dist.device import rank_device

    return rank_device(ctx.device, ctx.rank)


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    import torch

    from repro.gna.gpu_benchmark import measure

    params = point.params
    config = CONFIGS[params["config"]]
    device = _device(ctx)
    dtype = getattr(torch, params.get("dtype", "bfloat16"))
    backward = bool(params["backward"])
    heads_note = "the model's heads"
    if device.type == "cuda":
        from repro.dist.device import describe

        gpu = str(describe(device)["name"])
        memory = torch.cuda.get_device_properties(device).total_memory / 2**30
        heads = heads_that_fit(config, backward=backward, dtype=dtype, memory_gib=memory)
        if heads < config.heads:
            heads_note = (f"heads reduced from {config.heads} to {heads}: the estimated "
                          f"{estimate_memory_gib(config, backward=backward, dtype=dtype):.0f} GiB exceed this GPU's "
                          f"{memory:.0f} GiB (the speedup does not depend on the number of heads)")
            config = dataclasses.replace(config, heads=heads)
    else:
        gpu = "cpu"
    threads = torch.get_num_threads()
    if device.type == "cpu" and "threads" in params:
        torch.set_num_threads(params["threads"])
    try:
        result = measure(config, backward=backward, device=device, dtype=dtype, warmup=params.get("warmup", 3),
                         iters=params.get("iters", 10), time_cap_s=params.get("time_cap_s", 60.0),
                         check_queries=params.get("check_queries", 256),
                         dense_probe_iters=params.get("dense_probe_iters", 3),
                         dense_probe_cap_s=params.get("dense_probe_cap_s"))
    finally:
        torch.set_num_threads(threads)
    return point_rows(result, gpu=gpu, model_heads=CONFIGS[params["config"]].heads, heads_note=heads_note,
                      tiles_stated=config.model != "cosmos7b")


def point_rows(result: dict, **columns) -> list[dict]:
    """The rows of one (shape, direction), all made here: one per metric of :func:`measure`'s ``result``, and one
    ``dense_probe_s`` row per SDPA backend the dense ladder probed (its ``sdpa_backend`` and ``probe_iters``), so
    that a reader sees the ladder under ``dense_backend``, the fastest, whose full timing is ``dense_s``. Every row
    carries the result's other entries and ``columns`` (``dense_probe_notes``: the backends not probed, and why)."""
    ladder = {"dense_probe_s", "dense_probe_iters"}
    # block_sparse is both a column (bool, as in gna_speedup's rows) and a metric (1.0 / 0.0).
    fixed = {k: v for k, v in result.items() if (k not in METRICS or k == "block_sparse") and k not in ladder}
    fixed.update(columns)
    rows = [dict(metric=name, value=float(result[name]), unit=_UNITS[name],
                 evidence=_EVIDENCE.get(name, "measured"), **fixed)
            for name in METRICS if name in result and name not in ladder]
    rows += [dict(metric="dense_probe_s", value=float(seconds), unit="s", evidence="measured", sdpa_backend=backend,
                  probe_iters=result["dense_probe_iters"][backend], **fixed)
             for backend, seconds in result["dense_probe_s"].items()]
    return rows


# ---- claims ---------------------------------------------------------------------------------------------------------

_TABLE_ID = re.compile(r"t[234]_(?P<model>[a-z0-9_]+?)_w(?P<window>[\dx]+)_s(?P<stride>[\dx]+)_sa(?P<sa>\d+)_actual$")
#: §5's achieved end-to-end speedups: claim id -> (model, window, stride, initial self-attention steps).
_CONCLUSIONS = {
    "cosmos_e2e_concl": ("cosmos7b", "16x32x48", "1x8x16", 12),
    "hunyuan_e2e_concl": ("hunyuanvideo", "18x24x24", "16x8x8", 15),
    "flux_e2e_concl": ("flux1dev_4k", "80x80", "16x16", 9),
}


def claim_config(claim_id: str) -> tuple[str, str, str, int] | None:
    """(model, window, stride, initial self-attention steps) of a measured end-to-end claim this experiment's
    points cover, or None."""
    match = _TABLE_ID.match(claim_id)
    if match:
        return match["model"], match["window"], match["stride"], int(match["sa"])
    match = re.fullmatch(r"t5_(?P<label>[a-z]+\d+)_e2e_actual", claim_id)
    if match and match["label"] in TABLE5:  # HunyuanVideo with GNA in all 50 steps
        window, stride = TABLE5[match["label"]]
        return "hunyuanvideo", _shape(window), _shape(stride), 0
    match = re.fullmatch(r"t6_s(?P<stride>[\dx]+)_e2e_actual", claim_id)
    if match:  # FLUX 4K (URAE), self attention in the first 9 of 28 steps: the attention op of Table 2
        return "flux1dev_4k", "80x80", match["stride"], 9
    return _CONCLUSIONS.get(claim_id)


def mapped_claim_ids() -> list[str]:
    """The claims of the paper this experiment maps (gna_speedup leaves them to it)."""
    from repro.paper import load_claims

    table = load_claims()
    ids = table[table["paper"] == PAPER]["claim_id"]
    return [claim_id for claim_id in ids if claim_config(claim_id) is not None]


def _value(rows, metric: str, model: str, window: str, stride: str, passes: str) -> tuple[float, str, str] | None:
    """(value, gpu, dense backend) of the newest row of a configuration, or None."""
    needed = {"metric", "value", "model", "window", "stride", "passes"}
    if rows is None or not len(rows) or not needed <= set(rows.columns):
        return None
    sel = rows[(rows["metric"] == metric) & (rows["model"] == model) & (rows["window"] == window)
               & (rows["stride"] == stride) & (rows["passes"] == passes)]
    if sel.empty:
        return None
    gpu = str(sel["gpu"].iloc[-1]) if "gpu" in sel.columns else "unknown GPU"
    dense = str(sel["dense_backend"].iloc[-1]) if "dense_backend" in sel.columns else "dense SDPA"
    return float(sel["value"].iloc[-1]), gpu, dense


#: The tolerance of an end-to-end estimate against the paper's measured speedup (one value for the GNA experiments).
REL = MEASURED_REL


def op_basis(model: str, window: str, stride: str) -> str:
    """The measured forward op speedup of one configuration: every end-to-end estimate made from it (Amdahl at 0,
    9, 15 or 50 self-attention steps; Tables 5-6 and §5 restating cells of Tables 2-4) is this one quantity."""
    return f"gna_speedup_gpu:fwd_op_speedup:{model}:w{window}:s{stride}"


def op_range_that_passes(paper: float, accelerated: float, rel: float = REL) -> tuple[float, float]:
    """The op speedups whose Amdahl estimate falls within ``rel`` of ``paper`` (the upper end inf where even an
    infinitely fast op stays within): how much, or how little, the comparison says about the measured op."""
    def needed(e2e: float) -> float:
        rest = 1.0 / e2e - (1.0 - accelerated)
        return accelerated / rest if rest > 0 else math.inf
    return needed(paper * (1 - rel)), needed(paper * (1 + rel))


def _claim(claim_id: str, rows) -> ClaimCheck:
    from repro.gna.simulator import end_to_end_speedup, flopwise_speedup  # it imports torch

    model, window, stride, sa_steps = claim_config(claim_id)
    total = int(MODELS[model].total_steps)
    share, fraction = attention_share(model), (total - sa_steps) / total
    base = "needs the paper's Blackwell FNA kernel inside the model on a B200"
    fwd = _value(rows, "op_speedup", model, window, stride, "fwd")
    bound = _value(rows, "bound", model, window, stride, "fwd")
    if fwd is None or bound is None:
        return needs_gpu(PAPER, claim_id, f"{base}; run gna_speedup_gpu's {model}_w{window}_s{stride}_fwd point")
    (speedup, gpu, dense), sim = fwd, bound[0]
    estimate = end_to_end_speedup(speedup, share, fraction)
    # The null: the FLOP-wise ratio of the configuration (what a kernel realising its FLOP savings gives), through
    # the same Amdahl: computed from the configuration, not the rows.
    config = CONFIGS[f"{model}_w{window}_s{stride}"]
    flop = flopwise_speedup(config.grid, config.spec)
    null = Null("FLOP-wise ratio", end_to_end_speedup(flop, share, fraction))
    low, high = op_range_that_passes(float(paper_value(PAPER, claim_id)), share * fraction)
    note = (f"{gpu}, compiled FlexAttention vs {dense} (the fastest dense SDPA backend probed), bf16, op with token "
            f"permutation: forward {speedup:.2f}x (simulator bound {sim:.2f}x, {speedup / sim:.0%} of it)")
    both = _value(rows, "op_speedup", model, window, stride, "fwd+bwd")
    if both is not None:
        note += f", fwd+bwd {both[0]:.2f}x" + (f" (vs {both[2]})" if both[2] != dense else "")
    note += (f"; Amdahl with Table 1's attention share at {total - sa_steps}/{total} GNA steps: {estimate:.3f}x "
             f"end to end (simulator's: {end_to_end_speedup(sim, share, fraction):.3f}x, FLOP-wise "
             f"{flop:.2f}x: {null.value:.3f}x); "
             + (f"any op speedup above {low:.2f}x" if math.isinf(high) else f"any op speedup from {low:.2f}x to "
                f"{high:.2f}x") + f" passes ±{REL:.0%} (op speedup -> infinity: {1 / (1 - share * fraction):.3f}x)")
    return compare(PAPER, claim_id, estimate, gpu=gpu, kind=ESTIMATE, rel=REL, null=null,
                   note=note + "; an estimate: Flex, not the paper's FNA kernel, and Amdahl, not a model run",
                   evidence=evidence_from(table1_shares(model), speedup, otherwise="predicted"),
                   basis=op_basis(model, window, stride))


def claims(rows) -> list[ClaimCheck]:
    """One check per mapped claim (see the module docstring); robust to absent or empty rows."""
    return [_claim(claim_id, rows) for claim_id in mapped_claim_ids()]


# ---- points ---------------------------------------------------------------------------------------------------------


#: §5's FLUX 4K and HunyuanVideo configurations: the paper scale measures these first (see the module docstring).
FIRST_CONFIGS = ("flux1dev_4k_w80x80_s16x16", "hunyuanvideo_w18x24x24_s16x8x8")


def _paper_point(config: GpuConfig, backward: bool) -> Point:
    return Point(f"{config.name}_{'fwd_bwd' if backward else 'fwd'}",
                 {"config": config.name, "backward": backward, "dtype": "bfloat16", "warmup": 3, "iters": 10,
                  "time_cap_s": 60.0, "check_queries": 256, "dense_probe_iters": 3, "dense_probe_cap_s": 15.0},
                 needs_gpu=True, memory_gib=16.0,
                 resources=Resources(nodes=1, gpus_per_node=1, cpus_per_task=8, mem_gib=64, time_min=30))


def _smoke_point(config: GpuConfig) -> Point:
    return Point(f"{config.name}_fwd",
                 {"config": config.name, "backward": False, "dtype": "float32", "warmup": 1, "iters": 1,
                  "time_cap_s": 20.0, "check_queries": 1 << 20, "threads": 2, "dense_probe_iters": 3,
                  "dense_probe_cap_s": 5.0},
                 memory_gib=1.0, resources=Resources(nodes=1, gpus_per_node=0, cpus_per_task=2, mem_gib=2, time_min=10))


def _paper_points() -> tuple[Point, ...]:
    """Forward before forward + backward, :data:`FIRST_CONFIGS` before the others (see the module docstring)."""
    first = [PAPER_CONFIGS[name] for name in FIRST_CONFIGS]
    rest = [config for name, config in PAPER_CONFIGS.items() if name not in FIRST_CONFIGS]
    return tuple(_paper_point(config, backward) for group in (first, rest) for backward in (False, True)
                 for config in group)


EXPERIMENT = Experiment(
    name="gna_speedup_gpu",
    paper=PAPER,
    title="GNA on a GPU: compiled FlexAttention vs dense flash attention at the paper's shapes, vs the tile bound",
    points={
        "smoke": tuple(_smoke_point(c) for c in SMOKE_CONFIGS.values()),
        "paper": _paper_points(),
    },
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"smoke": 60.0, "paper": 3600.0},
    metrics=METRICS,
)
