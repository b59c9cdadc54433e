"""repro's tensor-parallel layers against megatron-core's, the peer (Megatron-LM Sec. 3): the MLP of Fig. 3a, a
column-parallel linear, GeLU, a row-parallel linear, at tp 2 on real processes (gloo), with the same weight shards.
The output, the input's gradient and every weight's and bias's gradient are bit-identical: both split the same GEMMs
the same way and all-reduce the same partial sums."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from repro.dist import init_parallel, spawn
from repro.optional import available

HIDDEN, TOKENS = 16, 6


def _mlp(column, row, x: torch.Tensor) -> torch.Tensor:
    return row(F.gelu(column(x), approximate="tanh"))


def _rank(rank: int, world_size: int) -> list[str]:
    warnings.filterwarnings("ignore")
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear as McColumn, RowParallelLinear as McRow

    from repro.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    groups = init_parallel(tp=world_size)
    torch.manual_seed(0)
    ours = (ColumnParallelLinear(HIDDEN, 4 * HIDDEN, group=groups.tp),
            RowParallelLinear(4 * HIDDEN, HIDDEN, group=groups.tp))
    config = ModelParallelConfig(tensor_model_parallel_size=world_size, use_cpu_initialization=True)
    init = lambda w: torch.nn.init.normal_(w, std=0.02)  # noqa: E731
    theirs = (McColumn(HIDDEN, 4 * HIDDEN, config=config, init_method=init, bias=True, gather_output=False,
                       tp_group=groups.tp.process_group),
              McRow(4 * HIDDEN, HIDDEN, config=config, init_method=init, bias=True, input_is_parallel=True,
                    skip_bias_add=False, tp_group=groups.tp.process_group))
    with torch.no_grad():  # the same shards in both
        for mine, peer in zip(ours, theirs):
            peer.weight.copy_(mine.weight)
            peer.bias.copy_(mine.bias)
    x = torch.randn(TOKENS, 1, HIDDEN)  # megatron-core's [sequence, batch, hidden]
    results = {}
    for name, (column, row) in (("repro", ours), ("megatron_core", (lambda t: theirs[0](t)[0],
                                                                    lambda t: theirs[1](t)[0]))):
        xi = x.clone().requires_grad_(True)
        out = _mlp(column, row, xi)
        out.square().sum().backward()
        layers = ours if name == "repro" else theirs
        results[name] = [out.detach(), xi.grad] + [t for layer in layers for t in (layer.weight.grad, layer.bias.grad)]
    names = ["output", "input grad", "column weight grad", "column bias grad", "row weight grad", "row bias grad"]
    return [n for n, a, b in zip(names, results["repro"], results["megatron_core"]) if not torch.equal(a, b)]


@pytest.mark.skipif(not available("megatron.core"), reason="megatron-core is not installed (the peer)")
def test_the_mlp_is_bit_identical_to_megatron_core_at_tp2():
    differing = spawn(_rank, 2)
    assert differing == [[], []], differing
