"""Closed-form parameter counts, as the papers count them.

GPT (Megatron Table 1 and 2): each layer holds QKV (3h^2 + 3h), the output projection (h^2 + h), the MLP
(2 h f + f + h) and two layer norms (4h); with f = 4h that is 12h^2 + 13h. Plus the padded word embedding
(V_p h, tied with the output layer), positions (s h) and the final layer norm (2h):

    P_GPT = L (12 h^2 + 13 h) + (V_p + s) h + 2 h

BERT (Table 4) adds token types (2h), the pooler (h^2 + h), the LM head (h^2 + h + 2h + V_p), the binary head
(2h + 2), and one layer norm (on the embeddings for the original placement, at the end for Megatron's).
"""

from __future__ import annotations

from repro.models.config import BertConfig, GPTConfig, TransformerConfig


def layer_parameters(config: TransformerConfig) -> int:
    h, f = config.hidden_size, config.ffn_size
    return (3 * h * h + 3 * h) + (h * h + h) + (2 * h * f + f + h) + 4 * h


def count_parameters(config: TransformerConfig, tp_size: int = 1) -> int:
    """Total parameters of the (unsharded) model with the vocabulary padded for ``tp_size``."""
    h, vocab = config.hidden_size, config.padded_vocab_size(tp_size)
    total = config.num_layers * layer_parameters(config) + (vocab + config.max_position_embeddings) * h + 2 * h
    if isinstance(config, BertConfig):
        total += config.num_tokentypes * h  # token-type embeddings
        total += h * h + h  # pooler
        total += (h * h + h) + 2 * h + vocab  # LM head: dense, layer norm, output bias
        total += 2 * h + 2  # binary head
    elif not isinstance(config, GPTConfig):
        raise TypeError(f"count_parameters does not know {type(config).__name__}")
    return total


def count_model_parameters(model) -> int:
    """Parameters actually instantiated (one rank's shard when tensor-parallel)."""
    return sum(p.numel() for p in model.parameters())
