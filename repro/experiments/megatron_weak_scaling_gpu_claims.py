"""The claims ``megatron_weak_scaling_gpu``'s rows decide (Megatron-LM sec. 5.1.1, Fig. 5, Tables 2 and 8), each
beside its null model, by the cross-hardware rule (:mod:`repro.cross_hardware`): TFLOP/s, days and PFLOP/s are
absolute (compared on V100s only; measured on another GPU the value is shown with both GPUs named, not compared);
the share of peak and the efficiencies and speed-ups (ratios of runs on one GPU model) are compared on any GPU,
counted apart off a V100. The points are declared in :mod:`repro.experiments.megatron_weak_scaling_gpu`, which
imports this module for its ``EXPERIMENT``.

Nulls, computed here from the same rows:

* the 1-GPU baseline (TFLOP/s and share of peak): the plain single-GPU GPT compiled whole
  (:func:`repro.training.parallelize.build_plain_gpt`), measured in the same run where there is one: what a user gets without the suite;
* a Fig. 5 bar: perfect weak scaling (100 %); Table 8's speed-up on ``g`` GPUs: perfect strong scaling (``g``);
* Table 2's days per epoch and the 512-GPU PFLOP/s: perfect scaling at the measured 1-GPU TFLOP/s.

FLOP convention: model FLOPs by the paper's formula, ``96 B s l h^2 (1 + s/6h + V/16lh)`` per iteration, which
credits the forward pass that activation checkpointing recomputes (the runs checkpoint every layer, as the paper's
did); the baseline's note also gives the share without that credit (``72 B s l h^2 (1 + s/6h) + 6 B s h V``, the
FLOPs the model itself needs) from the same run's tokens/s.
"""

from __future__ import annotations

import math

from repro.cross_hardware import ABSOLUTE, NORMALISED, compare, hardware_label
from repro.perfmodel.flops import gpt_flops_per_iteration
from repro.perfmodel.megatron import PADDED_VOCAB, SECONDS_PER_DAY, SEQ_LENGTH, TABLE1, TABLE2
from repro.verdicts import check_value, needs_gpu
from repro.results import last_row
from repro.vocabulary import ClaimCheck, Null

PAPER = "megatron_lm_2019"
#: Table 1's models on 1/2/4/8-way model parallelism (the Fig. 5 bars; x 64-way data parallelism for MP+DP).
MP_CONFIGS = [("1p2B", 1), ("2p5B", 2), ("4p2B", 4), ("8p3B", 8)]
#: Table 2 counts an epoch as 68,507 iterations of 512 x 1024 tokens (its setting, used as given).
ITERATIONS_PER_EPOCH = 68_507
#: Settings the suite was given: the baseline over itself.
BY_DEFINITION = {"fig5_eff_mp_1gpu": (100.0, "100 % by definition (the 1-GPU point over itself)"),
                 "t8_strong_1gpu": (1.0, "1.0 by definition (the 1-GPU iteration over itself)")}
_BASELINE = "megatron_weak_scaling_gpu:tflops:1p2B:1gpu:checkpointing"


def _value(rows, metric: str, **where):
    row = last_row(rows, metric, **where)
    return None if row is None else float(row["value"])


def _gpu(rows) -> str | None:
    """The GPU the rows were measured on (the newest row's ``gpu``), or None."""
    if rows is None or not len(rows) or "gpu" not in rows:
        return None
    names = rows["gpu"].dropna()
    return str(names.iloc[-1]) if len(names) else None


def _flops_per_token(config, *, recompute: bool) -> float:
    """Model FLOPs per token of one training iteration of ``config`` (a Table 1 or 2 row) at sequence 1024."""
    return gpt_flops_per_iteration(batch_size=1, seq_length=SEQ_LENGTH, num_layers=config.num_layers,
                                   hidden_size=config.hidden_size, vocab_size=PADDED_VOCAB,
                                   activation_recompute=recompute) / SEQ_LENGTH


