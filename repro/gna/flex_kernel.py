"""Which FlexAttention kernel runs GNA on a GPU, and with what tile sizes: chosen per architecture and tile shape.

Flex's blocks are GNA's tiles (:mod:`repro.gna.flex`), and its Triton kernels walk a block in sub-tiles of
``BLOCK_M`` queries by ``BLOCK_N`` keys (forward; ``BLOCK_M1/N1/M2/N2`` backward), which must divide the block:
with inductor's defaults for a Hopper GPU (bf16, head_dim 128: 128 x 64 forward) a tile of 16 tokens failed to
compile ("Q and KV block size must be divisible by BLOCK_M and BLOCK_N", H200, torch 2.11). So the sub-tiles are
chosen here: the default of the GPU's architecture, dtype and head size (the numbers inductor's own heuristics use,
torch 2.11-2.13), halved until they divide the tile, never below 16 (the smallest ``tl.dot``). Every option is passed
explicitly and recorded in each result row (``flex_kernel``), so a row says what ran.

``BACKEND``: torch >= 2.9 offers a FlashAttention (CuTe DSL) backend for Flex on Hopper and newer when the
``flash_attn`` package is installed; it is used there for tiles of 128 tokens or more, the Triton kernel elsewhere.

Per GPU model, options measured fastest on it (:data:`MEASURED`, from the GPU probe's ``gna`` rows: ``python -m
repro.gpu_session --plan probe``) go on top of those defaults; every row names what ran (``flex_kernel``: the backend
and its options) and where the options came from (``flex_kernel_source``: inductor's defaults, or the measurement).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

#: forward (BLOCK_M, BLOCK_N) by (architecture class, 16-bit?, head_dim); inductor's defaults, (64, 64) elsewhere
_FORWARD = {
    ("sm90", True, 64): (128, 128), ("sm90", True, 128): (128, 64), ("sm90", True, 256): (64, 32),
    ("sm90", False, 64): (128, 32), ("sm90", False, 128): (32, 64), ("sm90", False, 192): (32, 64),
    ("sm90", False, 256): (32, 32),
    ("sm8x", True, 64): (128, 64), ("sm8x", True, 128): (128, 64), ("sm8x", True, 192): (128, 32),
    ("sm8x", True, 256): (32, 64),
    ("sm8x", False, 64): (128, 32), ("sm8x", False, 128): (128, 32), ("sm8x", False, 256): (64, 16),
}


def _backward(arch: str, head_dim: int, sixteen_bit: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2): inductor's defaults by architecture and head size."""
    if not sixteen_bit or arch == "other":
        return (16, 16, 16, 16)
    if arch == "sm90":
        return (64, 128, 128, 64) if 64 <= head_dim <= 128 else (64, 64, 64, 64)
    if arch == "sm10x":
        return (64, 128, 128, 64) if head_dim <= 128 else (64, 64, 64, 64)
    return (32, 128, 128, 32) if head_dim < 64 else (64, 64, 64, 64)


SMALLEST = 16

#: Triton options measured fastest per GPU model on GNA's paper shapes, applied on top of the defaults: (words that
#: must all appear in ``torch.cuda.get_device_name()``, options, the measurement: probe run and rows). A GPU model
#: enters this table from a probe's rows (variant ``fastest`` of section ``gna``), not from a guess; none has yet.
MEASURED: tuple[tuple[tuple[str, ...], dict, str], ...] = ()


def measured_options(device_name: str | None) -> tuple[dict, str] | None:
    """(options, source) measured for the GPU named ``device_name``, or None."""
    for words, options, source in MEASURED if device_name else ():
        if all(word.lower() in device_name.lower() for word in words):
            return dict(options), source
    return None


@dataclass(frozen=True)
class FlexKernel:
    """The kernel options passed to ``flex_attention`` (``options``), the backend they select, and where the options
    came from (``source``)."""

    backend: str
    options: dict
    source: str = "inductor's defaults"

    def describe(self) -> str:
        """One line for a result row, e.g. ``TRITON fwd_BLOCK_M=16 fwd_BLOCK_N=16 ...``."""
        return " ".join([self.backend] + [f"{k}={v}" for k, v in sorted(self.options.items()) if k != "BACKEND"])


