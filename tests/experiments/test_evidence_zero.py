"""ZeRO and ZeRO-Infinity claim rows take their evidence class from their inputs (issue 26).

The memory tables, ZeRO-R's closed forms, the bandwidth-efficiency rows and the abstract's arithmetic are the papers'
formulas on the papers' printed numbers: ``consistency``, and a value recomputed by hand from paper_claims.csv alone
equals the row's. The 1T model's states (16 B/param on the suite's own 1T configuration) stay ``derived``; the
ledger experiments stay ``measured``. Handing a computation a plain number instead of the paper's makes it derived.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from repro.experiments import zero_infinity_model as zinf
from repro.experiments import zero_memory_tables as ztab
from repro.experiments.base import RunContext
from repro.vocabulary import COUNTED_EVIDENCE
from repro.results import REPO_ROOT

CTX = RunContext(scale="ci", rank=0, world_size=1, device="cpu", scratch_dir=None)


def _rows(module) -> pd.DataFrame:
    return pd.DataFrame([row for point in module.EXPERIMENT.points_for("ci") for row in module.run_point(point, CTX)])


def _checks(module) -> dict:
    return {check.claim_id: check for check in module.claims(_rows(module))}


@pytest.fixture(scope="module")
def paper() -> pd.DataFrame:
    """paper_claims.csv as the paper's numbers, read by hand: claim id -> value, quantity and setting."""
    raw = pd.read_csv(REPO_ROOT / "results" / "paper" / "paper_claims.csv", dtype={"value": str})
    return raw[raw["paper"].isin(["zero_2019", "zero_infinity_2021"])].set_index("claim_id")


def _num(paper: pd.DataFrame, claim_id: str) -> float:
    return float(paper.loc[claim_id, "value"])


def _in_setting(paper: pd.DataFrame, claim_id: str, pattern: str, column: str = "setting") -> float:
    """A number the claim's setting (or value) prints (``'MP=16, 1024 GPUs (Nd=64), 32GB V100'``,
    ``r'Nd=(\\d+)'`` -> 64)."""
    return float(re.search(pattern, str(paper.loc[claim_id, column])).group(1))


def _formula(paper: pd.DataFrame, claim_id: str, **symbols: float) -> float:
    return eval(str(paper.loc[claim_id, "value"]).replace("^", "**"), {"__builtins__": {}}, symbols)  # noqa: S307


@pytest.fixture(scope="module")
def zero() -> dict:
    return _checks(ztab)


@pytest.fixture(scope="module")
def infinity() -> dict:
    return _checks(zinf)


def test_zero_memory_rows_are_the_papers_arithmetic_recomputed_from_the_claims_table(zero, paper):
    k = _num(paper, "K_adam")
    # Table 1 / Fig. 1: sec 5.1's formula at the 7.5B model and N_d = 64 (Fig. 1's restatement keeps the exact value)
    psi = _in_setting(paper, "t1_7.5B_Pos_nd64", r"([\d.]+)B model") * 1e9
    nd = _in_setting(paper, "t1_7.5B_Pos_nd64", r"Nd=(\d+)")
    exact = _formula(paper, "formula_pos", psi=psi, K=k, Nd=nd) / 1e9
    assert zero["fig1_7p5B_nd64_pos"].reproduced_value == pytest.approx(exact, rel=1e-12)
    assert zero["t1_7.5B_Pos_nd64"].reproduced_value == pytest.approx(exact, rel=1e-12)  # unrounded; printed 31.4
    # Table 2: MP x 32 GB over sec 5.1's bytes per parameter at N_d = 64
    setting = dict(mp=r"MP=(\d+)", nd=r"Nd=(\d+)", gb=r"(\d+)GB V100")
    mp, nd, gb = (_in_setting(paper, "t2_mp16_theo_Pos", p) for p in setting.values())
    assert zero["t2_mp16_theo_Pos"].reproduced_value == pytest.approx(
        mp * gb / _formula(paper, "formula_pos", psi=1.0, K=k, Nd=nd), rel=1e-12)
    # sec 3.2: 12 x hidden x batch x seq x layers fp16 activations, GPT-2 1.5B (Table 4's layers and hidden)
    layers = _in_setting(paper, "t4_fig2_1p5B", r"layers=(\d+)", "value")
    hidden = _in_setting(paper, "t4_fig2_1p5B", r"hidden=(\d+)", "value")
    batch = _in_setting(paper, "act_1p5B", r"batch (\d+)")
    coeff = _num(paper, "act_formula_coeff")
    assert zero["act_1p5B"].reproduced_value == pytest.approx(
        coeff * hidden * batch * 1024 * layers * 2 / 1e9, rel=1e-12)  # seq 1K
    # sec 9: 1 trillion / 330 million
    assert zero["trillion_compute_ratio"].reproduced_value == pytest.approx(1e12 / 330e6)
    for claim_id in ("fig1_7p5B_nd64_pos", "t1_7.5B_Pos_nd64", "t2_mp16_theo_Pos", "act_1p5B",
                     "trillion_compute_ratio"):
        assert zero[claim_id].evidence == "consistency", claim_id
    assert zero["t1_7.5B_Pos_nd64"].verdict == "consistent"
    assert zero["t2_mp16_theo_Pos"].verdict == "inconsistent"  # the paper's 121.6 is 16 x its rounded 7.6
    assert "16 x its rounded MP-1 value 7.6" in zero["t2_mp16_theo_Pos"].note
    # Fig. 1's restatement states Table 1's cell: the same basis, so the report counts one of them
    assert zero["fig1_7p5B_nd64_pos"].verdict == "consistent"
    assert zero["fig1_7p5B_nd64_pos"].basis == zero["t1_7.5B_Pos_nd64"].basis != ""


