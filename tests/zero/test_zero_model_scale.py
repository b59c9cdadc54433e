"""zero_infinity_model_scale (issue 15): the estimate picks sizes that fit, the ci scale runs in seconds, NVMe trains
a model the memory tier cannot on the same budgets, and the loss falls."""

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from repro.harness.runner import execute_point
from repro.experiments.zero_infinity_model_scale import EXPERIMENT, _candidates
from repro.models import GPTModel
from repro.experiments.zero_model_scale import estimate, gpt_params, largest_fitting


def test_param_count_matches_the_model():
    for config in _candidates("ci")[:3]:
        assert gpt_params(config) == sum(p.numel() for p in GPTModel(config).parameters())


def test_estimate_picks_the_largest_that_fits():
    candidates = _candidates("paper")
    rows = largest_fitting(candidates, tier="nvme", memory_budget=20 << 30, disk_budget=70 * 10**9, world_size=2,
                           micro_batch=1, seq_len=32, bucket_numel=50_000_000)
    chosen = [row for row in rows if row["chosen"]]
    assert len(chosen) == 1 and chosen[0]["psi"] >= 4e9 and chosen[0]["disk_bytes"] <= 70e9
    assert all(not row["fits"] for row in rows if row["psi"] > chosen[0]["psi"])
    memory = estimate(candidates[3], tier="memory", world_size=2, micro_batch=1, seq_len=32, bucket_numel=50_000_000)
    assert memory["host_bytes_per_rank"] > 16 * memory["psi"] / 2  # the states themselves, plus working memory


def test_ci_scale_nvme_trains_larger_than_memory(tmp_path):
    rows = []
    for point in EXPERIMENT.points["ci"]:
        rows += execute_point(EXPERIMENT, point, "ci", device="cpu", scratch_dir=Path(tempfile.mkdtemp()))
    frame = pd.DataFrame(rows)
    params = frame[frame.metric == "params"].set_index("tier")["value"]
    assert params["nvme"] > params["memory"]
    # the model NVMe trained is one the memory tier's estimate refuses on the same budget
    candidates = frame[frame.metric == "candidate_host_bytes_per_rank"]
    same = candidates[(candidates.tier == "memory") & (candidates.candidate_params == params["nvme"])]
    assert len(same) == 1 and not bool(same["fits"].iloc[0])
    for tier in ("memory", "nvme"):
        losses = frame[(frame.metric == "loss") & (frame.tier == tier)].sort_values("step")["value"].tolist()
        assert len(losses) == 3 and all(b < a for a, b in zip(losses, losses[1:])), (tier, losses)
    assert (frame[frame.metric == "nvme_read_bytes"]["value"] > 0).all()
    for direction in ("read", "write"):  # bytes over I/O time >= bytes over step time (I/O time <= step time)
        busy = frame[frame.metric == f"nvme_{direction}_busy_gbs"].sort_values("step")["value"].to_numpy()
        stepwise = frame[frame.metric == f"nvme_{direction}_gbs"].sort_values("step")["value"].to_numpy()
        assert len(busy) == 3 and (busy >= stepwise * 0.999).all()
    assert len(frame[frame.metric == "raw_read_gbs"]) == 1 and len(frame[frame.metric == "raw_mixed_write_gbs"]) == 1
    # the regimes split each step's busy time: their seconds add up to the union of read and write busy time
    regime_s = frame[frame.metric == "nvme_regime_s"].groupby("step")["value"].sum().to_numpy()
    read_s = frame[frame.metric == "nvme_read_busy_s"].sort_values("step")["value"].to_numpy()
    write_s = frame[frame.metric == "nvme_write_busy_s"].sort_values("step")["value"].to_numpy()
    assert len(regime_s) == 3 and (regime_s >= np.maximum(read_s, write_s) * 0.999).all()
    assert (regime_s <= (read_s + write_s) * 1.001).all()
    [check] = EXPERIMENT.claims(frame)
    assert check.verdict in ("reproduced", "differs") and check.evidence == "measured"
    assert EXPERIMENT.figure(frame, None, tmp_path)[0].exists()


def test_claim_needs_the_loss_to_fall_at_every_step():
    def frame(losses):
        rows = [{"metric": "model_state_over_memory", "value": 2.5, "tier": "nvme"}]
        rows += [{"metric": "loss", "value": v, "tier": "nvme", "step": i} for i, v in enumerate(losses)]
        return pd.DataFrame(rows)

    assert EXPERIMENT.claims(frame([7.7, 6.3, 6.5]))[0].verdict == "differs"  # last < first, but rose at step 2
    assert EXPERIMENT.claims(frame([7.7, 6.3, float("nan")]))[0].verdict == "differs"
    assert EXPERIMENT.claims(frame([7.7, 7.0, 6.5]))[0].verdict == "reproduced"


def test_io_busy_union():
    from repro.zero.offload.aio import union_seconds

    assert union_seconds([]) == 0.0
    assert union_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == 3.0  # overlapping intervals counted once
    assert union_seconds([(0.0, 4.0), (1.0, 2.0)]) == 4.0
