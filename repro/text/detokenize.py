"""The WikiText detokenizer used for zero-shot WikiText-103 evaluation.

WikiText is distributed word-tokenized (" @-@ " for an intra-word hyphen, spaces around punctuation). A BPE model
was trained on raw text, so both Megatron-LM (tasks/zeroshot_gpt, Megatron-LM paper App. E.1) and lm-eval's
``wikitext`` task undo the tokenization before applying the BPE. The two projects use the same ordered list of
rewrites; it is written here as data so each rule can be read and tested on its own. Order matters: e.g. the
bracket rules must run after " , " has become ", ".
"""

from __future__ import annotations

import re
from typing import Callable

# (kind, pattern, replacement), applied in order. kind "str" is a literal replace, "re" a regex substitution.
WIKITEXT_RULES: tuple[tuple[str, str, str], ...] = (
    # contractions: "players ' " -> "players' "
    ("str", "s '", "s'"),
    ("re", r"/' [0-9]/", r"/'[0-9]/"),  # kept as in the reference (it matches a literal "/' 1/")
    # number separators: "1 @,@ 000" -> "1,000", "3 @.@ 5" -> "3.5", "well @-@ known" -> "well-known"
    ("str", " @-@ ", "-"),
    ("str", " @,@ ", ","),
    ("str", " @.@ ", "."),
    # punctuation loses its leading space
    ("str", " : ", ": "),
    ("str", " ; ", "; "),
    ("str", " . ", ". "),
    ("str", " ! ", "! "),
    ("str", " ? ", "? "),
    ("str", " , ", ", "),
    # brackets and quotes hug their content (non-greedy, innermost first)
    ("re", r"\(\s*([^\)]*?)\s*\)", r"(\1)"),
    ("re", r"\[\s*([^\]]*?)\s*\]", r"[\1]"),
    ("re", r"{\s*([^}]*?)\s*}", r"{\1}"),
    ("re", r"\"\s*([^\"]*?)\s*\"", r'"\1"'),
    ("re", r"'\s*([^']*?)\s*'", r"'\1'"),
    # section headings "= = Career = =" -> "== Career =="
    ("str", "= = = =", "===="),
    ("str", "= = =", "==="),
    ("str", "= =", "=="),
    # degrees, line edges, the number placeholder, possessive
    ("str", " \u00b0 ", "\u00b0"),
    ("str", " \n", "\n"),
    ("str", "\n ", "\n"),
    ("str", " N ", " 1 "),
    ("str", " 's", "'s"),
)


def _compile(rules: tuple[tuple[str, str, str], ...]) -> Callable[[str], str]:
    steps: list[Callable[[str], str]] = []
    for kind, pattern, replacement in rules:
        if kind == "str":
            steps.append(lambda text, p=pattern, r=replacement: text.replace(p, r))
        elif kind == "re":
            steps.append(lambda text, c=re.compile(pattern), r=replacement: c.sub(r, text))
        else:
            raise ValueError(f"rule kind {kind!r} is not 'str' or 're'")

    def apply(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return apply


wikitext_detokenize: Callable[[str], str] = _compile(WIKITEXT_RULES)
wikitext_detokenize.__doc__ = "Undo WikiText's word tokenization (Megatron-LM / lm-eval rules, in order)."
