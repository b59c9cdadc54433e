"""Tiny experiments that only the spine's tests use (loaded through REPRO_EXTRA_EXPERIMENTS, never shipped).

``fake_sum`` computes real numbers: rank 0's sum of 1..n, and at world size 2 an all-reduce of each rank's
(rank + 1), so a wrong rank layout or a missing process group changes the rows. ``fake_fail`` raises,
``fake_gpu`` needs a GPU, and ``fake_huge`` declares more memory than any test machine has.
"""

from __future__ import annotations

import os

from repro.verdicts import check_value, needs_gpu
from repro.experiments.base import Experiment, Point, RunContext
from repro.vocabulary import ClaimCheck, Null


def _sum_point(point: Point, ctx: RunContext) -> list[dict]:
    import torch  # here, not at the top: the Slurm and CLI tests that only plan or refuse load this file without torch
    import torch.distributed as dist

    n = int(point.params["n"])
    rows = [{"metric": "triangle", "value": float(torch.arange(1, n + 1).sum()), "unit": "count", "n": n}]
    if ctx.world_size > 1:
        mine = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(mine)
        rows.append({"metric": "rank_sum", "value": float(mine.item()), "unit": "count", "n": n})
    marker = os.environ.get("REPRO_FAKE_MARKER")
    if marker:
        # a row's value is a number (results.read_run refuses text): the marker's length, the marker its own column
        rows.append({"metric": "marker", "value": float(len(marker)), "unit": "characters", "n": n, "text": marker})
    return rows


def _value(rows, metric: str, n: int) -> float | None:
    hit = rows[(rows["metric"] == metric) & (rows["n"] == n)] if len(rows) else rows
    return float(hit["value"].iloc[0]) if len(hit) else None


def _sum_claims(rows) -> list[ClaimCheck]:
    """Maps fake numbers onto real claim ids, so the claims report has something to join: the all-reduce of
    ranks 1 + 2 = 3 against ZeRO's "3 GB of fp16 weights" (reproduced), the triangle number of 3 (6) against
    K = 12 (differs), and a GPU-only claim."""
    no_collective = Null("no all-reduce (rank 0 alone)", 1.0)
    return [
        check_value("zero_2019", "gpt2_1p5B_fp16_weights", _value(rows, "rank_sum", 4), note="fake",
                    evidence="measured", null=no_collective),
        check_value("zero_2019", "K_adam", _value(rows, "triangle", 3), rel=0.1, note="fake", evidence="measured",
                    null=no_collective),
        needs_gpu("megatron_lm_2019", "baseline_tflops_1gpu", note="fake"),
    ]


def _sum_figure(rows, paper_claims, out_dir):
    """An experiment's own figure: a text file standing in for a plot (the hook's contract, not a plot)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fake_sum_own.txt"
    path.write_text(f"{len(rows)} rows, {len(paper_claims)} paper claims\n")
    return [path]


def _fail_point(point: Point, ctx: RunContext) -> list[dict]:
    raise RuntimeError(f"fake failure in point {point.name}")


def _gpu_point(point: Point, ctx: RunContext) -> list[dict]:
    return [{"metric": "device_is_cuda", "value": float(ctx.device == "cuda"), "unit": "bool"}]


EXPERIMENTS = (
    Experiment(
        name="fake_sum",
        paper="megatron_lm_2019",
        title="Fake: triangle numbers and an all-reduce",
        points={
            "ci": (Point("n3", {"n": 3}), Point("n4_ws2", {"n": 4}, world_size=2)),
            "paper": (Point("n100", {"n": 100}), Point("n200_ws2", {"n": 200}, world_size=2)),
        },
        run_point=_sum_point,
        claims=_sum_claims,
        figure=_sum_figure,
        budget_s={"ci": 60.0},
        metrics=("triangle", "rank_sum", "marker"),
    ),
    Experiment(
        name="fake_fail",
        paper="zero_2019",
        title="Fake: a point that raises",
        points={"ci": (Point("boom", {}),), "paper": (Point("boom", {}),)},
        run_point=_fail_point,
    ),
    Experiment(
        name="fake_gpu",
        paper="gna_2025",
        title="Fake: a point that needs a GPU",
        points={"ci": (Point("cuda", {}, needs_gpu=True),), "paper": (Point("cuda", {}, needs_gpu=True),)},
        run_point=_gpu_point,
    ),
    Experiment(
        name="fake_huge",
        paper="zero_2019",
        title="Fake: a paper scale no machine here can hold",
        points={"ci": (Point("small", {"n": 2}),), "paper": (Point("huge", {"n": 2}, memory_gib=1e6),)},
        run_point=_sum_point,
    ),
)
