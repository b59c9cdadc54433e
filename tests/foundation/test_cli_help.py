"""Every option of every command explains itself in ``--help`` and shows its default (issue 13)."""

from __future__ import annotations

import argparse

import pytest

from evals.cli import build_parser as eval_parser
from evals.fetch import build_parser as fetch_parser
from evals.hf_export import build_parser as export_parser
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
           "python -m repro.training.corpus": corpus_parser, "repro data fetch": fetch_parser,
           "repro export-hf": export_parser}


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
    from repro.harness.zero_report import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: repro zero-report") and "(default: 2)" in out and "(default: 8192)" in out


def test_positional_arguments_explain_themselves():
    def positionals(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    if child.add_help:
                        yield from positionals(child, f"{name} {sub}")
            elif not action.option_strings:
                yield f"{name} {action.metavar or action.dest}", action

    missing = [name for name, action in positionals(repro_parser(), "repro") if not (action.help or "").strip()]
    assert not missing, f"positional arguments without help: {missing}"


def test_every_scale_option_says_its_default_and_why():
    """run/submit default to the experiment's CPU scale, figures/claims to any, reproduce to ci, list to none: each
    --help says which, in the same words, and why."""
    helps = {command: " ".join(parser._get_formatter()._get_help_string(action).split())
             for command, parser, action in _options(repro_parser(), "repro") if "--scale" in action.option_strings}
    assert set(helps) == {"repro list", "repro run", "repro submit", "repro figures", "repro claims", "repro reproduce"}
    for command, text in helps.items():
        assert "ci, smoke, node or paper" in text and "(default: " in text, (command, text)
        assert text.count("default") == 1, (command, text)  # said once, not appended a second time
    for command in ("repro run", "repro submit"):
        assert "(default: the experiment's CPU scale, ci where it declares one, else smoke; so that" in helps[command]
    for command in ("repro figures", "repro claims"):
        assert "(default: any: per experiment, its newest paper-scale rows when it has some, else ci" in helps[command]
    assert "(default: ci; every experiment at its CPU scale" in helps["repro reproduce"]
