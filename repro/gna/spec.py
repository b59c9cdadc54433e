"""The GNA specification: window, stride, dilation and causality per dimension of the token grid.

Generalized Neighborhood Attention (GNA, Hassani et al. 2025, §3.1) gives every query a window of keys in a
multi-dimensional token grid (a 1-D sequence, a 2-D image, a 3-D video). Four parameters per dimension:

* ``window`` (NATTEN's kernel_size): how many keys a query sees along that dimension.
* ``stride``: queries are grouped into stride groups of ``stride`` consecutive tokens; the whole group shares the
  window of its *leader*. stride 1 is neighborhood attention (NA, a sliding window); stride == window is blocked
  attention (window self attention, WSA); anything between is GNA. Rule: ``1 <= stride <= window``.
* ``dilation``: the dimension is split into ``dilation`` interleaved groups (token x belongs to group x % dilation);
  attention stays inside a group, and inside it the rules above apply to the group's own coordinates x // dilation.
* ``causal``: a query only sees keys at or before itself along that dimension.

The semantics follow NATTEN (which the paper's kernels ship in):

* non-causal: the leader is the centre of the stride group (the right-hand centre for even strides), clamped to the
  last token of the (dilation) group. The window is centred on the leader, with ``window // 2`` keys to its left and
  ``(window - 1) // 2`` to its right (even windows lean left), and shifted inwards at the borders, so that every
  query sees exactly ``window`` keys per dimension.
* causal: the leader is the last query of the stride group (clamped likewise); a query sees the keys ``k`` with
  ``leader - window < k <= query``: the window ends at the query itself and reaches back ``window`` tokens from the
  group's leader.

The mask of a multi-dimensional grid is the AND of these 1-D rules over the dimensions; everything in this package
(the reference, the tile classification of the fast kernels, Flex's block mask and the simulator) is built from the
1-D functions here.

Tensor layout used by the whole package (NATTEN's "heads last" layout): ``[batch, *grid, heads, head_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch

IntOrTuple = int | Sequence[int]
BoolOrTuple = bool | Sequence[bool]


def _per_dim(value, ndim: int, name: str, kind: type) -> tuple:
    """Broadcast a scalar to ``ndim`` entries, or check that a sequence has exactly ``ndim`` entries."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return (value,) * ndim
    values = tuple(value)
    if len(values) != ndim:
        raise ValueError(f"{name}={values!r} has {len(values)} entries but the window has {ndim} dimensions")
    for v in values:
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise ValueError(f"{name}={values!r}: every entry must be {kind.__name__}, got {v!r}")
    return values


