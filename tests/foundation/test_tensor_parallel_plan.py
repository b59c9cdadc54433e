"""The tensor-parallel step (:func:`repro.models.tensor_parallel_plan.apply_tensor_parallel`) splits, for GPT and
BERT, exactly the parameters Megatron's sec. 3 splits, and a rank's shard holds the slice of the weights the plain
model draws from the same seed, so the model is the same at every tp size. Built in one process: a rank of a
tensor-parallel group needs no other rank until its first forward."""

from __future__ import annotations

import pytest
import torch

from repro.dist.comm import CommGroup
from repro.models import GPTConfig, GPTModel
from repro.models.bert import BertModel
from repro.models.config import BertConfig
from repro.models.sharding import shard_state_dict, split_rule
from repro.models.tensor_parallel_plan import apply_tensor_parallel

GPT = GPTConfig(vocab_size=100, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16)
BERT = {placement: BertConfig(vocab_size=100, hidden_size=32, num_layers=2, num_attention_heads=4,
                              max_position_embeddings=16, layernorm_placement=placement)
        for placement in ("megatron", "original")}

#: Megatron-LM sec. 3, written out by hand: parameter-name suffix -> (split, dimension cut) (Fig. 3a: the MLP's A by
#: columns, B by rows; Fig. 3b: Q, K, V by heads, the output projection by rows; the input embedding and BERT's
#: output bias by vocabulary). Every other parameter is whole on every rank.
SEC3_SPLITS = {
    "attention.qkv.weight": ("column", 0), "attention.qkv.bias": ("column", 0), "attention.dense.weight": ("row", 1),
    "mlp.fc1.weight": ("column", 0), "mlp.fc1.bias": ("column", 0), "mlp.fc2.weight": ("row", 1),
    "embedding.word_embeddings.weight": ("vocab", 0), "lm_head.bias": ("vocab", 0),
}


def _group(rank: int, size: int) -> CommGroup:
    return CommGroup(name="tp", ranks=tuple(range(size)), rank=rank)


def _sec3(name: str) -> tuple[str, int] | None:
    rules = [rule for suffix, rule in SEC3_SPLITS.items() if name.endswith(suffix)]
    return rules[0] if rules else None


CASES = [("gpt", GPT, GPTModel), *((f"bert-{p}", config, BertModel) for p, config in BERT.items())]


@pytest.mark.parametrize("label, config, cls", CASES, ids=[c[0] for c in CASES])
def test_a_rank_holds_its_sec3_slice_of_the_plain_models_draws(label, config, cls):
    torch.manual_seed(11)
    plain = cls(config).state_dict()
    assert any(_sec3(name) is None for name in plain)  # layer norms, positions, biases after a reduction
    for name in plain:
        assert split_rule(name) == _sec3(name), name  # the table that cuts (and merges) checkpoints
    for tp in (2, 4):
        for rank in range(tp):
            torch.manual_seed(11)
            shard = cls(config, tp_group=_group(rank, tp)).state_dict()
            expected = shard_state_dict(plain, config, rank, tp)
            assert list(shard) == list(plain)  # the names, in order: the checkpoints' and the flat buffers' layout
            for name, tensor in shard.items():
                rule = _sec3(name)
                if rule is None:
                    assert tensor.shape == plain[name].shape, name
                elif rule[0] != "vocab":  # the vocabulary is padded to 128 x tp rows first
                    assert tensor.shape[rule[1]] * tp == plain[name].shape[rule[1]], (name, tp)
                assert torch.equal(tensor, expected[name]), (label, tp, rank, name)


def test_the_step_splits_a_model_built_on_the_meta_device_only():
    """Splitting a model whose weights are drawn would draw them twice (and differently): refused; its accepted
    neighbour, the meta model, is split in place, keeping every name."""
    with pytest.raises(ValueError, match="meta device"):
        apply_tensor_parallel(GPTModel(GPT), _group(0, 2))
    with torch.device("meta"):
        model = GPTModel(GPT)
    names = [name for name, _ in model.named_parameters()]
    apply_tensor_parallel(model, _group(1, 2))
    assert [name for name, _ in model.named_parameters()] == names and model.tp_group.size == 2
    assert model.layers[0].attention.heads_per_rank == GPT.num_attention_heads // 2
    assert model.embedding.word_embeddings.weight.shape[0] == GPT.padded_vocab_size(2) // 2
