"""Checkpoints: Hugging Face GPT-2/BERT conversion parity, repro consolidated/sharded round trips, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from evals.checkpoint_formats import load_checkpoint
from evals.checkpoints import save_consolidated, save_shard
from evals.hf_convert import read_safetensors
from evals.model_builders import bert_from_state, gpt_from_state, load_gpt_for_eval
from evals.repro_lm import ReproCausalLM
from repro.text.tokenization import TextTokenizer, check_vocab_compatible
from repro.models import merge_state_dicts, shard_state_dict

from evals_test_models import tiny_gpt, tiny_gpt_config

#: reads no data through datasets or lm_eval: runs without them (tests/evals/conftest.py), not again in
#: test_evals_without_datasets.py
pytestmark = pytest.mark.datasets_free

transformers = pytest.importorskip("transformers")


def test_hf_gpt2_random_weights_same_logits(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=1000, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf_model = transformers.GPT2LMHeadModel(config).eval()
    hf_model.save_pretrained(tmp_path)
    loaded = load_checkpoint(tmp_path, expect="gpt")
    assert loaded.source == "huggingface" and loaded.config.hidden_size == 64
    model = ReproCausalLM(gpt_from_state(loaded))
    ids = torch.randint(0, 1000, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(ids).logits
    assert (model.full_logits(ids) - expected).abs().max() <= 1e-5


def test_hf_bert_random_weights_same_encoder_output(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    hf_model = transformers.BertForPreTraining(config).eval()
    hf_model.save_pretrained(tmp_path)
    model = bert_from_state(load_checkpoint(tmp_path, expect="bert"))
    ids = torch.randint(0, 500, (2, 40), generator=torch.Generator().manual_seed(1))
    types = (torch.arange(40) >= 20).long().expand(2, 40)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 30:] = 0
    with torch.no_grad():
        out = hf_model.bert(input_ids=ids, token_type_ids=types, attention_mask=mask)
        sequence, pooled = model(ids, types, mask)
    assert (sequence[0] - out.last_hidden_state[0]).abs().max() <= 1e-5
    assert (sequence[1, :30] - out.last_hidden_state[1, :30]).abs().max() <= 1e-5
    assert (pooled - out.pooler_output).abs().max() <= 1e-5


def test_safetensors_reader_roundtrip(tmp_path):
    from safetensors.torch import save_file

    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(2).half()}
    save_file(tensors, tmp_path / "x.safetensors")
    back = read_safetensors(tmp_path / "x.safetensors")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


def test_repro_checkpoint_any_tp_layout(tmp_path):
    model = tiny_gpt(dtype=torch.float32)
    config = model.config
    full = merge_state_dicts([model.state_dict()], config)
    save_consolidated(tmp_path / "full", full, architecture="gpt", config=config)
    for rank in range(2):
        save_shard(tmp_path / "tp2", shard_state_dict(full, config, rank, 2), architecture="gpt", config=config,
                   tp_rank=rank, tp_size=2)
    expected = model.state_dict()
    for source in ("full", "tp2"):
        loaded = load_checkpoint(tmp_path / source, expect="gpt", tp_rank=0, tp_size=1)
        assert loaded.source == "repro" and len(loaded.sha256) == 64
        assert all(torch.equal(loaded.state_dict[k], v) for k, v in expected.items())
        shard1 = load_checkpoint(tmp_path / source, expect="gpt", tp_rank=1, tp_size=2).state_dict
        assert all(torch.equal(shard1[k], v) for k, v in shard_state_dict(full, config, 1, 2).items())


def test_wrong_architecture_is_refused(tmp_path):
    config = tiny_gpt_config()
    model = tiny_gpt(dtype=torch.float32)
    save_consolidated(tmp_path / "gpt", merge_state_dicts([model.state_dict()], config), architecture="gpt",
                      config=config)
    with pytest.raises(ValueError, match="holds a 'gpt' model, but a 'bert' model was requested"):
        load_checkpoint(tmp_path / "gpt", expect="bert")
    hf_bert = tmp_path / "hf_bert"
    transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=8, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=16)).save_pretrained(hf_bert)
    with pytest.raises(ValueError, match="model_type 'bert', expected 'gpt2'"):
        load_checkpoint(hf_bert, expect="gpt")
    with pytest.raises(ValueError, match="not a checkpoint directory of a known format: a repro checkpoint has"):
        load_checkpoint(tmp_path, expect="gpt")
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "absent", expect="gpt")
    header = json.loads((tmp_path / "gpt" / "repro_checkpoint.json").read_text())
    header["architecture"] = "t5"
    (tmp_path / "gpt" / "repro_checkpoint.json").write_text(json.dumps(header))
    with pytest.raises(ValueError, match="architecture 't5' is not one of"):
        load_checkpoint(tmp_path / "gpt", expect="gpt")


def test_tokenizer_and_model_vocab_must_agree(tmp_path, gpt2_tok, bert_tok):
    config = tiny_gpt_config()
    model = tiny_gpt(dtype=torch.float32)
    save_consolidated(tmp_path, merge_state_dicts([model.state_dict()], config), architecture="gpt", config=config)
    with pytest.raises(ValueError, match="tokenizer 'bert-uncased-wordpiece' has 30522 tokens but the model's "
                                         "vocab_size is 50257, 19735 more"):
        load_gpt_for_eval(tmp_path, bert_tok)
    load_gpt_for_eval(tmp_path, gpt2_tok)  # the matching tokenizer loads
    assert isinstance(gpt2_tok, TextTokenizer)


@pytest.mark.parametrize("model_vocab, refused", [
    (50256, "ids 50256..50256 would have no logit"),  # a tokenizer larger than the model: refused
    (50257, None),  # equal
    (50304, None),  # nanoGPT's padding (and Megatron's at tp 1, divisible by 128)
    (51200, None),  # Megatron's at tp 8
    (56539, None),  # the most padding accepted: 12.5 % of 50257 rows
    (56540, "6283 more"),  # beyond: built for another tokenizer
])
def test_a_padded_vocabulary_is_accepted_a_larger_tokenizer_refused(gpt2_tok, model_vocab, refused):
    if refused is None:
        check_vocab_compatible(gpt2_tok, model_vocab)
    else:
        with pytest.raises(ValueError, match=refused):
            check_vocab_compatible(gpt2_tok, model_vocab)
