"""The WikiText detokenizer: rule-by-rule examples, and identity with lm-eval's on the whole test file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from repro.text.detokenize import wikitext_detokenize
from evals.loaders import load_wikitext


@pytest.mark.parametrize("raw, expected", [
    ("the well @-@ known 1 @,@ 000 and 3 @.@ 5 .", "the well-known 1,000 and 3.5 ."),
    ("Hello , world . Next", "Hello, world. Next"),
    ("a ( b c ) d [ e ] \" f \"", "a (b c) d [e] \"f\""),
    ("\n = = Career = = \n", "\n== Career ==\n"),
    ("the players ' union", "the players' union"),
    ("John 's dog", "John's dog"),
    ("temperature 5 \u00b0 C", "temperature 5\u00b0C"),
])
def test_rules(raw, expected):
    assert wikitext_detokenize(raw) == expected


def test_identical_to_lm_eval_on_test_file(data_dir):
    lm_eval = pytest.importorskip("lm_eval")
    path = Path(lm_eval.__file__).parent / "tasks" / "wikitext" / "preprocess_wikitext.py"
    spec = importlib.util.spec_from_file_location("lm_eval_preprocess_wikitext", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = load_wikitext("test", data_dir).records
    assert wikitext_detokenize(text) == module.wikitext_detokenizer({"page": text})