def test_zero_infinity_rows_are_the_papers_arithmetic_recomputed_from_the_claims_table(infinity, paper):
    per_gpu = _num(paper, "pflops_512") * 1e3 / _in_setting(paper, "pflops_512", r"(\d+) NVIDIA")
    assert infinity["tflops_per_gpu_512"].reproduced_value == pytest.approx(per_gpu, rel=1e-12)
    assert infinity["implied_peak"].reproduced_value == pytest.approx(per_gpu / (_num(paper, "pct_peak_512") / 100))
    # Fig. 3c: efficiency ait bw / (ait bw + peak) with ait = 24 hd ci at hd 2K, 2 GB/s, 70 TFLOP/s
    hd = _in_setting(paper, "bw_ckpt_2GBs_derived", r"hd=(\d+)")
    ait = _formula(paper, "ait_ckpt", hd=hd, ci=_in_setting(paper, "bw_ckpt_2GBs_derived", r"ci=(\d+)"))
    efficiency = 100 * _formula(paper, "eff_formula", ait=ait, bw=_num(paper, "bw_ckpt_2GBs") * 1e9,
                                peak_tp=_num(paper, "peak_tp_assumed") * 1e12)
    assert infinity["bw_ckpt_2GBs"].reproduced_value == pytest.approx(efficiency, rel=1e-12)
    # Fig. 3a: the bandwidth at which ait = seq x bsz reaches 50 %: bw = peak / ait
    ait = _formula(paper, "ait_params", seq=1024, bsz=1)
    assert infinity["bw_params_50pct"].reproduced_value == pytest.approx(
        _num(paper, "peak_tp_assumed") * 1e12 / ait / 1e9, rel=1e-12)
    for claim_id in ("tflops_per_gpu_512", "implied_peak", "bw_ckpt_2GBs", "bw_params_50pct", "ait_ckpt"):
        assert (infinity[claim_id].evidence, infinity[claim_id].verdict) == ("consistency", "consistent"), claim_id
    derived = infinity["bw_ckpt_2GBs_derived"]  # the claims table's 58.4 % states what bw_ckpt_2GBs states
    assert (derived.evidence, derived.verdict) == ("consistency", "consistent")
    assert derived.basis == infinity["bw_ckpt_2GBs"].basis != ""


def test_restatements_are_decided_by_the_report_from_their_basis(zero, infinity):
    """Fig. 1, sec 1 and sec 5.4 restate Table 1 / Table 2 cells; the claims table's re-derivations restate
    ZeRO-Infinity's bounds: in the report one row of each basis counts, the others are "same quantity" pointing to
    it, and a disagreement never is (sec 5.4's 7.5B for Table 2's 7.6B is inconsistent on its own)."""
    from repro import claims as C
    from repro.experiments.base import Experiment, Point

    for paper_id, checks in (("zero_2019", zero), ("zero_infinity_2021", infinity)):
        exp = Experiment(name="restated", paper=paper_id, title="t", points={"ci": (Point("a"),)},
                         run_point=lambda p, c: [], claims=lambda r, checks=checks: list(checks.values()))
        collected = C.collect_checks([exp], pd.DataFrame(columns=["experiment", "scale", "point", "run_id", "metric",
                                                                  "value", "unit"]))
        report = C.build_report(collected).set_index("claim_id")
        same = report[report["verdict"] == "same quantity"]
        assert len(same)
        for claim_id, row in same.iterrows():
            owner = report.loc[row["same_as"]]
            assert owner["verdict"] not in ("same quantity", "not run") and owner["basis"] == row["basis"], claim_id
        if paper_id == "zero_2019":
            assert set(same.index) >= {"fig1_7p5B_nd64_pos", "fig1_7p5B_nd64_posg", "fig1_7p5B_nd64_posgp",
                                       "trillion_states", "trillion_per_gpu", "t2_mp1_theo_Posg"}
            # the disagreeing restatement counts, and the agreeing cell points to it (never the other way round)
            assert report.loc["max_model_nd64_Pos", "verdict"] == "inconsistent"
            assert report.loc["t2_mp1_theo_Pos", "same_as"] == "max_model_nd64_Pos"
        else:
            assert {"bw_params_50pct_derived", "bw_ckpt_2GBs_derived", "ckpt_eff_8K_derived"} <= set(same.index)