def _baseline_rows(rows, variant: str):
    """The 1.2B model's checkpointed 1-GPU rows of ``variant``, newest run first (empty without)."""
    if rows is None or not len(rows) or not {"metric", "variant", "model", "gpus"} <= set(rows):
        return None
    sel = rows[(rows["model"] == "1p2B") & (rows["gpus"] == 1) & (rows["variant"] == variant)]
    if "checkpointing" in sel:
        sel = sel[sel["checkpointing"] == True]  # noqa: E712 - a column of booleans
    return sel


def plain_null(rows, metric: str) -> tuple[Null | None, str]:
    """The plain GPT compiled whole as the null of the 1-GPU baseline's ``metric``: from the run that measured the
    suite's baseline too where there is one, else from another run on the same GPU model (said so); (None, "")
    without a plain measurement."""
    ours, plain = _baseline_rows(rows, "repro"), _baseline_rows(rows, "plain_compiled")
    if ours is None or plain is None:
        return None, ""
    ours, plain = ours[ours["metric"] == metric], plain[plain["metric"] == metric]
    if not len(plain) or not len(ours):
        return None, ""
    same = plain[plain["run_id"].isin(set(ours["run_id"]))] if "run_id" in plain else plain.iloc[0:0]
    pick, where = (same, "the same run") if len(same) else (plain, "another run on the same GPU model")
    if not len(same) and "gpu" in plain and plain["gpu"].iloc[-1] != ours["gpu"].iloc[-1]:
        return None, ""
    return (Null(f"the plain single-GPU GPT compiled whole ({where})", float(pick["value"].iloc[-1])),
            str(pick["run_id"].iloc[-1]) if "run_id" in pick else "")


def plain_comparison(rows) -> str:
    """``; x.xx the tokens/s of the plain GPT compiled whole (...)``: repro's 1-GPU 1.2B tokens/s (compiled layers,
    checkpointing) over the plain GPT's, from one run (the ``1p2B_1gpu`` and ``1p2B_1gpu_plain`` points of one
    session, or one point measuring both) where there is one; else from two runs on the same GPU model, said so;
    empty without both."""
    if rows is None or not len(rows) or not {"metric", "variant", "run_id", "model", "gpus"} <= set(rows):
        return ""
    sel = rows[(rows["metric"] == "tokens_per_s") & (rows["model"] == "1p2B") & (rows["gpus"] == 1)]
    if "checkpointing" in sel:
        sel = sel[sel["checkpointing"] == True]  # noqa: E712 - a column of booleans
    for run_id in sorted(set(sel["run_id"]), reverse=True):
        last = sel[sel["run_id"] == run_id].groupby("variant").last()
        if {"repro", "plain_compiled"} <= set(last.index):
            mine = last["value"]
            ratio = mine["repro"] / mine["plain_compiled"]
            return (f"; {ratio:.2f}x the tokens/s of the plain GPT compiled whole in the same run ({run_id}: "
                    f"{_spread(last, 'repro')} vs {_spread(last, 'plain_compiled')} tokens/s; the goal is at least "
                    "1.0x)")
    ours, plain = sel[sel["variant"] == "repro"], sel[sel["variant"] == "plain_compiled"]
    if len(ours) and len(plain) and "gpu" in sel and ours["gpu"].iloc[-1] == plain["gpu"].iloc[-1]:
        ratio = ours["value"].iloc[-1] / plain["value"].iloc[-1]
        return (f"; {ratio:.2f}x the tokens/s of the plain GPT compiled whole, from two sessions on {ours['gpu'].iloc[-1]}"
                f" (runs {ours['run_id'].iloc[-1]} and {plain['run_id'].iloc[-1]}: {ours['value'].iloc[-1]:.0f} vs "
                f"{plain['value'].iloc[-1]:.0f} tokens/s; no session measured both; the goal is at least 1.0x)")
    return ""


def _spread(last, variant: str) -> str:
    """A variant's tokens/s as its row gives it: the median of alternated repetitions with their range and count
    (``31234 [30900, 31500] over 3``), or the one value of a run measured without alternation."""
    row = last.loc[variant]
    low, high, reps = (row.get(k) for k in ("value_min", "value_max", "repetitions"))
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high, reps)):
        return f"{row['value']:.0f}"
    return f"{row['value']:.0f} [{low:.0f}, {high:.0f}] over {int(reps)}"


