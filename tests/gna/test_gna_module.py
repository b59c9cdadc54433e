"""The NeighborhoodAttention layer (1/2/3-D) and the backend ladder: every backend gives the same layer output."""

from __future__ import annotations

import warnings

import pytest
import torch

from repro.gna import NeighborhoodAttention
from repro.gna.module import resolve_backend


@pytest.mark.parametrize(
    "grid, window, stride, dilation, causal",
    [
        ((20,), 5, 2, 2, True),
        ((9, 10), (3, 4), (2, 3), 1, (False, True)),
        ((4, 6, 5), (2, 3, 3), (1, 3, 2), (2, 1, 1), False),
    ],
)
def test_backends_agree_forward_and_backward(grid, window, stride, dilation, causal):
    torch.manual_seed(0)
    layer = NeighborhoodAttention(16, 2, window, stride=stride, dilation=dilation, causal=causal, backend="reference")
    x = torch.randn(2, *grid, 16, requires_grad=True)
    outputs, grads = {}, {}
    for backend in ("reference", "fast", "flex"):
        layer.backend = backend
        with warnings.catch_warnings(), torch.set_grad_enabled(backend != "flex"):
            warnings.simplefilter("ignore")
            out = layer(x)
        assert out.shape == x.shape
        outputs[backend] = out.detach()
        if backend != "flex":  # Flex is used for forward on CPU
            grads[backend] = torch.autograd.grad(out.square().sum(), (x, *layer.parameters()))
    torch.testing.assert_close(outputs["fast"], outputs["reference"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outputs["flex"], outputs["reference"], rtol=1e-5, atol=1e-5)
    names = ["input", *(name for name, _ in layer.named_parameters())]  # qkv and proj weights and biases
    assert len(names) == 5
    for name, fast, reference in zip(names, grads["fast"], grads["reference"]):
        torch.testing.assert_close(fast, reference, rtol=1e-4, atol=1e-5, msg=lambda m: f"gradient of {name}: {m}")


def test_layer_trains_the_projections():
    layer = NeighborhoodAttention(8, 2, (3, 3), stride=(2, 2))
    layer(torch.randn(1, 6, 6, 8)).sum().backward()
    assert layer.qkv.weight.grad is not None and layer.proj.weight.grad is not None


def test_layer_errors():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        NeighborhoodAttention(10, 3, 3)
    with pytest.raises(ValueError, match="not one of"):
        NeighborhoodAttention(8, 2, 3, backend="natten")
    with pytest.raises(ValueError, match=r"\[batch, \*grid, hidden\]"):
        NeighborhoodAttention(8, 2, (3, 3))(torch.randn(1, 6, 8))
    with pytest.raises(ValueError, match="window \\* dilation <= extent"):
        NeighborhoodAttention(8, 2, (7, 3))(torch.randn(1, 6, 6, 8))


def test_flex_on_cpu_is_forward_only():
    layer = NeighborhoodAttention(8, 2, (3, 3), backend="flex")
    with pytest.raises(ValueError, match="forward-only on CPU"):
        layer(torch.randn(1, 6, 6, 8))


def test_auto_backend():
    assert resolve_backend("auto", torch.device("cpu")) == "fast"
    assert resolve_backend("auto", torch.device("cuda")) == "flex"