@dataclass(frozen=True)
class GNASpec:
    """GNA parameters, one entry per token-grid dimension (GNA §3.1). Scalars broadcast to every dimension of
    ``window``; ``GNASpec(window=(24, 48), stride=(8, 16))`` is a 2-D spec."""

    window: tuple[int, ...]
    stride: tuple[int, ...] | int = 1
    dilation: tuple[int, ...] | int = 1
    causal: tuple[bool, ...] | bool = False

    def __post_init__(self) -> None:
        window = (self.window,) if isinstance(self.window, int) else tuple(self.window)
        if not 1 <= len(window) <= 3:
            raise ValueError(f"window={window!r}: GNA is defined here for 1, 2 or 3 dimensions")
        window = _per_dim(window, len(window), "window", int)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "stride", _per_dim(self.stride, self.ndim, "stride", int))
        object.__setattr__(self, "dilation", _per_dim(self.dilation, self.ndim, "dilation", int))
        object.__setattr__(self, "causal", _per_dim(self.causal, self.ndim, "causal", bool))
        for dim in range(self.ndim):
            w, s, d = self.window[dim], self.stride[dim], self.dilation[dim]
            if w < 1:
                raise ValueError(f"window={self.window}: dimension {dim} has window {w}; the rule is window >= 1")
            if d < 1:
                raise ValueError(f"dilation={self.dilation}: dimension {dim} has {d}; the rule is dilation >= 1")
            if not 1 <= s <= w:
                raise ValueError(
                    f"stride={self.stride}, window={self.window}: dimension {dim} has stride {s}; "
                    f"the rule is 1 <= stride <= window ({w})"
                )

    @property
    def ndim(self) -> int:
        return len(self.window)

    def validate_grid(self, grid: Sequence[int]) -> tuple[int, ...]:
        """Check the spec against a token grid: one extent per dimension and ``window * dilation <= extent``
        (every dilation group must hold at least ``window`` tokens). Returns the grid as a tuple."""
        grid = tuple(int(n) for n in grid)
        if len(grid) != self.ndim:
            raise ValueError(f"token grid {grid} has {len(grid)} dimensions but the spec has {self.ndim}")
        for dim, (n, w, d) in enumerate(zip(grid, self.window, self.dilation)):
            if w * d > n:
                raise ValueError(
                    f"window={self.window}, dilation={self.dilation} do not fit the token grid {grid}: dimension "
                    f"{dim} needs window * dilation <= extent, got {w} * {d} = {w * d} > {n}"
                )
        return grid

    def is_self_attention(self, grid: Sequence[int]) -> bool:
        """True when every query sees every key (window == extent, no dilation, not causal)."""
        return all(w == n and d == 1 and not c for w, n, d, c in zip(self.window, grid, self.dilation, self.causal))


def dilation_group_size(extent: int, dilation: int, group: torch.Tensor | int) -> torch.Tensor | int:
    """Number of tokens of dilation group ``group`` (tokens x with x % dilation == group) in ``extent`` tokens."""
    return extent // dilation + (group < extent % dilation) * 1


def key_interval_1d(
    query: torch.Tensor, group_size: torch.Tensor | int, window: int, stride: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive key interval ``[first, last]`` of each query, in the coordinates of its dilation group (§3.1).

    ``query`` holds coordinates inside the dilation group (x // dilation), ``group_size`` the group's extent.
    """
    import torch  # here, not at the top: a spec is declared (repro list, Slurm's planning step) without torch

    if causal:
        leader = torch.minimum((query // stride) * stride + stride - 1, torch.as_tensor(group_size) - 1)
        first = (leader - window + 1).clamp(min=0)
        return first, query
    left, right = window // 2, (window - 1) // 2
    # Leader: centre of the stride group (right-hand centre for even strides), clamped to the group's last token.
    leader = torch.minimum((query // stride) * stride + stride // 2, torch.as_tensor(group_size) - 1)
    # Shift the window inwards at the borders so that it always holds `window` keys.
    centre = torch.minimum(leader.clamp(min=left), torch.as_tensor(group_size) - 1 - right)
    return centre - left, centre + right


def mask_1d(extent: int, window: int, stride: int = 1, dilation: int = 1, causal: bool = False) -> torch.Tensor:
    """The GNA mask of one dimension: ``mask[q, k]`` is True when query token q may attend to key token k.

    Dilation (§3.1) keeps attention inside a dilation group; inside it :func:`key_interval_1d` applies.
    Returns a bool tensor of shape [extent, extent].
    """
    import torch

    x = torch.arange(extent)
    group, inner = x % dilation, x // dilation
    first, last = key_interval_1d(inner, dilation_group_size(extent, dilation, group), window, stride, causal)
    same_group = group[:, None] == group[None, :]
    return same_group & (inner[None, :] >= first[:, None]) & (inner[None, :] <= last[:, None])


def masks_per_dim(grid: Sequence[int], spec: GNASpec) -> list[torch.Tensor]:
    """The 1-D masks of every dimension of ``grid`` (validated against ``spec``)."""
    grid = spec.validate_grid(grid)
    return [
        mask_1d(n, w, s, d, c) for n, w, s, d, c in zip(grid, spec.window, spec.stride, spec.dilation, spec.causal)
    ]
