"""The three ZeRO experiment modules: declarations, and their claim mapping on hand-made rows (the measured runs
themselves are exercised by test_zero_memory_comm.py and the CLI)."""

import pandas as pd
import pytest

from repro.experiments import zero_communication, zero_infinity_offload, zero_memory_measured
from repro.paper import load_claims

MODULES = (zero_memory_measured, zero_communication, zero_infinity_offload)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_declarations_and_empty_rows(module):
    experiment = module.EXPERIMENT
    assert set(experiment.points) == {"ci", "paper"}
    assert all(p.needs_gpu for p in experiment.points["paper"]) and not any(p.needs_gpu for p in experiment.points["ci"])
    known = set(zip(*[load_claims()[c] for c in ("paper", "claim_id")]))
    checks = experiment.claims(pd.DataFrame())
    assert checks and all(c.verdict == "not run" and (c.paper, c.claim_id) in known for c in checks)


def test_communication_claims_on_rows():
    rows = pd.DataFrame([{"metric": "volume_in_psi", "value": v, "stage": s, "nd": 4} for s, v in
                         ((0, 2.0), (1, 2.0), (2, 2.01), (3, 3.3))])
    verdicts = {c.claim_id: c.verdict for c in zero_communication.claims(rows)}
    assert verdicts == {"comm_dp": "reproduced", "comm_posg": "reproduced", "comm_posgp": "differs",
                        "comm_posgp_ratio": "differs"}


def test_memory_claims_on_rows():
    rows = [{"metric": "bytes_per_param", "value": 16.0, "stage": 0, "nd": 1},
            {"metric": "optimizer_bytes_per_param", "value": 12.0, "stage": 1, "nd": 2}]
    rows += [{"metric": "formula_rel_dev", "value": dev, "stage": s, "nd": 2} for s, dev in ((1, 0.001), (2, 0.0), (3, 0.05))]
    rows += [{"metric": "model_state_bytes", "value": v, "stage": s, "nd": 2} for s, v in ((0, 16.0), (3, 8.0))]
    verdicts = {c.claim_id: c.verdict for c in zero_memory_measured.claims(pd.DataFrame(rows))}
    assert verdicts == {"mem_formula": "reproduced", "K_adam": "reproduced", "formula_pos": "reproduced",
                        "formula_posg": "reproduced", "formula_posgp": "differs", "reduction_posgp": "reproduced"}


def test_offload_claims_on_rows():
    rows = pd.DataFrame([{"metric": "model_state_bytes_per_param", "value": 20.0, "placement": "nvme"},
                         {"metric": "mswm_over_hd2", "value": 16.1, "placement": "nvme"}])
    verdicts = {c.claim_id: c.verdict for c in zero_infinity_offload.claims(rows)}
    assert verdicts == {"model_state_bytes": "differs", "mswm_bytes": "reproduced"}
