"""The claims zero_gpu's rows decide (ZeRO Table 2, Figs. 2, 3, 4 and 6, sec. 9 and 10; ZeRO-Infinity sec. 8):
the largest-model brackets, decided only on the paper's 32 GB V100, and TFLOP/s, decided only on V100s; measured on
other GPUs they stay "needs GPU" with the value in the note. The points whose rows are read are declared in
:mod:`repro.experiments.zero_gpu`, which imports this module for its ``EXPERIMENT``; the declarations a claim reads
(the ZeRO-100B points, the Fig. 3 points and their batch) are handed to :func:`check_claims` as arguments, so that
the two modules do not import each other.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from repro.verdicts import check_condition, check_value, needs_gpu
from repro.experiments.base import Point
from repro.vocabulary import ClaimCheck, Null

PAPER = "zero_2019"
INFINITY = "zero_infinity_2021"
#: The V100's fp16 tensor-core peak the paper's "over 30 % of peak" refers to (125 TFLOP/s, NVIDIA datasheet).
V100_PEAK_TFLOPS = 125.0


def _summary(rows, point: str, arm: str, metric: str = "largest_trained_params_b"):
    """The newest summary row of ``arm`` in ``point`` (a dict), or None."""
    if rows is None or not len(rows) or "metric" not in rows or "point" not in rows or "arm" not in rows:
        return None
    sel = rows[(rows["metric"] == metric) & (rows["point"] == point) & (rows["arm"] == arm)]
    return None if sel.empty else sel.iloc[-1].to_dict()


def _is_v100_32gb(row: dict) -> bool:
    return "V100" in str(row.get("gpu")) and 30 <= float(row.get("gpu_memory_gib") or 0) <= 33


def _bracket_check(paper: str, claim_id: str, row: dict | None, what: str, paper_gb: float = 32.0,
                   billions_per_unit: float = 1.0) -> ClaimCheck:
    """Largest-model claims: reproduced on the paper's GPU when the paper's size lies between the largest size that
    trained and the next one that did not (both within 5 %: the schedule's sizes are rounded like the paper's); on
    other GPUs "needs GPU", with the measured value and a memory-scaled
    one in the note (scaling by memory alone ignores activations and workspaces: it is not a verdict). The rows are
    in billions of parameters; ``billions_per_unit`` converts to the claim's unit (1000 for trillions)."""
    from repro.paper import paper_value

    if row is None:
        return needs_gpu(paper, claim_id, f"run zero_gpu's {what} point on GPUs")
    value, above = float(row["value"]), row.get("next_params_b")
    above = None if above is None or (isinstance(above, float) and math.isnan(above)) else float(above)
    target = paper_value(paper, claim_id) * billions_per_unit
    span = f"largest trained {value:.2f}B, next size {'%.2fB' % above if above else 'none'} did not train " \
           f"({row.get('next_decision')})"
    if _is_v100_32gb(row):
        # the sizes are discrete: a failed size within 5 % of the paper's counts as the paper's size failing
        ok = value <= target * 1.05 and (above is None or above > target * 1.05)
        return check_condition(paper, claim_id, round(value / billions_per_unit, 3), holds=ok,
                               tolerance="paper size within [largest trained, next size)", evidence="measured",
                               note=f"{span}, on {row.get('gpu')}", null=_states_only_null(row, target),
                               basis=f"zero_gpu:largest:{row.get('point')}:{row.get('arm')}")
    memory = float(row.get("gpu_memory_gib") or 0) or float("nan")
    return needs_gpu(paper, claim_id, f"needs the paper's 32 GB V100; measured on {row.get('gpu')} ({memory:.0f} GiB, "
                     f"{row.get('gpus')} GPU(s)): {span}; x {paper_gb:g}/{memory:.0f} by memory alone = "
                     f"{value * paper_gb / memory:.2f}B (not a verdict)")


