"""Parameter counts of the papers' GPT configurations (Megatron-LM Tables 1-2, ZeRO Table 4, MT-NLG 530B):
the closed form 12Lh^2 + 13Lh + (V + s)h + 2h (``repro.models.count_parameters``) beside the number of parameters
a :class:`~repro.models.GPTModel` of that configuration actually instantiates.

The configurations are the suite's own (``repro.perfmodel.megatron.TABLE1`` / ``TABLE2``,
``repro.perfmodel.mtnlg.MTNLG_530B``); the layers, hidden size and heads of each instantiated module are reported
too, so Table 2's configuration claims check the models the suite builds.

The models are built on torch's ``meta`` device, so even the 530B model costs no memory and the "measured"
count is the real module tree, not the formula again. Megatron pads the 50,257-token GPT-2 vocabulary to a
multiple of 128 x 8 = 1024 for 8-way model parallelism (sec. 5.1), i.e. V = 51,200.

Evidence, decided from each row's inputs (:func:`repro.paper.evidence_from`, stored in the row's
``evidence``): a parameter count of an instantiated module is ``derived`` (the suite built it); the padded vocabulary
(50,257, 128 and 8, all printed in sec. 5.1), hidden size per head (both printed) and ZeRO Table 4's 12 L h^2 on its
printed layers and hidden size are the paper's own arithmetic (``consistency``). A model's count stated twice (printed
and recomputed by the claims table) or by two tables for one shape has one basis (:func:`params_basis`: the count
depends on the layers, hidden size and sequence length, not the heads), so the report counts it once.
"""

from __future__ import annotations

from repro.verdicts import check_value
from repro.experiments.base import Experiment, Point, RunContext
from repro.vocabulary import ClaimCheck, Null
from repro.models import GPTConfig, count_model_parameters, count_parameters
from repro.paper import evidence_from, evidence_of_count, printed
from repro.perfmodel.megatron import TABLE1, TABLE2
from repro.perfmodel.mtnlg import MTNLG_530B
from repro.perfmodel.zero_infinity import params_per_block

GPT2_VOCAB = 50257
MEGATRON = "megatron_lm_2019"
#: label -> (layers, hidden, heads, sequence length, paper, claim-id prefix), from the suite's config objects
CONFIGS = {
    **{f"t1_{c.label}": (c.num_layers, c.hidden_size, c.num_heads, c.model().seq_length, MEGATRON, f"t1_{c.label}")
       for c in TABLE1},
    **{f"t2_{r.label}": (r.num_layers, r.hidden_size, r.num_heads, r.model().seq_length, MEGATRON, f"t2_{r.label}")
       for r in TABLE2},
    "mtnlg530B": (MTNLG_530B.num_layers, MTNLG_530B.hidden_size, MTNLG_530B.num_heads, MTNLG_530B.seq_length,
                  "mt_nlg_2022", "params"),
}
#: ZeRO Table 4 checks use 12 L h^2 (the transformer blocks only): label -> (layers, hidden), as Table 4 prints them
ZERO_T4 = {"60B": (printed(75, "zero_2019", "t4_fig3_60B"), printed(8192, "zero_2019", "t4_fig3_60B")),
           "170B": (printed(212, "zero_2019", "t4_fig2_80B-170B"), printed(8192, "zero_2019", "t4_fig2_80B-170B"))}
#: Megatron sec. 5.1: the 50,257-token GPT-2 vocabulary padded to a multiple of 128 x 8 (8-way model parallelism).
PADDING = {"vocab": printed(GPT2_VOCAB, MEGATRON, "padded_vocab"), "multiple": printed(128, MEGATRON, "padded_vocab"),
           "tp": printed(8, MEGATRON, "padded_vocab")}


