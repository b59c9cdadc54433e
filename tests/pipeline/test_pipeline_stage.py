"""GPT split into stages (the trainer's pipeline step), in one process: the chained stages are the whole model
(and the reference)."""

import pytest
import torch

from repro.models import GPTConfig, GPTModel, ReferenceGPT
from repro.pipeline.stage import OUTPUT_EMBEDDING, cut_to_stage, stage_state_dict
from repro.testing import assert_rel_close

CONFIG = GPTConfig(vocab_size=50, hidden_size=16, num_layers=4, num_attention_heads=4, max_position_embeddings=12,
                   hidden_dropout=0.0, attention_dropout=0.0)


def GPTStage(config, *, pp_rank, pp_size, seed=0):  # noqa: N802 - the trainer's stage, built as it builds it
    with torch.device("meta"):
        model = GPTModel(config)
    cut_to_stage(model, pp_rank=pp_rank, pp_size=pp_size)
    model.to_empty(device="cpu")
    model.init_weights(seed)
    return model


def _chain(stages, ids, labels):
    x = ids
    for stage in stages:
        x = stage.hidden_states(x)
    return stages[-1].output_loss(x, labels)


def _data(seed=1, batch=3, seq=10):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(CONFIG.vocab_size, (batch, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


@pytest.mark.parametrize("pp_size", [1, 2, 4])
def test_stages_hold_their_share(pp_size):
    stages = [GPTStage(CONFIG, pp_rank=r, pp_size=pp_size, seed=3) for r in range(pp_size)]
    assert [len(s.layers) for s in stages] == [CONFIG.num_layers // pp_size] * pp_size
    assert stages[0].embedding is not None and all(s.embedding is None for s in stages[1:])
    assert stages[-1].final_layernorm is not None and all(s.final_layernorm is None for s in stages[:-1])
    assert (stages[-1].output_word_embeddings is None) == (pp_size == 1)
    # the last stage's copy of the tied embedding starts equal to the first stage's word embedding
    assert torch.equal(stages[-1].tied_embedding().weight, stages[0].embedding.word_embeddings.weight)


def test_pp_layouts_build_the_same_model():
    ids, labels = _data()
    losses = [_chain([GPTStage(CONFIG, pp_rank=r, pp_size=p, seed=7) for r in range(p)], ids, labels)
              for p in (1, 2, 4)]
    assert torch.equal(losses[0], losses[1]) and torch.equal(losses[0], losses[2])


@pytest.mark.parametrize("pp_size", [1, 2, 4])
def test_chained_stages_match_reference_gpt(pp_size):
    torch.manual_seed(0)
    ref = ReferenceGPT(CONFIG)
    full = ref.state_dict()
    stages = [GPTStage(CONFIG, pp_rank=r, pp_size=pp_size) for r in range(pp_size)]
    for rank, stage in enumerate(stages):
        stage.load_state_dict(stage_state_dict(full, CONFIG, pp_rank=rank, pp_size=pp_size))
    ids, labels = _data()
    loss = _chain(stages, ids, labels)
    expected = ref.loss(ids, labels)
    assert_rel_close(loss, expected, 1e-5, "per-token loss")
    loss.mean().backward()
    expected.mean().backward()
    for stage in stages:
        for name, p in stage.named_parameters():
            if name == OUTPUT_EMBEDDING:
                continue
            ref_name = name
            if name.startswith("layers."):
                _, index, rest = name.split(".", 2)
                ref_name = f"layers.{int(index) + stage.layer_indices.start}.{rest}"
            ref_grad = ref.get_parameter(ref_name).grad
            grad = p.grad[: CONFIG.vocab_size] if "word_embeddings" in name else p.grad
            if pp_size == 1 or "word_embeddings" not in name:
                assert_rel_close(grad, ref_grad, 1e-5, name)
    if pp_size > 1:  # the tied gradient is the sum of the first stage's (input) and last stage's (output) parts
        tied = stages[0].embedding.word_embeddings.weight.grad + stages[-1].output_word_embeddings.weight.grad
        assert_rel_close(tied[: CONFIG.vocab_size], ref.embedding.word_embeddings.weight.grad, 1e-5, "tied")


def test_stage_state_dict_names_and_tp_shards():
    torch.manual_seed(0)
    full = ReferenceGPT(CONFIG).state_dict()
    last = stage_state_dict(full, CONFIG, pp_rank=1, pp_size=2, tp_rank=1, tp_size=2)
    assert sorted(k for k in last if not k.startswith("layers.")) == [
        "final_layernorm.bias", "final_layernorm.weight", OUTPUT_EMBEDDING]
    padded = CONFIG.padded_vocab_size(2)
    assert last[OUTPUT_EMBEDDING].shape == (padded // 2, CONFIG.hidden_size)
    assert torch.equal(last["layers.0.mlp.fc1.weight"], full["layers.2.mlp.fc1.weight"].chunk(2, 0)[1])
    first = stage_state_dict(full, CONFIG, pp_rank=0, pp_size=2)
    assert "embedding.position_embeddings.weight" in first and "final_layernorm.weight" not in first
    with pytest.raises(ValueError, match="not divisible by the pipeline-parallel size pp=3"):
        stage_state_dict(full, CONFIG, pp_rank=0, pp_size=3)


def test_middle_stage_has_no_output_layer():
    stage = GPTStage(CONFIG, pp_rank=1, pp_size=4)
    assert not stage.is_first and not stage.is_last and stage.tied_embedding() is None
    with pytest.raises(RuntimeError, match="only the last pipeline stage"):
        stage.logits(torch.zeros(1, 2, CONFIG.hidden_size))


def test_a_stage_is_cut_before_its_weights_are_drawn():
    """Cutting a built model would draw the weights of blocks the stage drops (and change the seeded numbers): the
    step takes a meta model only; its accepted neighbour (meta) is every other test here."""
    with pytest.raises(ValueError, match="meta device"):
        cut_to_stage(GPTModel(CONFIG), pp_rank=0, pp_size=2)


def test_a_seeded_stage_of_one_draws_each_block_from_its_own_seed():
    """``init_weights(seed)``: the embedding from ``seed``, layer ``l`` from ``seed + 1 + l`` (the rule that makes
    every pipeline layout the same model), computed here by hand from the plain constructor's draws."""
    stage = GPTStage(CONFIG, pp_rank=1, pp_size=2, seed=5)
    for local, index in enumerate(range(2, 4)):
        torch.manual_seed(5 + 1 + index)
        with torch.device("meta"):
            alone = GPTModel(CONFIG)
        layer = alone.layers[0].to_empty(device="cpu")
        layer.reset_parameters()
        assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(),
                                                      stage.layers[local].state_dict().values()))
    torch.manual_seed(5)
    first_draws = GPTModel(CONFIG).embedding.word_embeddings.weight  # the first block an ordinary build draws
    assert torch.equal(stage.output_word_embeddings.weight, first_draws)


#: a layer's parameters in the order the checkpoints of ``repro train`` hold them (and the flat buffers lay them out)
LAYER = ["input_layernorm.weight", "input_layernorm.bias", "attention.qkv.weight", "attention.qkv.bias",
         "attention.dense.weight", "attention.dense.bias", "post_attention_layernorm.weight",
         "post_attention_layernorm.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]


@pytest.mark.parametrize("pp_size", [1, 2])
def test_stage_names_are_those_of_the_checkpoints_written_before(pp_size):
    """The names, in order, that checkpoints written by the earlier stage class carry, written out by hand: a
    checkpoint from before the model became one module with steps applied still loads, into the same slots."""
    layers = CONFIG.num_layers // pp_size
    first = ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight"]
    last = ["final_layernorm.weight", "final_layernorm.bias"] + ([OUTPUT_EMBEDDING] if pp_size > 1 else [])
    body = [f"layers.{i}.{name}" for i in range(layers) for name in LAYER]
    expected = [first + body + last] if pp_size == 1 else [first + body, body + last]
    assert [list(GPTStage(CONFIG, pp_rank=r, pp_size=pp_size).state_dict()) for r in range(pp_size)] == expected