def _states_only_null(row: dict, target: float) -> Null:
    """The naive model of a largest-model claim: model states only (ZeRO's closed form at the arm's stage and N_d,
    model parallelism dividing the model), on the GPU's memory; it meets the claim when that capacity is within 5 %
    of the paper's size (in billions, as ``target``)."""
    from repro.perfmodel.zero_memory import max_params

    capacity = max_params(device_bytes=float(row.get("gpu_memory_gib") or 0) * 2**30, stage=int(row["stage"]),
                          dp_size=int(row.get("dp") or 1), mp_size=int(row.get("tp") or 1)) / 1e9
    return Null("model states only (ZeRO's closed form on this GPU's memory)", capacity,
                holds=abs(capacity - target) <= 0.05 * target)


def _throughput_note(paper: str, claim_id: str, row: dict | None, what: str) -> ClaimCheck:
    if row is None:
        return needs_gpu(paper, claim_id, f"run zero_gpu's {what} point on GPUs")
    return needs_gpu(paper, claim_id, f"TFLOP/s is the hardware's: needs the paper's V100s; measured on "
                     f"{row.get('gpu')} x {row.get('gpus')}: {float(row['value']):.1f} TFLOP/s per GPU ({what})")


def _throughput_row(rows, point: str) -> dict | None:
    if rows is None or not len(rows) or "point" not in rows:
        return None
    sel = rows[(rows["metric"] == "tflops_per_gpu") & (rows["point"] == point)]
    return None if sel.empty else sel.iloc[-1].to_dict()


def _zero100b_sustained(rows, zero100b_points: Sequence[str]) -> list[ClaimCheck]:
    """``zero100B_pflops`` = mean over ``zero100b_points`` (:data:`repro.experiments.zero_gpu.ZERO100B_POINTS`) of
    TFLOP/s per GPU x GPUs / 1000 (15 PFLOP/s on 400 V100s); ``zero100B_pct_peak`` = that mean per GPU over
    :data:`V100_PEAK_TFLOPS` (over 30 %). Decided on V100s only; elsewhere the measured values are in the note."""
    found = [r for r in (_throughput_row(rows, p) for p in zero100b_points) if r is not None]
    if len(found) < len(zero100b_points):
        why = f"run zero_gpu's {', '.join(zero100b_points)} points ({len(found)} of {len(zero100b_points)} have rows)"
        return [needs_gpu(PAPER, "zero100B_pflops", why), needs_gpu(PAPER, "zero100B_pct_peak", why)]
    per_gpu = sum(float(r["value"]) for r in found) / len(found)
    pflops = sum(float(r["value"]) * int(r["gpus"]) for r in found) / len(found) / 1000
    gpus = {str(r.get("gpu")) for r in found}
    what = f"mean of 8B-100B on {', '.join(sorted(gpus))}: {per_gpu:.1f} TFLOP/s per GPU, {pflops:.2f} PFLOP/s"
    if all("V100" in g for g in gpus):
        pct = 100 * per_gpu / V100_PEAK_TFLOPS
        return [check_value(PAPER, "zero100B_pflops", pflops, rel=0.10, note=what, evidence="measured"),
                check_condition(PAPER, "zero100B_pct_peak", round(pct, 1), holds=pct >= 30, tolerance=">= 30",
                                evidence="measured", note=f"{what}; over the V100's {V100_PEAK_TFLOPS:g} TFLOP/s")]
    return [needs_gpu(PAPER, "zero100B_pflops", f"needs the paper's V100s; measured {what}"),
            needs_gpu(PAPER, "zero100B_pct_peak", f"needs the paper's V100s; measured {what}")]