def architecture(capability: tuple[int, int]) -> str:
    """The class inductor's Flex heuristics use: sm90 (Hopper), sm10x (Blackwell), sm8x (Ampere, Ada), other."""
    major, _ = capability
    if capability == (9, 0):
        return "sm90"
    if major >= 10:
        return "sm10x"
    if major >= 8:
        return "sm8x"
    return "other"


def fit(block: int, tile_tokens: int) -> int:
    """``block`` halved until it divides ``tile_tokens`` (not below :data:`SMALLEST`)."""
    while tile_tokens % block and block > SMALLEST:
        block //= 2
    return block


def flash_available(capability: tuple[int, int]) -> bool:
    """Whether this torch and machine offer Flex's FlashAttention backend (Hopper or newer, ``flash_attn``)."""
    from repro.optional import torch_version

    return (capability[0] >= 9 and torch_version() >= (2, 9)
            and importlib.util.find_spec("flash_attn") is not None)


def choose_flex_kernel(q_tile_tokens: int, kv_tile_tokens: int, *, capability: tuple[int, int], head_dim: int,
                       dtype: torch.dtype, device_name: str | None = None) -> FlexKernel:
    """Options for Flex over tiles of ``q_tile_tokens`` queries and ``kv_tile_tokens`` keys on a GPU of compute
    ``capability`` (named ``device_name``: its measured options apply, :data:`MEASURED`); one line (ValueError) when
    a tile holds no multiple of 16 tokens, which no Triton kernel takes."""
    for what, tokens in (("query", q_tile_tokens), ("key/value", kv_tile_tokens)):
        if tokens % SMALLEST:
            raise ValueError(f"{what} tiles of {tokens} tokens: Flex's GPU kernels need tiles of a multiple of "
                             f"{SMALLEST} tokens (choose tile shapes whose product is one)")
    if flash_available(capability) and q_tile_tokens % 128 == 0 and kv_tile_tokens % 128 == 0:
        return FlexKernel("FLASH", {"BACKEND": "FLASH"}, "the flash_attn package is importable")
    arch = architecture(capability)
    sixteen_bit = dtype in (torch.bfloat16, torch.float16)
    block_m, block_n = _FORWARD.get((arch, sixteen_bit, head_dim), (64, 64))
    m1, n1, m2, n2 = _backward(arch, head_dim, sixteen_bit)
    options = {
        "fwd_BLOCK_M": fit(block_m, q_tile_tokens), "fwd_BLOCK_N": fit(block_n, kv_tile_tokens),
        "bwd_BLOCK_M1": fit(m1, q_tile_tokens), "bwd_BLOCK_N1": fit(n1, kv_tile_tokens),
        "bwd_BLOCK_M2": fit(m2, q_tile_tokens), "bwd_BLOCK_N2": fit(n2, kv_tile_tokens),
    }
    # a sub-tile narrowed to fit gives 8 warps too little work each
    if (options["fwd_BLOCK_M"], options["fwd_BLOCK_N"]) != (block_m, block_n):
        options["fwd_num_warps"] = 4
    if (options["bwd_BLOCK_M1"], options["bwd_BLOCK_N1"], options["bwd_BLOCK_M2"], options["bwd_BLOCK_N2"]) != (
            m1, n1, m2, n2):
        options["bwd_num_warps"] = 4
    source = f"inductor's defaults for {arch}"
    measured = measured_options(device_name)
    if measured is not None:
        extra, source = measured
        for key, value in extra.items():  # a measured block size still has to divide the tiles
            tokens = q_tile_tokens if "BLOCK_M" in key else kv_tile_tokens
            options[key] = fit(value, tokens) if "BLOCK_" in key else value
    return FlexKernel("TRITON", options, source)


def kernel_for(q: torch.Tensor, block_mask) -> FlexKernel | None:
    """The choice for ``q`` ([B, H, L, D]) attending under ``block_mask`` (its BLOCK_SIZE is the tile sizes); None
    off a GPU, where Flex's CPU kernel takes no such options."""
    if q.device.type != "cuda":
        return None
    q_block, kv_block = block_mask.BLOCK_SIZE
    return choose_flex_kernel(q_block, kv_block, capability=torch.cuda.get_device_capability(q.device),
                              head_dim=q.shape[-1], dtype=q.dtype, device_name=torch.cuda.get_device_name(q.device))
