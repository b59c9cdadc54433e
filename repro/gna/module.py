"""Backend ladder and the ``nn.Module`` for 1/2/3-D (generalized) neighborhood attention layers.

Backends, all with the same semantics and the layout [batch, *grid, heads, head_dim]:

* ``reference``: dense masked attention (:mod:`repro.gna.reference`), the definition; small grids only.
* ``fast``: the tile-sparse CPU kernel with its own backward (:mod:`repro.gna.fast`).
* ``flex``: FlexAttention with a GNA block mask (:mod:`repro.gna.flex`); the choice on GPUs.

``auto`` picks ``flex`` for CUDA tensors and ``fast`` otherwise.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from repro.gna.fast import fast_attention
from repro.gna.flex import flex_gna
from repro.gna.reference import reference_attention
from repro.gna.spec import GNASpec

BACKENDS = ("auto", "reference", "fast", "flex")


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "flex" if device.type == "cuda" else "fast"
    return backend


def neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: GNASpec,
    *,
    backend: str = "auto",
    scale: float | None = None,
    q_tile: Sequence[int] | None = None,
    kv_tile: Sequence[int] | None = None,
) -> torch.Tensor:
    """GNA on [batch, *grid, heads, head_dim] tensors with the chosen backend."""
    backend = resolve_backend(backend, query.device)
    if backend == "reference":
        return reference_attention(query, key, value, spec, scale=scale)
    if backend == "fast":
        return fast_attention(query, key, value, spec, scale=scale, q_tile=q_tile, kv_tile=kv_tile)
    return flex_gna(query, key, value, spec, scale=scale, q_tile=q_tile, kv_tile=kv_tile)


class NeighborhoodAttention(nn.Module):
    """Multi-head (generalized) neighborhood attention over a 1/2/3-D token grid: x [B, *grid, C] -> [B, *grid, C].

    The number of grid dimensions is ``len(window)``; stride 1 gives NA, stride == window blocked attention, and
    anything between GNA (§3.1).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        window: int | Sequence[int],
        *,
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        causal: bool | Sequence[bool] = False,
        backend: str = "auto",
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        if hidden_size % num_heads != 0:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
        resolve_backend(backend, torch.device("cpu"))  # validate the name early
        self.spec = GNASpec(window=window, stride=stride, dilation=dilation, causal=causal)
        self.num_heads, self.head_dim, self.backend = num_heads, hidden_size // num_heads, backend
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=qkv_bias)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != self.spec.ndim + 2:
            raise ValueError(
                f"input has shape {tuple(x.shape)}; a {self.spec.ndim}-D layer expects [batch, *grid, hidden] "
                f"with {self.spec.ndim + 2} dimensions"
            )
        qkv = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim))  # [B, *grid, 3, H, Dh]
        query, key, value = qkv.unbind(dim=-3)
        out = neighborhood_attention(query, key, value, self.spec, backend=self.backend)
        return self.proj(out.flatten(-2))

    def extra_repr(self) -> str:
        return f"spec={self.spec}, heads={self.num_heads}, head_dim={self.head_dim}, backend={self.backend!r}"
