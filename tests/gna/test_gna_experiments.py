"""The GNA experiment modules follow the contract of repro.experiments.base, and their claims resolve against
paper_claims.csv."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from gna_cases import gna_claims
from repro.experiments import gna_simulator, gna_speedup
from repro.experiments.base import SCALES, Experiment, RunContext
from repro.vocabulary import ClaimCheck
from repro.harness.runner import run_rank


def _run(experiment: Experiment, scale: str, tmp_path: Path) -> pd.DataFrame:
    ctx = RunContext(scale=scale, rank=0, world_size=1, device="cpu", scratch_dir=tmp_path)
    rows = [row for point in experiment.points_for(scale) for row in run_rank(experiment, point, ctx)]  # validated
    for row in rows:
        assert {"metric", "value", "unit"} <= set(row)
    return pd.DataFrame(rows)


def test_declarations():
    for experiment in (gna_simulator.EXPERIMENT, gna_speedup.EXPERIMENT):
        assert isinstance(experiment, Experiment) and experiment.paper == "gna_2025"
        assert {"ci", "paper"} <= set(experiment.points) <= set(SCALES)  # CPU experiments: ci and paper


def test_simulator_experiment_claims(tmp_path):
    rows = _run(gna_simulator.EXPERIMENT, "ci", tmp_path)
    checks = gna_simulator.EXPERIMENT.claims(rows)
    known = set(gna_claims())
    assert all(isinstance(c, ClaimCheck) and c.claim_id in known for c in checks)
    verdicts = Counter(c.verdict for c in checks)
    by_id = {c.claim_id: c for c in checks}
    for claim_id in ("fig3_na_limit", "t2_flux1dev_4k_w80x80_s1x1_sa9_sim", "t4_hunyuanvideo_w18x24x24_s2x8x8_sa15_sim",
                     "t5_na91_runtime_ratio"):
        assert by_id[claim_id].verdict == "reproduced", by_id[claim_id]
    # block-sparse settings: the simulation equals the FLOP-wise ratio, its null: simulated, agrees, not decisive
    for claim_id in ("fig3_blocksparse", "flux_op_speedup", "t2_flux1dev_4k_w80x80_s16x16_sa9_sim",
                     "t4_hunyuanvideo_w18x24x24_s16x8x8_sa15_sim"):
        assert by_id[claim_id].evidence == "simulated", by_id[claim_id]
        assert by_id[claim_id].verdict == "agrees, not decisive", by_id[claim_id]
    # §3.2's condition, where it holds, under dynamic KV tiling: conformance
    assert (by_id["block_sparse_condition"].verdict, by_id["block_sparse_condition"].evidence) == \
        ("conforms", "conformance")
    # FLOP-wise bounds are the paper's arithmetic on its printed configuration (issue 26): consistent, not reproduced
    # at the precision the paper prints (two decimals: results/paper/printed_precision.csv), but Cosmos' 16x32x48
    # cells at 0 initial steps: 1.494 (a 2.29x op speedup) where the paper prints 1.50 (Amdahl of 2.3x)
    flopwise = [c for c in checks if c.claim_id.endswith("_flopwise")]
    assert flopwise and all(c.evidence == "consistency" for c in flopwise)
    cosmos = {f"t3_cosmos7b_w16x32x48_s{s}_sa0_flopwise" for s in ("1x1x1", "1x8x1", "1x1x16", "1x8x16")}
    assert {c.claim_id for c in flopwise if c.verdict != "consistent"} == cosmos
    assert all(by_id[c].verdict == "inconsistent" for c in cosmos)
    # Known differences (see the experiment's module docstring): Table 5's two WSA rows, the three HunyuanVideo cells
    # that exact Amdahl puts 0.01 off (and Table 5's restatement of one), the WSA 58 % runtime ratio, and the two
    # limits the paper computes from its share printed as a whole percent
    differs = sorted(c.claim_id for c in checks if c.verdict in ("differs", "inconsistent"))
    assert differs == sorted(["t5_wsa58_e2e_sim", "t5_wsa91_e2e_sim", "t5_na58_e2e_sim", "t5_wsa58_runtime_ratio",
                              "t4_hunyuanvideo_w30x40x40_s1x1x1_sa0_sim", "t4_hunyuanvideo_w30x40x40_s1x1x1_sa15_sim",
                              "t4_hunyuanvideo_w18x24x24_s1x1x8_sa0_sim", "cosmos_limit", "hunyuan_limit",
                              *cosmos]), differs
    assert verdicts["reproduced"] >= 20 and verdicts["consistent"] >= 100


def test_speedup_experiment_runs_and_maps_gpu_claims(tmp_path):
    point = gna_speedup.EXPERIMENT.points_for("ci")[0]
    ctx = RunContext(scale="ci", rank=0, world_size=1, device="cpu", scratch_dir=tmp_path)
    rows = pd.DataFrame(gna_speedup.EXPERIMENT.run_point(point, ctx))
    assert {"speedup", "bound", "fraction_of_bound"} <= set(rows["metric"])
    assert (rows[rows["metric"] == "bound"]["value"] > 1).all()
    checks = gna_speedup.EXPERIMENT.claims(rows)
    assert checks and all(c.verdict == "needs GPU" for c in checks)
    assert "gna_kernel_fp16_concl" in {c.claim_id for c in checks}  # Tables 2-6 "actual": gna_speedup_gpu