def flop_conventions(rows) -> str:
    """The FLOP convention the share of peak is decided on, and the same run's share without crediting the
    recomputed forward pass (from its tokens/s), and that of the run without checkpointing where there is one."""
    text = ("decided on the paper's FLOP convention, 96 B s l h^2 (1 + s/6h + V/16lh) per iteration, which credits "
            "the forward pass activation checkpointing recomputes (this run checkpoints every layer, as the paper's)")
    ours = _baseline_rows(rows, "repro")
    if ours is None or not len(ours):
        return text
    tokens, peak = ours[ours["metric"] == "tokens_per_s"], ours["peak_tflops"].dropna() if "peak_tflops" in ours else []
    if len(tokens) and len(peak):
        executed = float(tokens["value"].iloc[-1]) * _flops_per_token(TABLE1[0], recompute=False)
        text += (f"; without that credit (72 B s l h^2 (1 + s/6h) + 6 B s h V, the FLOPs the model itself needs) "
                 f"the same run is {100 * executed / (float(peak.iloc[-1]) * 1e12):.1f} %")
    no_ckpt = _value(rows, "share_of_peak", model="1p2B", gpus=1, variant="repro", checkpointing=False)
    if no_ckpt is not None:
        text += f"; the run without checkpointing (1p2B_1gpu_no_ckpt, 72-formula) reaches {no_ckpt:.1f} %"
    return text


def _other_gpu(gpu: str | None, plain: Null | None) -> str:
    """Why a share of peak measured on another GPU than the paper's V100 may differ from its 30 %."""
    if plain is None or not hardware_label(PAPER, gpu):
        return ""
    return (f"; the plain GPT reaches {plain.value:.1f} % on the same {gpu}: a share of peak belongs to the GPU as much "
            "as to the code, and this GPU is not the paper's V100")


def claims(rows) -> list[ClaimCheck]:
    """The 1-GPU baseline (sec. 5.1.1: 39 TFLOP/s, 30 % of a V100's peak), Fig. 5's efficiencies, Table 8's strong
    scaling, Table 2's days per epoch and the 512-GPU PFLOP/s, each with its null (module docstring)."""
    gpu = _gpu(rows)
    setup = "the 1.2B model on 1 GPU, bf16 autocast, activation checkpointing per layer"
    tflops = _value(rows, "model_tflops_per_gpu", model="1p2B", gpus=1, variant="repro", checkpointing=True)
    share = _value(rows, "share_of_peak", model="1p2B", gpus=1, variant="repro", checkpointing=True)
    run = "run megatron_weak_scaling_gpu's 1p2B_1gpu point"
    tflops_null, _ = plain_null(rows, "model_tflops_per_gpu")
    share_null, _ = plain_null(rows, "share_of_peak")
    checks = [
        compare(PAPER, "baseline_tflops_1gpu", tflops, gpu=gpu, kind=ABSOLUTE, rel=0.10, unit=" TFLOP/s",
                note=f"{setup}; model FLOPs by the 96-formula" if tflops is not None else run, null=tflops_null,
                basis=_BASELINE),
        compare(PAPER, "baseline_pct_peak", share, gpu=gpu, kind=NORMALISED, abs=5, null=share_null, basis=_BASELINE,
                note=(f"{share:.1f} % of the {gpu}'s datasheet bf16 peak ({setup}); {flop_conventions(rows)}"
                      + plain_comparison(rows) + _other_gpu(gpu, share_null)) if share is not None else run),
    ]
    for claim, (value, why) in BY_DEFINITION.items():
        checks.append(check_value(PAPER, claim, value, evidence="configuration", note=why))
    for label, mp in MP_CONFIGS:
        for dp, claim in ((1, f"fig5_eff_mp_{mp}gpu"), (64, f"fig5_eff_mpdp_{64 * mp}gpu")):
            if claim in BY_DEFINITION:
                continue
            value = _value(rows, "model_tflops_per_gpu", model=label, tp=mp, dp=dp, variant="repro")
            if value is None or tflops is None:
                checks.append(needs_gpu(PAPER, claim, f"run megatron_weak_scaling_gpu's {label}_{mp * dp}gpu point "
                                                      "and the 1p2B_1gpu point"))
                continue
            checks.append(compare(PAPER, claim, 100 * value / tflops, gpu=gpu, kind=NORMALISED, abs=5,
                                  null=Null("perfect weak scaling", 100.0),
                                  basis=f"megatron_weak_scaling_gpu:tflops:{label}:{mp * dp}gpu",
                                  note=f"per-GPU TFLOP/s of {label} on {mp * dp} {gpu} over the 1-GPU 1.2B point"))
    return checks + _strong_scaling(rows, gpu) + _days_per_epoch(rows, gpu, tflops) + _aggregate(rows, gpu, tflops)


