"""Claims that no experiment of this suite can measure on any hardware a user has, as data, each with its reason.

A "needs GPU" claim either maps to a GPU experiment point (its ``claims`` function turns that point's rows into the
claim's value) or matches a row here: the claim is a result of the paper's own trained models, of its generation
pipelines and their quality harnesses, a specification of its cluster, or a number it quotes from other work.
The report then says "only the paper's hardware or simulator can measure this" with the reason, never "no experiment
maps this claim yet". Rows are matched on (paper, claim id regular expression); the first match wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OutOfReach:
    """Claims of ``paper`` whose id matches ``pattern`` (``re.fullmatch``), and why the suite cannot measure them."""

    paper: str
    pattern: str
    reason: str


_TRAINED_GPT = ("needs the paper's trained model (the 8.3B GPT-2's weights are not public) or its full training run "
                "(512 V100s for days); eval_wikitext_lambada at paper scale computes WikiText-103 / LAMBADA rows for "
                "a checkpoint a user has")
_TRAINED_BERT = ("needs the paper's trained 336M-3.9B BERT models (not public) and their fine-tuning runs, or is a "
                 "result the paper quotes from other work (RoBERTa, ALBERT, XLNet)")
_SPEC = "a specification of the paper's cluster hardware, not a result a run measures"
_GEN = ("quality or runtime of the paper's video/image generation pipelines (HunyuanVideo, Wan, FLUX weights with "
        "VBench / GenEval / MAN-IQA / QualiCLIP harnesses) on its B200s; the suite measures attention itself "
        "(gna_speedup_gpu) and simulates the end-to-end speedup (gna_simulator)")

OUT_OF_REACH: tuple[OutOfReach, ...] = (
    # Megatron-LM
    OutOfReach("megatron_lm_2019", r"t5_(?!megatron_(336m|1p3b|3p9b)_race).*", _TRAINED_BERT),
    OutOfReach("megatron_lm_2019", r"abstract_race", _TRAINED_BERT),
    OutOfReach("megatron_lm_2019", r"bert_.*_val_ppl", _TRAINED_BERT),
    OutOfReach("megatron_lm_2019", r"abstract_wt103|abstract_lambada|val_ppl_8p3B", _TRAINED_GPT),
    OutOfReach("megatron_lm_2019", r"t3_prev_sota_.*", "a previous state of the art the paper quotes from other work"),
    OutOfReach("megatron_lm_2019", r"hw_(nvswitch|internode)_bw", _SPEC),
    OutOfReach("megatron_lm_2019", r"derived_peak_tflops",
               "a V100 peak implied by the paper's own numbers (39 TFLOP/s / 30 %); GPU runs divide by a datasheet "
               "peak table instead (repro.perfmodel.gpus), and baseline_pct_peak is the measured claim"),
    # MT-NLG
    OutOfReach("mt_nlg_2022", r"peak_exaflops|a100_peak", _SPEC),
    OutOfReach("mt_nlg_2022", r"val_loss_.*|hellaswag_.*",
               "loss and accuracy of the paper's trained 1B-530B models (not public) after its training run"),
    # ZeRO
    OutOfReach("zero_2019", r"hw_.*", _SPEC),
    OutOfReach("zero_2019", r"tnlg_.*",
               "Turing-NLG, Microsoft's 17B model trained with ZeRO on its cluster: weights and run are not public"),
    OutOfReach("zero_2019", r"bert_large_time",
               "wall-clock training time of a full run on the paper's 1024-GPU cluster"),
    OutOfReach("zero_2019", r"megatron_16B_512", "a number the paper quotes from Megatron-LM's own report"),
    # ZeRO-Infinity
    OutOfReach("zero_infinity_2021", r"peak_tp_assumed",
               "an assumption of the paper's bandwidth analysis (70 TFLOP/s per GPU), a setting rather than a result"),
    OutOfReach("zero_infinity_2021", r"eff_formula",
               "a formula, not a number: zero_infinity_model checks it at the paper's points"),
    # GNA
    # Table 5's runtime ratios are not here: gna_simulator sets them against its end-to-end bound
    OutOfReach("gna_2025", r"t5_.*(vbench.*|runtime)|t6_.*(man_iqa|qualiclip|geneval.*|runtime_s)", _GEN),
    OutOfReach("gna_2025", r"gemm_util|fa3_util",
               "utilisation figures of NVIDIA's GEMMs and FlashAttention-3 on Blackwell that the paper quotes as "
               "context"),
)


def out_of_reach(paper: str, claim_id: str) -> OutOfReach | None:
    """The first :data:`OUT_OF_REACH` row that covers ``(paper, claim_id)``, or None."""
    for row in OUT_OF_REACH:
        if row.paper == paper and re.fullmatch(row.pattern, claim_id):
            return row
    return None


ONLY_PAPER_HARDWARE = "only the paper's hardware or simulator can measure this"
