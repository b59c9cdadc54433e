"""WikiText's articles: the test and valid files are Wikipedia articles one after another, each opening with a
level-1 heading (`` = Title = `` between blank lines). The evaluation harness scores them one document each, as
lm-eval's ``wikitext`` task does; the corpus tool packs them as documents for training.
"""

from __future__ import annotations

import re
from typing import Sequence

_LEVEL1_HEADING = re.compile(r"^ = [^=].* = $")


def is_article_heading(lines: Sequence[str], index: int) -> bool:
    """A level-1 heading (" = Title = ") between blank lines; this excludes the few equation lines such as
    " = 1 henry and capacitance C = " inside the test article "Constant k filter"."""
    if not _LEVEL1_HEADING.match(lines[index].rstrip("\n")):
        return False
    before = lines[index - 1].strip() if index > 0 else ""
    after = lines[index + 1].strip() if index + 1 < len(lines) else ""
    return before == "" and after == ""


def split_articles(raw_text: str) -> list[str]:
    """WikiText as documents: a new article starts at each level-1 heading (60 articles in the test file).

    The pieces concatenate back to ``raw_text`` exactly; lines before the first heading join the first article.
    This is the document granularity lm-eval's ``wikitext`` task scores (one request per Wikipedia article).
    """
    lines = raw_text.splitlines(keepends=True)
    articles: list[list[str]] = [[]]
    for index, line in enumerate(lines):
        if is_article_heading(lines, index) and any(s.strip() for s in articles[-1]):
            articles.append([])
        articles[-1].append(line)
    return ["".join(piece) for piece in articles if piece]