def _strong_scaling(rows, gpu) -> list[ClaimCheck]:
    """Table 8: speedup = iteration time of the 1-GPU point / that of the 1.2B model on g GPUs (batch 8): a ratio of
    two runs on one GPU model."""
    checks = []
    base = _value(rows, "iteration_s", model="1p2B", gpus=1, variant="repro", checkpointing=True)
    for tp in (2, 4, 8):
        time = _value(rows, "iteration_s", model="1p2B", tp=tp, dp=1, variant="repro")
        what = f"1p2B_1gpu and 1p2B_{tp}gpu_strong: 1-GPU iteration time / {tp}-GPU"
        speedup = base / time if base is not None and time is not None else None
        checks.append(compare(PAPER, f"t8_strong_{tp}gpu", speedup, gpu=gpu, kind=NORMALISED, rel=0.10,
                              null=Null("perfect (linear) strong scaling", float(tp)),
                              basis=f"megatron_weak_scaling_gpu:iteration:1p2B:{tp}gpu_strong",
                              note=what if speedup is not None else f"run megatron_weak_scaling_gpu's {what}"))
    return checks


def _perfect_days(run, base_tflops: float | None) -> Null | None:
    """An epoch of ``run`` at the measured 1-GPU TFLOP/s on every GPU (perfect scaling)."""
    if base_tflops is None:
        return None
    flops = _flops_per_token(run, recompute=True) * 512 * SEQ_LENGTH
    days = ITERATIONS_PER_EPOCH * flops / (run.gpus * base_tflops * 1e12) / SECONDS_PER_DAY
    return Null("perfect scaling at the measured 1-GPU TFLOP/s", days)


def _days_per_epoch(rows, gpu, base_tflops: float | None) -> list[ClaimCheck]:
    """Table 2: days per epoch = 68,507 iterations x the measured iteration time / 86,400 s (absolute)."""
    checks = []
    for run in TABLE2:
        time = _value(rows, "iteration_s", model=f"t2_{run.label}", variant="repro")
        what = f"t2_{run.label}_{run.gpus}gpu: 68,507 x iteration time / 86,400 s"
        days = ITERATIONS_PER_EPOCH * time / SECONDS_PER_DAY if time is not None else None
        checks.append(compare(PAPER, f"t2_{run.label}_days_per_epoch", days, gpu=gpu, kind=ABSOLUTE, rel=0.10,
                              unit=" days", null=_perfect_days(run, base_tflops),
                              basis=f"megatron_weak_scaling_gpu:iteration:t2_{run.label}:{run.gpus}gpu",
                              note=what if days is not None else f"run megatron_weak_scaling_gpu's {what}"))
    return checks


def _aggregate(rows, gpu, base_tflops: float | None) -> list[ClaimCheck]:
    """The 512-GPU run's PFLOP/s (Fig. 5's 74 % x 512 x 39 TFLOP/s): the same quantity as its Fig. 5 bar."""
    per_gpu = _value(rows, "model_tflops_per_gpu", model="8p3B", tp=8, dp=64, variant="repro")
    null = Null("perfect scaling at the measured 1-GPU TFLOP/s", 512 * base_tflops / 1e3) if base_tflops else None
    return [compare(PAPER, "agg_pflops_from_74pct", per_gpu * 512 / 1e3 if per_gpu else None, gpu=gpu, kind=ABSOLUTE,
                    rel=0.10, unit=" PFLOP/s", null=null, basis="megatron_weak_scaling_gpu:tflops:8p3B:512gpu",
                    note="8p3B_512gpu: 512 x per-GPU TFLOP/s / 1000" if per_gpu else
                    "run megatron_weak_scaling_gpu's 8p3B_512gpu point")]
