"""Evaluation tasks as records: a task's own options are :class:`Option` records of its :class:`Task`, and
:class:`EvalSpec`, the command line and a row's ``settings`` are built from them, so a new task is one record and
its scoring function (lm-eval's one YAML file per task)."""

from __future__ import annotations

import pytest

from evals import cli, tasks
from evals.task_record import Option, Task
from evals.tasks import EvalSpec

#: reads no data through datasets or lm_eval: runs without them (tests/evals/conftest.py), not again in
#: test_evals_without_datasets.py
pytestmark = pytest.mark.datasets_free

#: name -> (EvalSpec keywords, the text its one-line refusal holds, or None where the spec is accepted)
SPEC_CASES = {
    "stride_zero": (dict(task="wikitext", options={"stride": 0}), "stride=0 must be >= 1"),
    "stride_one": (dict(task="wikitext", options={"stride": 1}), None),
    "max_tokens_one": (dict(task="wikitext", options={"max_tokens": 1}), "max_tokens=1 must be >= 2 (a perplexity"),
    "max_tokens_two": (dict(task="wikitext", options={"max_tokens": 2}), None),
    "lambada_takes_no_stride": (dict(task="lambada", options={"stride": 32}),
                                "task 'lambada' takes no option 'stride'"),
    "lambada_without_options": (dict(task="lambada", options={}), None),
    "race_takes_no_max_tokens": (dict(task="race_zeroshot", options={"max_tokens": 9}), "no option 'max_tokens'"),
    "race_levels": (dict(task="race_zeroshot", options={"levels": ["high"]}), None),
    "unknown_task": (dict(task="hellaswag"), "task 'hellaswag' is not one of"),
    "tp_zero": (dict(task="lambada", tp=0), "tp=0 must be >= 1"),
    "tp_one": (dict(task="lambada", tp=1), None),
    "limit_zero": (dict(task="lambada", limit=0), "limit=0 must be >= 1"),
    "bootstrap_negative": (dict(task="lambada", bootstrap_iters=-1), "bootstrap_iters=-1 must be >= 0"),
    "bootstrap_zero": (dict(task="lambada", bootstrap_iters=0), None),
}


@pytest.mark.parametrize("name", SPEC_CASES)
def test_spec_refuses_or_accepts(name):
    keywords, refusal = SPEC_CASES[name]
    if refusal is None:
        EvalSpec(checkpoint="c", **keywords)
    else:
        with pytest.raises(ValueError) as err:
            EvalSpec(checkpoint="c", **keywords)
        assert refusal in str(err.value) and "\n" not in str(err.value)


def test_options_take_their_defaults_and_land_in_settings():
    wikitext = EvalSpec(task="wikitext", checkpoint="c", seq_len=64, options={"stride": 16})
    assert wikitext.options == {"stride": 16, "max_tokens": None, "split": "test"} and wikitext["stride"] == 16
    assert tasks.row_settings(wikitext) == {"task": "wikitext", "tp": 1, "seq_len": 64, "batch_size": 8, "limit": None,
                                         "bootstrap_iters": 100_000, "stride": 16, "max_tokens": None, "split": "test"}
    race = EvalSpec(task="race_zeroshot", checkpoint="c", options={"levels": "high"})
    assert race["levels"] == ("high",) and tasks.row_settings(race)["levels"] == ["high"]
    assert "stride" not in tasks.row_settings(EvalSpec(task="lambada", checkpoint="c"))


def test_a_new_task_is_one_record(monkeypatch):
    """A record added to TASKS is a command with its own option, a spec that checks it, and rows that name it."""
    def evaluate(spec, model, tokenizer, common):
        return [{"metric": "shots", "value": spec["shots"], "settings": tasks.row_settings(spec), **common}]

    record = Task("echo_shots", "echo-shots", "a task that scores nothing", evaluate,
                  options=(Option("shots", 0, "examples shown before each question", parse=int, minimum=0),))
    monkeypatch.setitem(tasks.TASKS, record.name, record)
    args = cli.build_parser().parse_args(["--quiet", "echo-shots", "--checkpoint", "c", "--shots", "3"])
    assert tasks.task_of_command(args.command) is record
    spec = cli.eval_spec(args, record.name)
    assert spec.options == {"shots": 3}
    assert record.evaluate(spec, None, None, {})[0]["settings"]["shots"] == 3
    with pytest.raises(ValueError, match="shots=-1 must be >= 0"):
        EvalSpec(task="echo_shots", checkpoint="c", options={"shots": -1})