def test_no_zero_closed_form_is_counted(zero, infinity):
    """Nothing in the memory tables is independent evidence, nor is the 1T model's 16 TB of states: the suite sized
    its model to the paper's 1T, so 16 B x 1T follows by construction (consistency), and so does its V100 count."""
    counted = {c.claim_id for c in zero.values() if c.evidence in COUNTED_EVIDENCE and c.reproduced_value is not None}
    assert counted == set()
    counted = {c.claim_id for c in infinity.values() if c.evidence in COUNTED_EVIDENCE and c.reproduced_value is not None}
    assert counted == set()
    assert (infinity["states_1T_16B"].evidence, infinity["states_1T_16B"].verdict) == ("consistency", "consistent")
    # the V100 count of model states alone is not the abstract's 800, which counts more by an accounting not stated
    v100s = infinity["v100s_for_1T"]
    assert (v100s.evidence, v100s.verdict, v100s.reproduced_value) == ("consistency", "not decidable",
                                                                       pytest.approx(503.3, abs=0.1))
    assert "model states" in v100s.note


@pytest.mark.parametrize("experiment", ["zero_memory_measured", "zero_communication", "zero_infinity_offload"])
def test_ledger_rows_are_conformance(experiment):
    """The committed runs of the ledger experiments (a GPT instantiated and trained, its bytes and collectives
    counted): what any correct implementation of the design must give (sec 5's bytes per stage, sec 7's volumes,
    MSWM: dtype sizes x the largest layer) is conformance, never counted; the bytes per parameter the dtypes fix are
    configuration."""
    from repro.experiments import registry
    from repro.results import load_rows

    rows = load_rows(REPO_ROOT / "results", experiments=[experiment], scale="ci")
    assert len(rows), f"no committed ci rows of {experiment}"
    (exp,) = [e for e in registry() if e.name == experiment]
    valued = [c for c in exp.claims(rows) if c.reproduced_value is not None]
    assert valued and {c.evidence for c in valued if c.claim_id not in DTYPE_ECHOES} == {"conformance"}
    assert {c.verdict for c in valued if c.claim_id not in DTYPE_ECHOES} == {"conforms"}
    # bytes per parameter fixed by the dtypes the run configures: the ledger reads them back, a configuration echo
    assert all(c.evidence == "configuration" and c.verdict == "not counted" for c in valued if c.claim_id in DTYPE_ECHOES)


#: claims whose value is 2 + 2 + 12 (or 3 x 4) bytes per parameter by the configured dtypes
DTYPE_ECHOES = {"mem_formula", "K_adam", "model_state_bytes"}


def test_the_class_follows_the_inputs(monkeypatch):
    """A plain number where the paper's printed one was makes the rows computed from it derived, and only those."""
    monkeypatch.setitem(ztab.MODELS, "7.5B", 7.5e9)  # as if the suite had counted the model itself
    checks = _checks(ztab)
    assert {checks[c].evidence for c in checks if c.startswith("t1_7.5B_")} == {"derived"}
    assert checks["t1_7.5B_Pos_nd64"].verdict == "agrees, not decisive"  # derived, and no null model stated
    assert {checks[c].evidence for c in checks if c.startswith("t1_128B_")} == {"consistency"}
    monkeypatch.setattr(ztab, "_k_adam", lambda: 12.0)  # K no longer the paper's
    checks = _checks(ztab)
    assert checks["t1_128B_Pos_nd64"].evidence == checks["mem_formula"].evidence == "derived"
    assert checks["act_1p5B"].evidence == "consistency"  # does not use K

    monkeypatch.setattr(zinf, "PEAK", 70e12)
    checks = _checks(zinf)
    assert {checks[c].evidence for c in ("bw_params_50pct", "bw_ckpt_2GBs", "ckpt_eff_8K")} == {"derived"}
    assert checks["bw_params_50pct"].verdict == "agrees, not decisive"  # derived, no null stated
    assert checks["tflops_per_gpu_512"].evidence == "consistency"
    monkeypatch.setattr(zinf, "_symbols", lambda claim_id, point: dict(point))  # a formula fed plain numbers
    checks = _checks(zinf)
    assert {checks[c].evidence for c in zinf.FORMULA_CLAIMS} == {"derived"}


def test_rows_written_before_the_evidence_column_are_refused():
    for module, name in ((ztab, "zero_memory_tables"), (zinf, "zero_infinity_model")):
        rows = _rows(module).drop(columns="evidence")
        with pytest.raises(ValueError, match=f"rerun `repro run {name} --scale ci`"):
            module.claims(rows)