def _megatron_baselines(rows) -> list[ClaimCheck]:
    """``megatron_in_node_tflops`` (about 30 TFLOP/s per V100) = ``megatron_in_node_8gpu``'s TFLOP/s per GPU;
    ``megatron_40B_tflops`` (5 TFLOP/s per V100 across two DGX-2 nodes) = ``megatron_40B_32gpu``'s."""
    out = []
    for claim, point, what in (("megatron_in_node_tflops", "megatron_in_node_8gpu", "8.2B, tp 8 inside a node"),
                               ("megatron_40B_tflops", "megatron_40B_32gpu", "40B, tp 32 across nodes")):
        row = _throughput_row(rows, point)
        if row is not None and "V100" in str(row.get("gpu")):
            out.append(check_value(PAPER, claim, float(row["value"]), rel=0.15, evidence="measured",
                                   note=f"{what} on {row.get('gpus')} x {row.get('gpu')}, ZeRO stage 0"))
        else:
            out.append(_throughput_note(PAPER, claim, row, f"{point}, {what}"))
    return out


def _superlinear_configuration(paper_points: Sequence[Point],
                                global_batch: Callable[[Point], int]) -> list[ClaimCheck]:
    """Fig. 3's 60B model, its largest GPU count and largest batch (``global_batch`` of it), as the fig3 points of
    ``paper_points`` declare them (configuration)."""
    fig3 = [p for p in paper_points if p.name.startswith("fig3_")]
    size = fig3[0].params["sizes"][0]
    params_b = 12 * size["layers"] * size["hidden"] ** 2 / 1e9
    largest = max(fig3, key=lambda p: p.world_size)
    return [check_value(PAPER, "superlinear_model", params_b, rel=0.05, evidence="configuration",
                        note=f"12 l h^2 of the fig3 points' {size['name']}"),
            check_value(PAPER, "superlinear_gpus_max", largest.world_size, evidence="configuration",
                        note="the largest fig3 point"),
            check_value(PAPER, "largest_batch_superlinear", global_batch(largest), evidence="configuration",
                        note=f"{largest.name}'s micro-batch x micro-batches x data-parallel degree; the same 32 "
                        "sequences per data-parallel rank at every GPU count (the paper's smaller counts' batches "
                        "are in appendix tables not read)")]


#: ZeRO Fig. 6's configurations (Table 3) and their claims: C3 has no claim of its own (the figure's bar is read).
FIG6_CLAIMS = {"C1": "fig6_c1", "C2": "fig6_c2", "C4": "fig6_c4", "C5": "fig6_c5"}


