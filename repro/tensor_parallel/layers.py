"""Column- and row-parallel linear layers (Megatron-LM sec. 3, Fig. 3a).

For ``Y = X A`` with ``A`` split by columns, ``A = [A_1, ..., A_p]``, rank i computes ``Y_i = f(X) A_i``: no
communication forward, an all-reduce of dX backward (inside f). For ``Z = Y B`` with ``B`` split by rows, rank i
computes ``Y_i B_i`` and ``g`` sums the partial products. An MLP ``GeLU(X A) B`` therefore needs one all-reduce
forward and one backward.

Weights are stored as ``nn.Linear`` does, ``[out_features, in_features]``; a column split divides ``out``, a row split
divides ``in``. Each layer initialises the *full* matrix from the (replicated) default generator and keeps its
slice, so a model has the same weights at every tensor-parallel size (Megatron's CPU initialisation).

These are the plain, sequential layers. Variants that overlap communication with computation (Megatron's
asynchronous dX all-reduce, T3's chunked overlap, sequence parallelism) are separate classes in ``repro.overlap``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from repro.dist.comm import CommGroup
from repro.tensor_parallel.mappings import (
    copy_to_tensor_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    scatter_to_tensor_parallel,
)

InitMethod = Callable[[torch.Tensor], torch.Tensor]


#: Maps a bias to the tensor a layer adds (see :meth:`ColumnParallelLinear.bias_for`).
BiasThrough = Callable[[torch.Tensor], torch.Tensor]


def normal_init(std: float) -> InitMethod:
    """Draws N(0, std^2) in place. A tensor on the meta device (a model is built there before its weights are
    drawn, :func:`repro.training.parallelize.materialize`) has no values to draw and is returned as it is: newer
    torch runs ``normal_`` on meta tensors through a Python reference that imports torch._dynamo on its first call,
    about 2 s of CPU in every fresh process that builds a model, and draws nothing from any generator either way."""
    def init(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_meta else nn.init.normal_(tensor, mean=0.0, std=std)
    return init


def scaled_normal_init(std: float, num_layers: int) -> InitMethod:
    """GPT-2 / Megatron: output projections scaled by 1/sqrt(2 * num_layers)."""
    return normal_init(std / math.sqrt(2.0 * num_layers))


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{what}={numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def group_or_single(group: CommGroup | None) -> CommGroup:
    return group if group is not None else CommGroup.single("tp")


def init_shard(full_shape: tuple[int, int], shard: slice, dim: int, init_method: InitMethod,
               device: torch.device) -> torch.Tensor:
    """The slice ``shard`` of dimension ``dim`` of the full matrix, drawn in fp32 on ``device`` (whose generator it
    uses): copied into a 16-bit parameter, it holds the values an fp32 build cast to 16 bits would."""
    full = torch.empty(full_shape, dtype=torch.float32, device=device)
    init_method(full)
    return full.narrow(dim, shard.start, shard.stop - shard.start)


class ColumnParallelLinear(nn.Module):
    """``Y_i = f(X) A_i^T + b_i``: the output features are split across the tensor-parallel group."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        group: CommGroup | None = None,
        bias: bool = True,
        gather_output: bool = False,
        init_method: InitMethod = normal_init(0.02),
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.group = group_or_single(group)
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = divide(out_features, self.group.size, "output features")
        self.gather_output = gather_output
        self.init_method = init_method
        dtype = dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(self.out_per_rank, dtype=dtype)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """This rank's rows of the full matrix drawn with ``init_method`` (the same draws at every tp size); bias 0."""
        start = self.group.rank * self.out_per_rank
        rows = slice(start, start + self.out_per_rank)
        self.weight.copy_(init_shard((self.out_features, self.in_features), rows, 0, self.init_method,
                                     self.weight.device))
        if self.bias is not None:
            self.bias.zero_()

    def bias_for(self, bias_through: BiasThrough | None) -> torch.Tensor | None:
        """The bias to add: ``bias_through(bias)`` when given (the same values; a caller that must order this matmul
        after an operation passes that operation's ordering, ``RNGTracker.enter``), else the bias itself."""
        return self.bias if bias_through is None or self.bias is None else bias_through(self.bias)

    def forward(self, x: torch.Tensor, *, bias_through: BiasThrough | None = None) -> torch.Tensor:
        x = copy_to_tensor_parallel(x, self.group)  # f
        y = F.linear(x, self.weight, self.bias_for(bias_through))  # [..., out/tp]
        return gather_from_tensor_parallel(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features} (/{self.group.size}), gather={self.gather_output}"


class RowParallelLinear(nn.Module):
    """``Z = g(sum_i Y_i B_i^T) + b``: the input features are split; partial products are all-reduced."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        group: CommGroup | None = None,
        bias: bool = True,
        input_is_parallel: bool = True,
        init_method: InitMethod = normal_init(0.02),
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.group = group_or_single(group)
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = divide(in_features, self.group.size, "input features")
        self.input_is_parallel = input_is_parallel
        self.init_method = init_method
        dtype = dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype))
        # The bias is replicated and added after the reduction, so it is counted once.
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """This rank's columns of the full matrix drawn with ``init_method``; bias 0."""
        start = self.group.rank * self.in_per_rank
        cols = slice(start, start + self.in_per_rank)
        self.weight.copy_(init_shard((self.out_features, self.in_features), cols, 1, self.init_method,
                                     self.weight.device))
        if self.bias is not None:
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel(x, self.group)
        partial = F.linear(x, self.weight)  # [..., out], this rank's partial sum
        z = reduce_from_tensor_parallel(partial, self.group)  # g
        return z + self.bias if self.bias is not None else z

    def extra_repr(self) -> str:
        return f"in={self.in_features} (/{self.group.size}), out={self.out_features}"
