"""``repro train`` takes Megatron-LM's option names with Megatron's meaning (repro.training.megatron_names): each
alias parses as the repro option it names, ``--help`` shows both names, the options Megatron says another way
translate (global batch, --bf16/--fp16, the distributed optimizer, the timeout in minutes, the two dropouts), and a
Megatron command line trains the same model to the same losses as the repro one."""

from __future__ import annotations

import json

import pytest

from repro.training.cli import build_parser
from repro.training.failfast import UsageError
from repro.training.megatron_names import ALIASES, resolve_global_batch
from tests.training import forked

#: a value each aliased option accepts (None: a flag)
VALUES = {"--tp": "2", "--pp": "2", "--layers": "3", "--hidden": "48", "--heads": "6", "--vocab": "50304",
          "--seq-len": "128", "--steps": "7", "--data": "corpus/prefix", "--valid-data": "corpus/held-out",
          "--activation-checkpointing": None}


def test_every_alias_parses_as_its_option_and_help_shows_both():
    assert set(VALUES) == set(ALIASES)
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    for option, megatron in ALIASES.items():
        value = [] if VALUES[option] is None else [VALUES[option]]
        assert parser.parse_args([megatron, *value]) == parser.parse_args([option, *value]) != parser.parse_args([])
        metavar = "" if VALUES[option] is None else f" {option[2:].upper().replace('-', '_')}"
        assert f"{option}{metavar}, {megatron}{metavar}" in text


@pytest.mark.parametrize("argv, expected", [
    (["--bf16"], {"precision": "bf16"}),
    (["--fp16"], {"precision": "fp16"}),
    ([], {"precision": "fp32", "zero_stage": 0, "timeout_s": 30.0, "hidden_dropout": None}),  # the defaults stay
    (["--use-distributed-optimizer"], {"zero_stage": 1}),
    (["--distributed-timeout-minutes", "2"], {"timeout_s": 120.0}),
    (["--hidden-dropout", "0.1", "--attention-dropout", "0.2"], {"hidden_dropout": 0.1, "attention_dropout": 0.2}),
    (["--make-vocab-size-divisible-by", "64"], {"make_vocab_size_divisible_by": 64}),
    (["--precision", "bf16", "--fp16"], {"precision": "fp16"}),  # the last one given wins, as for any option
])
def test_megatron_options_translate(argv, expected):
    args = vars(build_parser().parse_args(argv))
    assert {key: args[key] for key in expected} == expected


def _resolve(values: dict, dp: int, from_config: bool) -> tuple[int, int]:
    """(micro-batches, global batch) of the settings ``values`` (``explicit``: the options the command line gave)."""
    settings = {"global_batch_size": None, "micro_batch_size": 2, "micro_batches": 4, **values}
    fixed_by = ("--deepspeed-config's batch keys" if from_config
                else "--micro-batches" if "micro_batches" in settings.get("explicit", ()) else None)
    return resolve_global_batch(settings["global_batch_size"], micro_batch_size=settings["micro_batch_size"],
                                micro_batches=settings["micro_batches"], dp=dp, fixed_by=fixed_by)


@pytest.mark.parametrize("values, dp, from_config, expected", [
    ({}, 2, False, (4, 16)),  # without it: the global batch the other options make
    ({"global_batch_size": 24}, 2, False, (6, 24)),  # 24 / (2 x 2) micro-batches
    ({"global_batch_size": 4}, 2, False, (1, 4)),
    ({"global_batch_size": 22}, 2, False, "must be a multiple of --micro-batch-size 2 x dp 2 = 4"),
    ({"global_batch_size": 24, "micro_batches": 6, "explicit": {"micro_batches"}}, 2, False, (6, 24)),  # agrees
    ({"global_batch_size": 24, "micro_batches": 3, "explicit": {"micro_batches"}}, 2, False,
     "contradicts --micro-batches: 3 micro-batches"),
    ({"global_batch_size": 24, "micro_batches": 3}, 2, True, "contradicts --deepspeed-config's batch keys"),
])
def test_global_batch_size_is_megatrons(values, dp, from_config, expected):
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            _resolve(values, dp, from_config)
    else:
        assert _resolve(values, dp, from_config) == expected


def _train(tmp_path, name: str, argv: list[str]) -> tuple[list[float], str]:
    """``python -m repro train ARGV --save DIR``, forked from a warm server (tests/training/forked.py)."""
    done = forked.run(["-m", "repro", "train", *argv, "--save", str(tmp_path / name)], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
    return [r["lm_loss"] for r in records if r["event"] == "iteration"], done.stdout


def test_a_megatron_command_line_trains_as_the_repro_one(tmp_path):
    megatron = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
                "--vocab-size", "64", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
                "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
                "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--save-interval", "2",
                "--eval-interval", "2", "--eval-iters", "1", "--distributed-timeout-minutes", "1"]
    ours = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--vocab", "64",
            "--micro-batch-size", "2", "--micro-batches", "2", "--steps", "4", "--lr", "3e-3", "--min-lr", "3e-4",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--dropout", "0.1", "--save-interval", "2",
            "--eval-interval", "2", "--eval-iters", "1", "--timeout-s", "60"]
    theirs, out = _train(tmp_path, "megatron", megatron)
    mine, _ = _train(tmp_path, "repro", ours)
    assert len(theirs) == 4 and theirs == mine
    assert "global_batch_size ..." in out and json.loads((tmp_path / "megatron" / "train_args.json").read_text())[
        "global_batch_size"] == 4
    assert (tmp_path / "megatron" / "iter_0000002").is_dir()
