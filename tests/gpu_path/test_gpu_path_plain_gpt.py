"""repro.models.plain_gpt.PlainGPT, the speed reference of the GPU experiments, computes the same model as repro's
GPTModel at tp=1: the same parameters (one to one, by name mapping), the same loss and the same gradients."""

from __future__ import annotations

import pytest
import torch

from repro.models import GPTConfig
from repro.models.gpt import GPTModel
from repro.models.params import count_parameters
from repro.models.plain_gpt import PlainGPT


def _config(vocab=256, **kw):
    return GPTConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_attention_heads=4, max_position_embeddings=32,
                     hidden_dropout=0.0, attention_dropout=0.0, **kw)


#: PlainGPT name -> GPTModel name (per block i: blocks.i.X -> layers.i.Y).
BLOCK_NAMES = {"ln1": "input_layernorm", "qkv": "attention.qkv", "proj": "attention.dense",
               "ln2": "post_attention_layernorm", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def repro_name(plain_name: str) -> str:
    if plain_name == "wte.weight":
        return "embedding.word_embeddings.weight"
    if plain_name == "wpe.weight":
        return "embedding.position_embeddings.weight"
    if plain_name.startswith("ln_f."):
        return "final_layernorm." + plain_name.split(".", 1)[1]
    _, index, module, leaf = plain_name.split(".")
    return f"layers.{index}.{BLOCK_NAMES[module]}.{leaf}"


def _pair(config, device="cpu"):
    torch.manual_seed(0)
    repro = GPTModel(config).to(device)
    plain = PlainGPT(config).to(device)
    source = dict(repro.named_parameters())
    with torch.no_grad():
        for name, param in plain.named_parameters():
            weight = source[repro_name(name)]
            if name == "wte.weight":
                weight = weight[: config.vocab_size]  # GPTModel's rows beyond the vocabulary are padding
            assert param.shape == weight.shape, name
            param.copy_(weight)
    return repro, plain


def _tokens(config, device, b=2, s=32):
    generator = torch.Generator().manual_seed(1)
    batch = torch.randint(0, config.vocab_size, (b, s + 1), generator=generator).to(device)
    return batch[:, :-1], batch[:, 1:]


def test_names_map_one_to_one():
    config = _config()
    plain = [n for n, _ in PlainGPT(config).named_parameters()]
    repro = {n for n, _ in GPTModel(config).named_parameters()}
    mapped = [repro_name(n) for n in plain]
    assert len(set(mapped)) == len(mapped) and set(mapped) == repro


def test_same_parameter_count_as_gptmodel_at_tp1():
    config = _config(vocab=256)  # a multiple of 128: GPTModel pads nothing
    n_plain = sum(p.numel() for p in PlainGPT(config).parameters())
    n_repro = sum(p.numel() for p in GPTModel(config).parameters())
    assert n_plain == n_repro == count_parameters(config)


def test_parameter_count_differs_only_by_vocabulary_padding():
    config = _config(vocab=96)  # GPTModel pads 96 -> 128 rows (Megatron's 128 x tp rule); PlainGPT does not
    n_plain = sum(p.numel() for p in PlainGPT(config).parameters())
    n_repro = sum(p.numel() for p in GPTModel(config).parameters())
    assert n_repro - n_plain == (128 - 96) * config.hidden_size


@pytest.mark.parametrize("vocab", [256, 96])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_same_weights_give_the_same_loss_and_gradients(device, vocab, checkpointing):
    config = _config(vocab=vocab)
    repro, plain = _pair(config, device)
    plain.checkpointing = checkpointing
    ids, labels = _tokens(config, device)
    repro.train(), plain.train()
    loss_repro = repro.loss(ids, labels).mean()  # mean per-token loss
    loss_plain = plain.loss(ids, labels)
    assert abs(loss_plain.item() - loss_repro.item()) <= 1e-5, (loss_plain.item(), loss_repro.item())
    loss_repro.backward()
    loss_plain.backward()
    grads = dict(repro.named_parameters())
    for name, param in plain.named_parameters():
        expected = grads[repro_name(name)].grad
        if name == "wte.weight":
            expected = expected[:vocab]
        error = float((param.grad - expected).norm() / expected.norm())
        assert error <= 1e-5, f"{name}: relative gradient error {error:.1e}"


def test_logits_agree_on_the_real_vocabulary(device):
    config = _config(vocab=96)
    repro, plain = _pair(config, device)
    repro.eval(), plain.eval()
    ids, _ = _tokens(config, device)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids), repro.full_logits(ids), rtol=1e-5, atol=1e-5)
