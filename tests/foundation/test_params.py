"""``count_parameters``: equal to the instantiated models, and the papers' counts to their printed precision.

The configurations (layers, hidden size, heads) are read from paper_claims.csv. The printed count is the model's
label in Tables 1, 2 and 4 (``1.2B``, ``355M``, ``3.9B``): the closed form, with the vocabulary padded for the
model-parallel degree each model was trained with (Megatron sec. 5.1: 128 x tp), must round to it.
"""

import re

import pytest
import torch

from repro.models import BertConfig, BertModel, GPTConfig, GPTModel, count_model_parameters, count_parameters
from repro.paper import load_claims

GPT2_VOCAB, BERT_VOCAB = 50257, 30522
# model-parallel degree per model (Table 1 "model parallel GPUs"; Table 2 / 4 models: 355M and 336M were trained
# without model parallelism; the larger ones with it -- the padding differs by < 0.1% either way).
TP = {"1p2B": 1, "2p5B": 2, "4p2B": 4, "8p3B": 8, "355M": 1, "336M": 1, "1p3B": 2, "3p9B": 4}


def _table_models(prefix: str):
    claims = load_claims()
    rows = claims[(claims["paper"] == "megatron_lm_2019") & claims["claim_id"].str.startswith(prefix)]
    models = {}
    for claim_id, value in zip(rows["claim_id"], rows["value_num"]):
        match = re.fullmatch(rf"{prefix}([0-9p]+[MB])_(layers|hidden|heads)", claim_id)
        if match:
            models.setdefault(match.group(1), {})[match.group(2)] = int(value)
    return models


def _printed(label: str) -> tuple[float, int, float]:
    """``'1p3B'`` -> (1.3, 1 decimal, 1e9)."""
    number, unit = label[:-1].replace("p", "."), label[-1]
    decimals = len(number.split(".")[1]) if "." in number else 0
    return float(number), decimals, 1e9 if unit == "B" else 1e6


@pytest.mark.parametrize("prefix,expected_models,seq", [
    ("t1_", {"1p2B", "2p5B", "4p2B", "8p3B"}, 1024),
    ("t2_", {"355M", "2p5B", "8p3B"}, 1024),
    ("t4_", {"336M", "1p3B", "3p9B"}, 512),
])
def test_paper_parameter_counts(prefix, expected_models, seq):
    models = _table_models(prefix)
    assert set(models) == expected_models
    for label, cfg in models.items():
        kind = BertConfig if prefix == "t4_" else GPTConfig
        config = kind(vocab_size=BERT_VOCAB if prefix == "t4_" else GPT2_VOCAB, hidden_size=cfg["hidden"],
                      num_layers=cfg["layers"], num_attention_heads=cfg["heads"], max_position_embeddings=seq)
        value, decimals, scale = _printed(label)
        got = count_parameters(config, tp_size=TP[label]) / scale
        assert round(got, decimals) == value, f"{prefix}{label}: {got:.4f} does not print as {value}"


def test_closed_form_equals_instantiated():
    gpt = GPTConfig(vocab_size=1000, hidden_size=64, num_layers=3, num_attention_heads=4, max_position_embeddings=32)
    bert = BertConfig(vocab_size=1000, hidden_size=64, num_layers=3, num_attention_heads=4, max_position_embeddings=32)
    for config, cls in ((gpt, GPTModel), (bert, BertModel)):
        with torch.device("meta"):
            model = cls(config)
        assert count_parameters(config) == count_model_parameters(model)
        # more tensor parallelism only adds padding rows (and, for BERT, padding entries of the LM-head bias)
        extra_rows = config.padded_vocab_size(8) - config.padded_vocab_size(1)
        per_row = config.hidden_size + (1 if cls is BertModel else 0)
        assert count_parameters(config, 8) - count_parameters(config, 1) == extra_rows * per_row


def test_ffn_size_other_than_4h():
    config = GPTConfig(vocab_size=128, hidden_size=32, num_layers=2, num_attention_heads=2,
                       max_position_embeddings=8, ffn_hidden_size=48)
    assert count_parameters(config) == count_model_parameters(GPTModel(config))


def test_parameter_counts_experiment_builds_the_suite_configs():
    """The experiment's models are the perfmodel's Table 1 / Table 2 / MT-NLG configs (nothing re-typed)."""
    from repro.experiments.parameter_counts import CONFIGS
    from repro.paper import half_last_digit
    from repro.perfmodel.megatron import TABLE1, TABLE2
    from repro.perfmodel.mtnlg import MTNLG_530B

    for table, prefix in ((TABLE1, "t1_"), (TABLE2, "t2_")):
        for config in table:
            layers, hidden, heads, seq, _, claim_prefix = CONFIGS[prefix + config.label]
            assert (layers, hidden, heads, seq) == (config.num_layers, config.hidden_size, config.num_heads, 1024)
            assert claim_prefix == prefix + config.label
    assert CONFIGS["mtnlg530B"][:4] == (MTNLG_530B.num_layers, MTNLG_530B.hidden_size, MTNLG_530B.num_heads,
                                        MTNLG_530B.seq_length)
    # half a unit of the printed last digit: '2.49' -> 0.005, '8.317' -> 0.0005, '40' -> 0.5
    assert half_last_digit("megatron_lm_2019", "t2_2p5B_params_recomputed") == pytest.approx(0.005)
    assert half_last_digit("megatron_lm_2019", "t2_8p3B_params_recomputed") == pytest.approx(0.0005)
    assert half_last_digit("megatron_lm_2019", "t1_1p2B_layers") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no claim"):
        half_last_digit("megatron_lm_2019", "no_such_claim")
