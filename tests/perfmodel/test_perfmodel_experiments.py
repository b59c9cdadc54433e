"""The analytic experiments run their ci point in well under a second and map rows onto claim ids."""

import collections

import pandas as pd
import pytest

from repro.experiments.base import RunContext
from repro.harness.runner import run_rank

from repro.experiments import (
    megatron_weak_scaling, mtnlg_layout, parameter_counts, zero_infinity_model, zero_memory_tables,
)

#: (module, claims allowed to differ or be inconsistent: the model's documented misses)
EXPERIMENTS = [
    # Fig. 5's 128-GPU bar and Table 2's 2.5B epoch are one configuration the model misses; Table 8 at 4 and 8 GPUs
    (megatron_weak_scaling, {"fig5_eff_mpdp_128gpu", "t2_2p5B_days_per_epoch", "t8_strong_4gpu", "t8_strong_8gpu"}),
    # the paper's activation numbers that its own formulas do not give (see zero_memory_tables.RESIDUAL_NOTES);
    # Table 2's MP cells, which the paper computes from its MP-1 value rounded to 0.1 B (exact values differ at 0.1 B);
    # six Table 1 cells from 100 GB that the paper truncates; sec 5.4's 7.5B for the exact 7.64B; the 3000x and the
    # 140 days the paper rounds before multiplying (at the one printed-precision rule)
    (zero_memory_tables, {"act_1p5B_ckpt", "act_100B_ckpt", "act_ckpt_100B_mp16", "act_ckpt_100B_mp16_pa",
                          "t2_mp2_theo_Pos", "t2_mp4_theo_Pos", "t2_mp4_theo_Posg", "t2_mp8_theo_Pos",
                          "t2_mp8_theo_Posg", "t2_mp16_theo_Pos", "t2_mp16_theo_Posg", "t1_128B_Posg_nd1024",
                          "t1_1T_Pos_nd256", "t1_1T_Pos_nd1024", "t1_1T_Posg_nd64", "t1_1T_Posg_nd256",
                          "t1_1T_Posg_nd1024", "max_model_nd64_Pos", "trillion_compute_ratio", "trillion_train_days"}),
    (mtnlg_layout, set()),
    # 16 TB over 32 GB V100s is 503 against the abstract's 800, which counts more than model states by an accounting
    # the sources do not state: not decidable, not a disagreement
    (zero_infinity_model, set()),
    (parameter_counts, set()),
]


@pytest.mark.parametrize("module,allowed", EXPERIMENTS, ids=lambda v: getattr(v, "__name__", "")[-24:])
def test_experiment_rows_and_claims(module, allowed, tmp_path):
    experiment = module.EXPERIMENT
    ctx = RunContext(scale="ci", rank=0, world_size=1, device="cpu", scratch_dir=tmp_path)
    rows = [row for point in experiment.points_for("ci") for row in run_rank(experiment, point, ctx)]  # validated
    assert rows and all({"metric", "value", "unit"} <= set(row) for row in rows)
    checks = experiment.claims(pd.DataFrame(rows))
    verdicts = collections.Counter(check.verdict for check in checks)
    assert verdicts["reproduced"] + verdicts["consistent"] > 0  # the paper's own arithmetic agrees as "consistent"
    differs = {check.claim_id for check in checks if check.verdict in ("differs", "inconsistent")}
    assert differs == allowed
    assert experiment.claims(pd.DataFrame()) == [] or all(c.verdict != "reproduced"
                                                          for c in experiment.claims(pd.DataFrame()))


def test_cpu_weak_scaling_points_measure_and_predict(tmp_path):
    """Both ci points run (tp 2 on two gloo ranks) and report a measured step next to a prediction that never used
    the measured model's own steps. How close the two are is a timing, checked in the claims report and bench,
    not here: this only bounds it loosely enough to catch a broken model (a factor of 2)."""
    from repro.experiments import megatron_weak_scaling_cpu as cpu
    from repro.harness.runner import execute_point

    experiment = cpu.EXPERIMENT
    for point in experiment.points_for("ci"):
        rows = {row["metric"]: row for row in execute_point(experiment, point, "ci", device="cpu",
                                                             scratch_dir=tmp_path, timeout_s=300)}
        assert {"step_time_s", "predicted_step_time_s", "prediction_error", "fitted_layer_overhead_ms"} <= set(rows)
        measured, predicted = rows["step_time_s"]["value"], rows["predicted_step_time_s"]["value"]
        assert measured > 0 and 0.5 < predicted / measured < 2.0, rows
        assert rows["prediction_error"]["value"] == pytest.approx(predicted / measured - 1)
        if point.world_size > 1:
            assert rows["calibrated_allreduce_latency_us"]["value"] > 0
            assert rows["tp_allreduces_per_layer"]["value"] == 4  # Megatron-LM sec 3: 2 forward + 2 backward
            (check,) = experiment.claims(pd.DataFrame(list(rows.values())))
            # the design's count: conformance, shown and tested, never counted as a reproduction
            assert (check.claim_id, check.verdict, check.evidence) == ("comm_allreduce_per_layer", "conforms",
                                                                        "conformance")


def test_cpu_weak_scaling_sweeps_are_valid_tensor_parallel_models():
    from repro.experiments import megatron_weak_scaling_cpu as cpu

    for sweep in (cpu.CI_SWEEP, cpu.PAPER_SWEEP):
        for tp in sweep:
            for config in (cpu.sweep_config(tp, sweep), *cpu.calibration_configs(tp, sweep)):
                config.check_tensor_parallel(tp)  # raises if the heads do not split across tp ranks
                assert config.num_attention_heads % tp == 0
