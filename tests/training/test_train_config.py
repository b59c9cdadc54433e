"""``repro train``'s options as one frozen, checked :class:`~repro.training.config.TrainConfig`: the parser and the
config agree on every setting and default, a parsed command line is never changed, and each rule across settings is
one function whose words are the reader's (options on the command line and for a DeepSpeed file, fields for the
library's dataclasses). All in this process: nothing trains."""

from __future__ import annotations

import dataclasses
import json

import pytest

from repro.training.argcheck import DeepSpeedOptions, check_args
from repro.training.cli import build_parser
from repro.training.config import ConfigError, TrainConfig
from repro.training.failfast import UsageError
from repro.training.options import config_from_options, explicit_options
from repro.training.schedule import LRSchedule
from repro.training.settings import TrainSettings
from repro.zero.config import ZeroConfig
from repro.zero.deepspeed_json import DeepSpeedLogging
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES

#: settings that no option sets: a DeepSpeed file's ZeRO block and its W&B group and team
FILE_ONLY = {"zero", "wandb_group", "wandb_entity"}


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_each_option_is_a_setting_with_the_configs_default():
    parsed = vars(build_parser().parse_args([]))
    defaults = TrainConfig().settings()
    assert set(defaults) - set(parsed) == FILE_ONLY
    assert parsed == {name: defaults[name] for name in parsed}


def test_the_config_is_frozen_and_remade_by_name():
    config = TrainConfig.from_settings(tp=2, lr_warmup_iters=3, vocab=128)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.parallelism.tp = 4
    assert TrainConfig.from_settings(config.settings()) == config
    wider = config.replaced(hidden=128)
    assert (wider.model.hidden, config.model.hidden, wider.optimizer.lr_warmup_iters) == (128, 64, 3)
    assert wider.gpt_config().hidden_size == 128 and wider.train_settings("cpu").lr_warmup == 3
    with pytest.raises(TypeError, match="unknown settings: tpp"):
        TrainConfig.from_settings(tpp=2)


def test_dropout_sets_both_unless_megatrons_options_set_one_apart():
    model = TrainConfig.from_settings(dropout=0.2, attention_dropout=0.0, vocab=64).gpt_config()
    assert (model.hidden_dropout, model.attention_dropout) == (0.2, 0.0)


#: (settings, the refusal's words or None for accepted): each rule across settings, refused and at its edge
RULES = {
    "zero2_pipeline": ({"zero_stage": 2, "pp": 2}, "--zero-stage 2 needs --pp 1 (ZeRO-2/3 shard gradients"),
    "zero1_pipeline": ({"zero_stage": 1, "pp": 2}, None),
    "fp16_zero1": ({"precision": "fp16", "zero_stage": 1}, "--precision fp16 needs --zero-stage 0 (the trainer's"),
    "bf16_zero1": ({"precision": "bf16", "zero_stage": 1}, None),
    "min_lr_above_lr": ({"min_lr": 0.0011, "lr": 0.001}, "--min-lr 0.0011 must be <= --lr 0.001"),
    "min_lr_at_lr": ({"min_lr": 0.001, "lr": 0.001}, None),
    "warmup_past_steps": ({"lr_warmup_iters": 21, "steps": 20}, "--lr-decay-iters 20 must be >= --lr-warmup-iters 21"),
    "warmup_at_steps": ({"lr_warmup_iters": 20, "steps": 20}, None),
    "warmup_past_decay": ({"lr_warmup_iters": 6, "lr_decay_iters": 5, "steps": 20, "lr_decay_style": "linear"},
                          "--lr-decay-iters 5 must be >= --lr-warmup-iters 6"),
    "heads_split_hidden": ({"hidden": 66, "heads": 4, "vocab": 64}, "--heads 4 --hidden 66 --tp 1: "),
    "heads_split_tp": ({"hidden": 64, "heads": 4, "tp": 8, "vocab": 64}, "--heads 4 --hidden 64 --tp 8: "),
    "heads_split_both": ({"hidden": 64, "heads": 4, "tp": 4, "vocab": 64}, None),
    "zero_stage_4": ({"zero_stage": 4}, "--zero-stage=4 is not a ZeRO stage"),
    "save_interval_alone": ({"save_interval": 5}, "--save-interval 5 needs --save DIR"),
    "wandb_name_alone": ({"wandb_exp_name": "run"}, "--wandb-exp-name 'run' has no effect without --wandb-project"),
    "wait_too_short": ({"timeout_s": 0.5}, "--timeout-s 0.5 must be at least 1 s"),
    "wait_shortest": ({"timeout_s": 1.0}, None),
    "valid_data_alone": ({"valid_data": "v"}, "--valid-data v needs --eval-interval N"),
}