def _config(layers: int, hidden: int, heads: int, seq: int) -> GPTConfig:
    # make_vocab_size_divisible_by=1024: the 8-way padding (128 x 8) on one unsharded model, V = 51,200
    return GPTConfig(vocab_size=GPT2_VOCAB, hidden_size=hidden, num_layers=layers, num_attention_heads=heads,
                     max_position_embeddings=seq, make_vocab_size_divisible_by=1024)


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    from repro.models import GPTModel
    import torch
    rows = []
    for label in point.params["models"]:
        layers, hidden, heads, seq, paper, prefix = CONFIGS[label]
        config = _config(layers, hidden, heads, seq)
        with torch.device("meta"):
            model = GPTModel(config)
        common = {"model": label, "paper": paper, "layers": layers, "hidden": hidden, "heads": heads, "seq": seq,
                  "padded_vocab": config.padded_vocab_size(1)}
        rows.append({"metric": "closed_form_params", "value": count_parameters(config) / 1e9,
                     "unit": "billion params", **common})
        rows.append({"metric": "instantiated_params", "value": count_model_parameters(model) / 1e9,
                     "unit": "billion params", **common})
        rows.append({"metric": "hidden_per_head", "value": float(hidden // heads), "unit": "count", **common})
        attention = model.layers[0].attention  # one process: heads_per_rank is all the heads
        built = {"built_layers": len(model.layers), "built_hidden": model.final_layernorm.normalized_shape[0],
                 "built_heads": attention.heads_per_rank}
        rows += [{"metric": metric, "value": float(value), "unit": "count", **common}
                 for metric, value in built.items()]
        del model
    return rows + zero_t4_rows() + [padded_vocab_row()]


def zero_t4_rows() -> list[dict]:
    """ZeRO Table 4's 60B and 170B shapes through 12 L h^2 (``params_per_block``): the paper's arithmetic."""
    return [{"metric": "block_params_12Lh2", "value": params_per_block(int(hidden)) * int(layers) / 1e9,
             "unit": "billion params", "model": label, "paper": "zero_2019", "layers": int(layers),
             "hidden": int(hidden), "evidence": evidence_from(layers, hidden)}
            for label, (layers, hidden) in ZERO_T4.items()]


def padded_vocab_row() -> dict:
    """The vocabulary a GPTModel pads 50,257 to at tp 8 (``GPTConfig.padded_vocab_size``): the paper's rule on its
    printed numbers."""
    config = GPTConfig(vocab_size=int(PADDING["vocab"]), hidden_size=64, num_layers=1, num_attention_heads=1,
                       max_position_embeddings=8, make_vocab_size_divisible_by=int(PADDING["multiple"]))
    return {"metric": "padded_vocab", "value": float(config.padded_vocab_size(int(PADDING["tp"]))), "unit": "tokens",
            "model": "gpt2", "paper": "megatron_lm_2019", "evidence": evidence_from(*PADDING.values())}


def params_basis(*, layers: int, hidden: int, seq: int) -> str:
    """The quantity a parameter count states: the count of one GPT shape (padded vocabulary 51,200), whichever
    table or experiment states it."""
    return f"parameter_counts:params:l{layers}:h{hidden}:s{seq}"


def _evidence(rows, metric: str, model: str, fresh: dict) -> str:
    """The class the row carries; older rows have none: then the class the same row gets now (``fresh``: the padded
    vocabulary and ZeRO's 12 L h^2 depend on no module the run built)."""
    hit = rows[(rows["metric"] == metric) & (rows["model"] == model)]
    evidence = hit["evidence"].iloc[0] if len(hit) and "evidence" in hit else None
    return evidence if isinstance(evidence, str) and evidence else fresh["evidence"]


def _value(rows, metric: str, model: str) -> float | None:
    hit = rows[(rows["metric"] == metric) & (rows["model"] == model)]
    return float(hit["value"].iloc[0]) if len(hit) else None


def claims(rows) -> list[ClaimCheck]:
    """The instantiated count against the paper's count (rounded to 0.1B) and its config-derived count (to the
    paper's printed digits); hidden size per head; Table 2's layers / hidden / heads of the built modules; the
    padded vocabulary; ZeRO's 12Lh^2 checks."""
    if rows is None or len(rows) == 0:
        return []
    checks = []
    for label, (layers, hidden, _, seq, paper, prefix) in CONFIGS.items():
        got = _value(rows, "instantiated_params", label)  # counted on the module the suite built
        closed = _value(rows, "closed_form_params", label)
        # equal to the closed form on the paper's printed shapes: the paper's formula on its inputs (consistency)
        evidence = evidence_of_count(got, closed)
        note = (f"GPTModel on the meta device; closed form {closed:.4f}B"
                + (" (the count equals it: the paper's formula on its printed shapes)" if evidence == "consistency"
                   else "") if closed is not None else "")
        # a module count that is not the closed form is the suite's own: its null is the closed form
        common = dict(evidence=evidence, basis=params_basis(layers=layers, hidden=hidden, seq=seq),
                      null=Null("the closed form 12 l h^2 + 13 l h + (V + s) h + 2 h on the printed shape", closed)
                      if evidence != "consistency" and closed is not None else None)
        if paper == "mt_nlg_2022":
            checks.append(check_value(paper, "params_repro", got, abs=0.05, note=note, **common))
            checks.append(check_value(paper, "params", got, rel=0.01, note=note + "; paper rounds to 530B", **common))
            continue
        recomputed = f"{prefix}_params_recomputed"
        checks.append(check_value(paper, recomputed, got, note=note, **common))
        if prefix.startswith("t1_"):
            checks.append(check_value(paper, f"{prefix}_params", got, abs=0.05, note=note + "; paper rounds to 0.1B",
                                      **common))
            continue
        checks.append(check_value(paper, f"{prefix}_hidden_per_head", _value(rows, "hidden_per_head", label),
                                  note="hidden / heads, both printed in the paper", evidence="consistency"))
        for key in ("layers", "hidden", "heads"):
            checks.append(check_value(paper, f"{prefix}_{key}", _value(rows, f"built_{key}", label),
                                      note="configuration the suite runs (repro.perfmodel.megatron.TABLE2), read "
                                           "from the instantiated GPTModel", evidence="configuration"))
    per_head = {_value(rows, "hidden_per_head", f"t1_{c.label}") for c in TABLE1}
    if len(per_head) == 1:
        checks.append(check_value("megatron_lm_2019", "t1_hidden_per_head", per_head.pop(),
                                  note="h / heads of all four Table 1 configs", evidence="consistency"))
    checks.append(check_value("megatron_lm_2019", "padded_vocab", _value(rows, "padded_vocab", "gpt2"),
                              note="50,257 padded to a multiple of 128 x 8 by the suite's rule "
                                   "(GPTConfig.padded_vocab_size at tp 8)",
                              evidence=_evidence(rows, "padded_vocab", "gpt2", padded_vocab_row())))
    for fresh in zero_t4_rows():
        label = fresh["model"]
        checks.append(check_value("zero_2019", f"t4_check_{label}", _value(rows, "block_params_12Lh2", label),
                                  abs=0.05, note="12 L h^2 on Table 4's printed layers and hidden size",
                                  evidence=_evidence(rows, "block_params_12Lh2", label, fresh)))
    return checks


MODELS = tuple(CONFIGS)
EXPERIMENT = Experiment(
    name="parameter_counts",
    paper="megatron_lm_2019",
    title="Parameter counts of the GPT configs (Megatron Tables 1-2, ZeRO Table 4, MT-NLG): closed form vs module",
    points={"ci": (Point("meta-models", {"models": MODELS}),), "paper": (Point("meta-models", {"models": MODELS}),)},
    run_point=run_point,
    claims=claims,
    description=__doc__ or "",
    budget_s={"ci": 30.0, "paper": 60.0},
    metrics=("closed_form_params", "instantiated_params", "hidden_per_head", "built_layers", "built_hidden",
             "built_heads", "block_params_12Lh2", "padded_vocab"),
)
