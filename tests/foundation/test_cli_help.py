"""Every option of every command explains itself in ``--help`` and shows its default (issue 13)."""

from __future__ import annotations

import argparse

import pytest

from evals.cli import build_parser as eval_parser
from repro.cli import build_parser as repro_parser
from repro.training.cli import build_parser as train_parser
from repro.training.corpus import build_parser as corpus_parser


def _options(parser: argparse.ArgumentParser, name: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                if child.add_help:  # forwarded commands (train, eval, zero-report) are checked on their own
                    yield from _options(child, f"{name} {sub}")
        elif action.option_strings and action.dest != "help":
            yield name, parser, action


PARSERS = {"repro": repro_parser, "repro eval": eval_parser, "repro train": train_parser,
           "python -m repro.training.corpus": corpus_parser}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_has_help_and_shows_its_default(name):
    missing, no_default = [], []
    for command, parser, action in _options(PARSERS[name](), name):
        if not (action.help or "").strip():
            missing.append(f"{command} {action.option_strings[0]}")
            continue
        shown = parser._get_formatter()._get_help_string(action)
        if action.default not in (None, False) and not isinstance(action.default, bool) and "default" not in shown:
            no_default.append(f"{command} {action.option_strings[0]}")
    assert not missing, f"options without help: {missing}"
    assert not no_default, f"options whose help hides the default: {no_default}"


def test_zero_report_help_shows_defaults(capsys):
    from repro.zero.report import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: repro zero-report") and "(default: 2)" in out and "(default: 8192)" in out