def check_claims(rows, *, zero100b_points: Sequence[str], paper_points: Sequence[Point],
                 global_batch: Callable[[Point], int]) -> list[ClaimCheck]:
    """The claims these rows decide, with the formula from rows to value (``zero100b_points``, ``paper_points`` and
    ``global_batch``: zero_gpu's declarations, see :func:`repro.experiments.zero_gpu.claims`):

    * ``dp_alone_max`` (1.4B, plain DP on a 32 GB V100) = ``largest_trained_params_b`` of ``offload_1gpu``'s
      ``gpu_only`` arm (ZeRO stage 2 at N_d = 1 holds DP's 16 bytes per parameter on the GPU);
      ``dp_only_tflops`` = that arm's ``largest_tflops_per_gpu``;
    * ``no_mp_max_model`` (13B on 128 GPUs) = ``nomp_128gpu``'s largest; ``no_mp_tflops`` its TFLOP/s;
    * ``t2_mp1_meas_baseline`` / ``t2_mp1_meas_Pos`` (1.3B / 6.2B at N_d = 64) = ``max_model_64gpu``'s stage-0 /
      stage-1 largest;
    * ``zero100B_100B_tflops_gpu`` (38 TFLOP/s at 100B on 400 GPUs) = ``fig2_l125_h8192_400gpu``'s TFLOP/s,
      ``zero100B_max_model`` (170B) = whether ``fig2_l212_h8192_400gpu`` trained;
    * ZeRO-Infinity ``finetune_1T_one_dgx2`` = ``offload_1node``'s NVMe arm;
    * ``zero100B_pflops`` / ``zero100B_pct_peak``, ``megatron_in_node_tflops`` / ``megatron_40B_tflops``: see
      :func:`_zero100b_sustained` and :func:`_megatron_baselines`; Fig. 3's model, GPU count and largest batch
      are configuration;
    * ``fig6_c1`` ... ``fig6_c5`` = ``fig6_400gpu``'s largest per arm (C1 ... C5, see :data:`FIG6_CLAIMS`);
      ``megatron_max_efficient`` (16-20B on one DGX-2) = ``megatron_max_16gpu``'s stage-0 largest; ZeRO-Infinity's
      ``32T_512gpu`` = ``offload_32node``'s NVMe arm, in trillions.

    Sizes are decided only on the paper's 32 GB V100 (the paper's size must lie in the bracket the search found);
    TFLOP/s only on V100s; everything measured on other GPUs stays "needs GPU" with the measured value in the note.
    ZeRO-Offload's own claims (13B on one V100, 10x PyTorch) are not in paper_claims.csv; ``offload_1gpu`` reports
    them as ``largest_trained_params_b`` of ``zero2_cpu`` and ``offload_gain_x``.
    """
    checks = [
        _bracket_check(PAPER, "dp_alone_max", _summary(rows, "offload_1gpu", "gpu_only"), "offload_1gpu"),
        _throughput_note(PAPER, "dp_only_tflops", _summary(rows, "offload_1gpu", "gpu_only", "largest_tflops_per_gpu"),
                         "offload_1gpu, gpu_only arm, its largest model on 1 GPU"),
        _bracket_check(PAPER, "no_mp_max_model", _summary(rows, "nomp_128gpu", "zero2"), "nomp_128gpu"),
        _throughput_note(PAPER, "no_mp_tflops", _summary(rows, "nomp_128gpu", "zero2", "largest_tflops_per_gpu"),
                         "nomp_128gpu, its largest model"),
        _bracket_check(PAPER, "t2_mp1_meas_baseline", _summary(rows, "max_model_64gpu", "stage0"), "max_model_64gpu"),
        _bracket_check(PAPER, "t2_mp1_meas_Pos", _summary(rows, "max_model_64gpu", "stage1"), "max_model_64gpu"),
        _throughput_note(PAPER, "zero100B_100B_tflops_gpu", _throughput_row(rows, "fig2_l125_h8192_400gpu"),
                         "fig2_l125_h8192_400gpu, 100B on 400 GPUs"),
    ]
    checks += _zero100b_sustained(rows, zero100b_points) + _megatron_baselines(rows)
    checks += _superlinear_configuration(paper_points, global_batch)
    checks += [_bracket_check(PAPER, claim, _summary(rows, "fig6_400gpu", arm), f"fig6_400gpu ({arm})")
               for arm, claim in FIG6_CLAIMS.items()]
    checks.append(_bracket_check(PAPER, "megatron_max_efficient", _summary(rows, "megatron_max_16gpu", "stage0"),
                                 "megatron_max_16gpu"))
    checks.append(_bracket_check(INFINITY, "32T_512gpu", _summary(rows, "offload_32node", "zero3_nvme"),
                                 "offload_32node", billions_per_unit=1000.0))
    trained_170 = _throughput_row(rows, "fig2_l212_h8192_400gpu")
    checks.append(needs_gpu(PAPER, "zero100B_max_model", "run zero_gpu's fig2_l212_h8192_400gpu point" if trained_170
                            is None else f"170B trained on {trained_170.get('gpus')} x {trained_170.get('gpu')}; "
                            "the claim is about 400 V100s"))
    nvme = _summary(rows, "offload_1node", "zero3_nvme")
    checks.append(needs_gpu(INFINITY, "finetune_1T_one_dgx2", "run zero_gpu's offload_1node point" if nvme is None
                            else f"largest trained with NVMe offload on one node of {nvme.get('gpu')}: "
                            f"{float(nvme['value']):.1f}B (the claim: 1T on one DGX-2)"))
    return checks