def test_each_rule_refuses_in_one_line_naming_the_options():
    for name, (settings, words) in RULES.items():
        if words is None:
            TrainConfig.from_settings(settings)
            continue
        with pytest.raises(ConfigError) as refused:
            TrainConfig.from_settings(settings)
        line = str(refused.value)
        assert words in line and "\n" not in line, (name, line)


def test_the_library_meets_the_same_rules_in_its_own_words():
    """One rule, one reason: TrainSettings and LRSchedule name their fields where the command line names options."""
    cases = [
        (lambda: TrainSettings(steps=1, micro_batches=1, precision="fp16", zero_stage=1),
         "precision='fp16' needs zero_stage=0 (the trainer's ZeRO stages have no loss scaler)"),
        (lambda: LRSchedule(max_lr=1e-3, min_lr=2e-3), "min_lr=0.002 must be <= max_lr=0.001"),
        (lambda: LRSchedule(max_lr=1e-3, warmup=6, decay_iters=5), "decay_iters=5 must be >= warmup=6"),
        (lambda: TrainSettings(steps=1, micro_batches=1, zero_stage=2, zero=ZeroConfig(stage=1)),
         "the ZeRO config's stage 1 differs from zero_stage=2"),
    ]
    for make, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            make()
    TrainSettings(steps=1, micro_batches=1, precision="fp16", zero_stage=0)
    LRSchedule(max_lr=1e-3, min_lr=1e-3, warmup=5, decay_iters=5)


def _deepspeed(zero: ZeroConfig) -> DeepSpeedOptions:
    return DeepSpeedOptions(zero, None, DeepSpeedLogging())


@pytest.mark.parametrize("zero, argv, words", [
    (ZeroConfig(stage=2), ["--pp", "2"], "--zero-stage 2 needs --pp 1"),
    (ZeroConfig(stage=1), ["--pp", "2"], None),
    (ZeroConfig(stage=1), ["--precision", "fp16"], "--precision fp16 needs --zero-stage 0"),
    (ZeroConfig(stage=1, dtype="bf16"), [], "--deepspeed-config ds.json enables bf16: the trainer keeps fp32"),
    (ZeroConfig(stage=1, max_grad_norm=0.5), ["--clip-grad", "2"], "--clip-grad 2.0 contradicts --deepspeed-config"),
])
def test_a_deepspeed_files_settings_meet_the_same_rules(zero, argv, words):
    parser = build_parser()
    argv = ["--deepspeed-config", "ds.json", *argv]
    options = vars(parser.parse_args(argv))
    make = lambda: config_from_options(options, explicit_options(parser, argv), _deepspeed(zero))  # noqa: E731
    if words is None:
        assert make().parallelism.zero == zero
        return
    with pytest.raises(UsageError, match=words):
        make()


def test_check_args_leaves_the_parsed_options_as_they_were(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5, "steps_per_print": 2}))
    parser = build_parser()
    argv = ["--deepspeed-config", str(path), "--global-batch-size", "6", "--micro-batch-size", "3"]
    options = parser.parse_args(argv)
    before = dict(vars(options))
    config = check_args(options, explicit_options(parser, argv))
    assert vars(options) == before
    assert (config.parallelism.zero_stage, config.optimizer.clip_grad, config.logging.log_interval) == (1, 0.5, 2)
    assert (config.training.micro_batch_size, config.training.micro_batches, config.parallelism.dp,
            config.training.global_batch_size, config.model.vocab) == (3, 2, 1, 6, 256)


@pytest.mark.parametrize("keys, words", [
    ({"train_micro_batch_size_per_gpu": 3}, None),  # the micro-batches stay the options': the global batch sets them
    ({"gradient_accumulation_steps": 3}, "--global-batch-size 6 contradicts --deepspeed-config's batch keys"),
    ({"train_batch_size": 12}, "--global-batch-size 6 contradicts --deepspeed-config's batch keys"),
])
def test_the_global_batch_meets_only_the_micro_batches_a_file_gives(tmp_path, keys, words):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 0}, **keys}))
    parser = build_parser()
    argv = ["--deepspeed-config", str(path), "--global-batch-size", "6", "--micro-batch-size", "3"]
    if words is None:
        assert check_args(parser.parse_args(argv), explicit_options(parser, argv)).training.micro_batches == 2
        return
    with pytest.raises(UsageError, match=words):
        check_args(parser.parse_args(argv), explicit_options(parser, argv))
