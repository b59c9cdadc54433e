"""Single-process reference GPT and BERT: plain ``nn.Linear`` / ``nn.Embedding`` / ``F.cross_entropy``.

The obvious, slow-but-clear definition the tensor-parallel models are tested against. Parameter names and the QKV
row layout (head, {q,k,v}, head_dim) match the parallel models, and the word embedding has exactly ``vocab_size``
rows, so ``reference.state_dict()`` is the consolidated form :mod:`repro.models.sharding` shards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.models.config import BertConfig, GPTConfig, TransformerConfig


class _Attention(nn.Module):
    def __init__(self, config: TransformerConfig, causal: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads, self.head_dim, self.causal = config.num_attention_heads, config.head_dim, causal
        self.qkv, self.dense = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x, attention_mask=None):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads, 3, self.head_dim)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
        if self.causal:
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask[:, None, None, :].to(torch.bool), float("-inf"))
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
        return self.dense(context)


class _MLP(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_size)
        self.fc2 = nn.Linear(config.ffn_size, config.hidden_size)
        self.approximate = config.gelu_approximate

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class _Layer(nn.Module):
    def __init__(self, config: TransformerConfig, causal: bool, pre_norm: bool) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layernorm_epsilon
        self.pre_norm = pre_norm
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(h, eps=eps), nn.LayerNorm(h, eps=eps)
        self.attention, self.mlp = _Attention(config, causal), _MLP(config)

    def forward(self, x, attention_mask=None):
        if self.pre_norm:
            x = x + self.attention(self.input_layernorm(x), attention_mask)
            return x + self.mlp(self.post_attention_layernorm(x))
        x = self.input_layernorm(x + self.attention(x, attention_mask))
        return self.post_attention_layernorm(x + self.mlp(x))


class _Embedding(nn.Module):
    def __init__(self, config: TransformerConfig, num_tokentypes: int = 0) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.tokentype_embeddings = nn.Embedding(num_tokentypes, config.hidden_size) if num_tokentypes else None

    def forward(self, input_ids, token_type_ids=None):
        x = self.word_embeddings(input_ids) + self.position_embeddings(torch.arange(input_ids.shape[1]))[None]
        if self.tokentype_embeddings is not None:
            x = x + self.tokentype_embeddings(
                token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            )
        return x


class ReferenceGPT(nn.Module):
    """Dropout-free GPT-2 (pre-LN, tied embeddings) for parity tests."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = _Embedding(config)
        self.layers = nn.ModuleList(_Layer(config, True, True) for _ in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)

    def forward(self, input_ids):
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x) @ self.embedding.word_embeddings.weight.T  # [b, s, vocab_size]

    def loss(self, input_ids, labels):
        logits = self(input_ids)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)


class ReferenceBert(nn.Module):
    """Dropout-free BERT with either layer-norm placement, for parity tests."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        pre_norm = config.layernorm_placement == "megatron"
        h, eps = config.hidden_size, config.layernorm_epsilon
        self.embedding = _Embedding(config, config.num_tokentypes)
        self.embedding_layernorm = None if pre_norm else nn.LayerNorm(h, eps=eps)
        self.layers = nn.ModuleList(_Layer(config, False, pre_norm) for _ in range(config.num_layers))
        self.final_layernorm = nn.LayerNorm(h, eps=eps) if pre_norm else None
        self.pooler = nn.Linear(h, h)
        self.lm_head = nn.Module()
        self.lm_head.dense, self.lm_head.layernorm = nn.Linear(h, h), nn.LayerNorm(h, eps=eps)
        self.lm_head.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.binary_head = nn.Linear(h, 2)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        x = self.embedding(input_ids, token_type_ids)
        if self.embedding_layernorm is not None:
            x = self.embedding_layernorm(x)
        for layer in self.layers:
            x = layer(x, attention_mask)
        if self.final_layernorm is not None:
            x = self.final_layernorm(x)
        return x, torch.tanh(self.pooler(x[:, 0]))

    def lm_logits(self, sequence_output):
        x = self.lm_head.layernorm(F.gelu(self.lm_head.dense(sequence_output), approximate=self.config.gelu_approximate))
        return x @ self.embedding.word_embeddings.weight.T + self.lm_head.bias
