"""The reconciliation table: one model, every definition of "WikiText-103 perplexity" and "LAMBADA accuracy".

Published numbers are often not comparable because the definitions differ by more than the models do. For a
single model this puts side by side, each with the papers that use it:

| quantity | definition | used by |
|---|---|---|
| WikiText-103 token perplexity | exp(mean NLL per GPT-2 BPE token), Megatron windows | Megatron-LM code's "ppl" |
| WikiText-103 adjusted perplexity | same NLL sum / (T_o - 1) original word-level tokens | Megatron-LM Table 3; GPT-2 paper's "rescaled to the original tokenization" |
| WikiText word perplexity | rolling disjoint windows per article, NLL / whitespace words | lm-eval ``wikitext`` |
| bits per byte | NLL / UTF-8 bytes / ln 2 | lm-eval ``wikitext``; The Pile / GPT-NeoX style reporting |
| LAMBADA strict accuracy | every BPE token of the last word greedy | Megatron-LM ``--strict-lambada`` (used for Table 3) |
| LAMBADA non-strict accuracy | only the passage's last BPE token | Megatron-LM default (no flag); inflates accuracy |
| LAMBADA lm-eval accuracy | ``lambada_openai``: last space-separated word greedy | lm-eval; GPT-3-style zero-shot reports |
"""

from __future__ import annotations

from typing import Any, Sequence

USED_BY = {
    ("wikitext103", "token_perplexity", "megatron_token"):
        "Megatron-LM zero-shot code's 'ppl' (not in the paper)",
    ("wikitext103", "adjusted_perplexity", "megatron_adjusted"):
        "Megatron-LM paper Table 3 (T_o = 245,566); GPT-2 paper style (rescaled to original tokens)",
    ("wikitext103", "word_perplexity", "lm_eval"): "lm-eval `wikitext` word_perplexity (per article, disjoint windows)",
    ("wikitext103", "bits_per_byte", "lm_eval"): "lm-eval `wikitext` bits_per_byte (Pile-style)",
    ("wikitext103", "byte_perplexity", "lm_eval"): "lm-eval `wikitext` byte_perplexity",
    ("lambada", "accuracy", "strict"): "Megatron-LM `--strict-lambada` (whole last word; the Table 3 setting)",
    ("lambada", "accuracy", "nonstrict"): "Megatron-LM default (last BPE token only)",
    ("lambada", "accuracy", "lm_eval"): "lm-eval `lambada_openai` acc (GPT-3-style zero-shot)",
    ("lambada", "last_word_perplexity", "strict"): "per-passage perplexity of the last word",
    ("lambada", "last_word_perplexity", "lm_eval"): "lm-eval `lambada_openai` perplexity",
}

ORDER = [
    ("wikitext103", "token_perplexity", "megatron_token"),
    ("wikitext103", "adjusted_perplexity", "megatron_adjusted"),
    ("wikitext103", "word_perplexity", "lm_eval"),
    ("wikitext103", "bits_per_byte", "lm_eval"),
    ("lambada", "accuracy", "strict"),
    ("lambada", "accuracy", "nonstrict"),
    ("lambada", "accuracy", "lm_eval"),
    ("lambada", "last_word_perplexity", "lm_eval"),
]


def reconciliation_rows(rows: Sequence[dict[str, Any]], lm_eval_measured: dict[tuple, float] | None = None
                        ) -> list[dict[str, Any]]:
    """Pick the table's entries out of evaluation rows (from :func:`evals.tasks.run_eval`); ``lm_eval_measured``
    maps the same keys to values lm-eval itself produced on the same model, shown in their own column."""
    index = {(r["task"], r["metric"], r["definition"]): r for r in rows}
    table = []
    for key in ORDER:
        if key not in index:
            continue
        r = index[key]
        table.append({
            "task": key[0], "metric": key[1], "definition": key[2], "value": r["value"], "unit": r["unit"],
            "lm_eval_itself": (lm_eval_measured or {}).get(key), "used_by": USED_BY[key],
        })
    return table


def markdown(table: Sequence[dict[str, Any]], *, title: str = "") -> str:
    lines = [f"### {title}", ""] if title else []
    lines += ["| task | quantity | definition | repro | lm-eval itself | used by |", "|---|---|---|---|---|---|"]
    for r in table:
        def fmt(v):
            return "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
        unit = "" if r["unit"] in ("perplexity", "count") else f" {r['unit']}"
        lines.append(f"| {r['task']} | {r['metric']} | {r['definition']} | {fmt(r['value'])}{unit} | "
                     f"{fmt(r['lm_eval_itself'])} | {r['used_by']} |")
    return "\n".join(lines)
