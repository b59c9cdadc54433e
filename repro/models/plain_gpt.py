"""A plain single-device GPT (``nn.Linear``, fused SDPA attention, ``F.cross_entropy``): the speed reference.

The GPU experiments measure repro's tensor-parallel GPT against this model, compiled with ``torch.compile``, on the
same configuration, batch and precision in the same run (the 1-GPU baseline must reach >= 0.95x its
tokens/s). It has the same architecture and parameter count as :class:`repro.models.gpt.GPTModel` at tp=1 (pre-LN,
learned positions, tied output embedding, tanh-GeLU), and nothing parallel, so it is what a user would write for one
GPU. Not used for parity: :mod:`repro.models.reference` is the slow, obvious reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from repro.models.config import GPTConfig


class _Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.ln1, self.ln2 = nn.LayerNorm(h, eps=config.layernorm_epsilon), nn.LayerNorm(h, eps=config.layernorm_epsilon)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, config.ffn_size), nn.Linear(config.ffn_size, h)
        self.attention_dropout, self.hidden_dropout = config.attention_dropout, config.hidden_dropout
        self.approximate = config.gelu_approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, self.heads, 3, self.head_dim).unbind(3)
        context = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            dropout_p=self.attention_dropout if self.training else 0.0,
        )
        x = x + F.dropout(self.proj(context.transpose(1, 2).reshape(b, s, h)), self.hidden_dropout, self.training)
        mlp = self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.approximate))
        return x + F.dropout(mlp, self.hidden_dropout, self.training)


class PlainGPT(nn.Module):
    """``loss(input_ids, labels) -> mean token loss``; ``checkpointing`` recomputes each block in backward."""

    def __init__(self, config: GPTConfig, *, checkpointing: bool = False) -> None:
        super().__init__()
        self.config, self.checkpointing = config, checkpointing
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.dropout = config.hidden_dropout
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=config.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = F.dropout(self.wte(input_ids) + self.wpe(positions)[None], self.dropout, self.training)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing and self.training else block(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self(input_ids)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
