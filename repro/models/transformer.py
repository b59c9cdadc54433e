"""The tensor-parallel transformer layer (Megatron-LM sec. 3, Fig. 3).

MLP: ``GeLU(X A) B`` with A column-parallel and B row-parallel: one all-reduce forward (g after B), one backward
(f before A). Self-attention: the Q, K, V projections are column-parallel *by heads*, so each rank runs attention on
its own heads with no communication, and the output projection is row-parallel: again one all-reduce each way.
A layer therefore costs exactly 2 all-reduces forward and 2 backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.dist.comm import CommGroup
from repro.models.config import TransformerConfig
from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from repro.tensor_parallel.layers import normal_init, scaled_normal_init


class ParallelSelfAttention(nn.Module):
    """Multi-head self-attention with heads split across the tensor-parallel group.

    ``qkv.weight`` rows are ordered (head, {q, k, v}, head_dim), so a contiguous column split hands each rank
    whole heads together with their q, k and v.
    """

    def __init__(self, config: TransformerConfig, *, group: CommGroup, causal: bool, rng_tracker=None) -> None:
        super().__init__()
        config.check_tensor_parallel(group.size)
        self.head_dim = config.head_dim
        self.causal = causal
        self.dropout_p = config.attention_dropout
        self.rng_tracker = rng_tracker
        h = config.hidden_size
        self.qkv = ColumnParallelLinear(h, 3 * h, group=group, init_method=normal_init(config.init_std))
        self.dense = RowParallelLinear(
            h, h, group=group, init_method=scaled_normal_init(config.init_std, config.num_layers)
        )

    @property
    def heads_per_rank(self) -> int:
        """The heads this rank holds: read off the QKV projection, which :func:`~repro.models.tensor_parallel_plan.
        apply_tensor_parallel` may have split since the layer was built."""
        return self.qkv.out_per_rank // (3 * self.head_dim)

    def reset_parameters(self) -> None:
        self.qkv.reset_parameters()
        self.dense.reset_parameters()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        dropout_p = self.dropout_p if self.training else 0.0
        # Dropout on split heads draws a different mask on every tp rank: the tracker's generator is swapped in
        # around attention (sec. 3). ``enter`` is ordered before the QKV matmul through the bias it copies, and
        # ``leave`` after attention through its output, so a compiled layer keeps the swap in its one graph.
        tracker = self.rng_tracker if dropout_p > 0 else None
        if tracker is not None and self.qkv.bias is None:
            x = tracker.enter(x)
        bias_through = tracker.enter if tracker is not None and self.qkv.bias is not None else None
        qkv = self.qkv(x, bias_through=bias_through).view(batch, seq, self.heads_per_rank, 3, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))  # [b, heads/tp, s, d]; backward: one stack
        mask = None
        if attention_mask is not None:  # [b, s] with 1 = attend; broadcast over heads and queries
            mask = attention_mask[:, None, None, :].to(torch.bool)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                 is_causal=self.causal and mask is None)
        if tracker is not None:
            tracker.leave(context)
        context = context.transpose(1, 2).reshape(batch, seq, self.heads_per_rank * self.head_dim)
        return self.dense(context)


class ParallelMLP(nn.Module):
    """``GeLU(X A) B``: A column-parallel (no communication), B row-parallel (g all-reduces)."""

    def __init__(self, config: TransformerConfig, *, group: CommGroup) -> None:
        super().__init__()
        config.check_tensor_parallel(group.size)
        self.approximate = config.gelu_approximate
        self.fc1 = ColumnParallelLinear(
            config.hidden_size, config.ffn_size, group=group, init_method=normal_init(config.init_std)
        )
        self.fc2 = RowParallelLinear(
            config.ffn_size, config.hidden_size, group=group,
            init_method=scaled_normal_init(config.init_std, config.num_layers),
        )

    def reset_parameters(self) -> None:
        self.fc1.reset_parameters()
        self.fc2.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class TransformerLayer(nn.Module):
    """One layer. ``pre_norm=True`` is GPT-2 / Megatron-BERT (LN inside the residual branch, paper Fig. 7b);
    ``pre_norm=False`` is the original BERT (LN after the residual sum, Fig. 7a). In the original placement
    ``input_layernorm`` normalises the attention block's sum and ``post_attention_layernorm`` the MLP block's."""

    def __init__(
        self, config: TransformerConfig, *, group: CommGroup, causal: bool, pre_norm: bool = True, rng_tracker=None
    ) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layernorm_epsilon
        self.pre_norm = pre_norm
        self.input_layernorm = nn.LayerNorm(h, eps=eps)
        self.attention = ParallelSelfAttention(config, group=group, causal=causal, rng_tracker=rng_tracker)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=eps)
        self.mlp = ParallelMLP(config, group=group)
        self.dropout = nn.Dropout(config.hidden_dropout)  # replicated region: same mask on every tp rank

    def reset_parameters(self) -> None:
        """Draw the weights again in the constructor's order (see :meth:`repro.models.gpt.GPTModel.init_weights`)."""
        for module in (self.input_layernorm, self.attention, self.post_attention_layernorm, self.mlp):
            module.reset_parameters()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attention(self.input_layernorm(x), attention_mask))
            return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))
        x = self.input_layernorm(x + self.dropout(self.attention(x, attention_mask)))
        return self.post_attention_layernorm(x + self.dropout(self.mlp(x)))
