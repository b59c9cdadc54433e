"""The kernels of one GPT training iteration on one tensor-parallel rank, as data (flops, bytes, launches).

This is the op list of the Megatron-LM GPT-2 layer (Megatron-LM sec 3, Fig. 3) partitioned ``t``-way: column-
parallel QKV and FC1, row-parallel projection and FC2, heads split across ranks; layer norms, bias-dropout-residual
and the residual stream are *duplicated* on every rank (they are not partitioned in Megatron-LM).

Byte counts are for 16-bit activations (2 bytes/element, dropout masks 1 byte) and count each unfused PyTorch
kernel's reads and writes once, as in the 2019 implementation (unfused scale, mask, softmax, dropout). Backward
element-wise kernels are charged ``BACKWARD_ELEMENTWISE_FACTOR`` x their forward bytes (read the saved input and
the incoming gradient, write the outgoing gradient). These byte counts are assumptions of the model, documented
here so they can be changed in one place; nothing in this file is fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES = 2  # fp16 / bf16 activations
BACKWARD_ELEMENTWISE_FACTOR = 2.0


@dataclass(frozen=True)
class Op:
    """One kernel (or a few identical ones): ``kind`` is "gemm" (compute-bound candidate) or "elementwise"."""

    name: str
    kind: str
    flops: float
    bytes: float
    launches: int = 1
    gemm_shape: tuple[int, int, int, int] | None = None  # (m, n, k, batch) of a GEMM's output tiling
    random_elements: float = 0.0  # random numbers drawn (dropout masks); costly on CPUs, ~free on GPUs
    math_elements: float = 0.0  # elements of a transcendental function (erf, exp); costly on CPUs
    backward_math: bool = False  # the backward kernel evaluates the function again (GELU) or not (softmax)


def gemm(name: str, *, m: int, n: int, k: int, batch: int = 1, dtype_bytes: int = BYTES) -> Op:
    """``batch`` GEMMs of ``[m x k] @ [k x n]``: ``2 m n k`` FLOPs, inputs and output read/written once."""
    return Op(name, "gemm", 2.0 * batch * m * n * k, float(dtype_bytes * batch * (m * k + k * n + m * n)),
              gemm_shape=(m, n, k, batch))


_gemm = gemm


def elementwise(name: str, *, elements: float, bytes_per_element: float, launches: int = 1,
                random: bool = False, math: bool = False, backward_math: bool = False) -> Op:
    """A memory-bound kernel; ``random`` marks a dropout that draws one random number per element, ``math`` a
    transcendental function of every element (GELU, softmax's exp), ``backward_math`` one whose backward
    evaluates it again (GELU's derivative needs erf and exp)."""
    return Op(name, "elementwise", 0.0, float(elements * bytes_per_element), launches,
              random_elements=float(elements) if random else 0.0, math_elements=float(elements) if math else 0.0,
              backward_math=backward_math)


@dataclass(frozen=True)
class LayerShape:
    """Shapes of one transformer layer on one tensor-parallel rank."""

    micro_batch_size: int
    seq_length: int
    hidden_size: int
    num_heads: int
    tp_size: int = 1
    dtype_bytes: int = BYTES  # 2 for fp16/bf16 on GPUs, 4 for fp32 on CPUs
    fused_attention: bool = False  # one fused softmax(+dropout) pass (SDPA) instead of the 2019 unfused kernels
    dropout: bool = True  # attention and hidden dropout active (draws random masks)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}")
        if self.num_heads % self.tp_size:
            raise ValueError(f"num_heads {self.num_heads} must be divisible by tp_size {self.tp_size}")


def layer_forward_ops(shape: LayerShape) -> list[Op]:
    """Forward kernels of one GPT-2 layer on one tensor-parallel rank (Megatron-LM Fig. 3)."""
    b, s, h, t = shape.micro_batch_size, shape.seq_length, shape.hidden_size, shape.tp_size
    heads_per_rank = shape.num_heads // t
    head_dim = h // shape.num_heads
    tokens = b * s
    h_rank = h // t
    scores = b * heads_per_rank * s * s
    e = shape.dtype_bytes
    rand = shape.dropout

    def gemm(name: str, **dims: int) -> Op:
        return _gemm(name, dtype_bytes=e, **dims)

    return [
        elementwise("layernorm_1 (dup)", elements=tokens * h, bytes_per_element=2 * e),
        gemm("qkv (column-parallel)", m=tokens, n=3 * h_rank, k=h),
        elementwise("split/transpose q,k,v", elements=3 * tokens * h_rank, bytes_per_element=2 * e, launches=3),
        gemm("attention scores q k^T", m=s, n=s, k=head_dim, batch=b * heads_per_rank),
        # unfused 2019 attention: scale, mask (multiply + subtract), softmax: 4 read+write passes, then dropout
        *([elementwise("fused scale+mask+softmax+dropout", elements=scores, bytes_per_element=2 * e, random=rand,
                       math=True)]
          if shape.fused_attention else
          [elementwise("scale+mask+softmax", elements=scores, bytes_per_element=4 * 2 * e, launches=4, math=True),
           elementwise("attention dropout", elements=scores, bytes_per_element=2 * e + 1, random=rand)]),
        gemm("attention context p v", m=s, n=head_dim, k=s, batch=b * heads_per_rank),
        elementwise("context transpose", elements=tokens * h_rank, bytes_per_element=2 * e),
        gemm("projection (row-parallel)", m=tokens, n=h, k=h_rank),
        # bias add (r+w), dropout (r+w+mask), residual add (2r+w), duplicated on every rank
        elementwise("bias+dropout+residual 1 (dup)", elements=tokens * h, bytes_per_element=7 * e + 1,
                    launches=3, random=rand),
        elementwise("layernorm_2 (dup)", elements=tokens * h, bytes_per_element=2 * e),
        gemm("fc1 (column-parallel)", m=tokens, n=4 * h_rank, k=h),
        elementwise("gelu", elements=4 * tokens * h_rank, bytes_per_element=2 * e, math=True, backward_math=True),
        gemm("fc2 (row-parallel)", m=tokens, n=h, k=4 * h_rank),
        elementwise("bias+dropout+residual 2 (dup)", elements=tokens * h, bytes_per_element=7 * e + 1,
                    launches=3, random=rand),
    ]


def backward_ops(forward: list[Op]) -> list[Op]:
    """Backward kernels: each GEMM ``[m x k] @ [k x n]`` becomes a data-gradient ``[m x n] @ [n x k]`` and a
    weight-gradient ``[k x m] @ [m x n]`` GEMM of equal FLOPs; each element-wise kernel costs
    ``BACKWARD_ELEMENTWISE_FACTOR`` x its forward bytes."""
    ops: list[Op] = []
    for op in forward:
        if op.kind == "gemm" and op.gemm_shape is not None:
            m, n, k, batch = op.gemm_shape
            ops.append(Op(op.name + " dgrad", "gemm", op.flops, op.bytes, op.launches, (m, k, n, batch)))
            ops.append(Op(op.name + " wgrad", "gemm", op.flops, op.bytes, op.launches, (k, n, m, batch)))
        else:
            ops.append(Op(op.name + " bwd", "elementwise", 0.0, op.bytes * BACKWARD_ELEMENTWISE_FACTOR,
                          op.launches, math_elements=op.math_elements if op.backward_math else 0.0))
    return ops


def layer_iteration_ops(shape: LayerShape, *, activation_recompute: bool = True) -> list[Op]:
    """All kernels one layer runs per micro-batch: forward, recomputed forward (checkpointing), backward."""
    forward = layer_forward_ops(shape)
    passes = forward * (2 if activation_recompute else 1)
    return passes + backward_ops(forward)


def head_iteration_ops(*, micro_batch_size: int, seq_length: int, hidden_size: int, vocab_size: int,
                       tp_size: int = 1, dtype_bytes: int = BYTES) -> list[Op]:
    """Embedding, final layer norm, vocab-parallel logits and cross-entropy (Megatron-LM sec 3, last para.):
    forward and backward, per micro-batch, on one tensor-parallel rank. The cross-entropy runs in fp32 over the
    rank's ``b s V/t`` logits: max, subtract, exp, sum, log, gather in forward; softmax-minus-one-hot in
    backward (~10 fp32 read/write passes in all)."""
    tokens = micro_batch_size * seq_length
    vocab_rank = vocab_size // tp_size
    logits = gemm("logits (vocab-parallel)", m=tokens, n=vocab_rank, k=hidden_size, dtype_bytes=dtype_bytes)
    forward = [
        elementwise("embedding lookup + position add", elements=tokens * hidden_size,
                    bytes_per_element=3 * dtype_bytes),
        elementwise("final layernorm (dup)", elements=tokens * hidden_size, bytes_per_element=2 * dtype_bytes),
        logits,
    ]
    cross_entropy = elementwise("vocab-parallel cross-entropy fwd+bwd (fp32)", elements=tokens * vocab_rank,
                                bytes_per_element=10 * 2 * 4, launches=10, math=True)
    return forward + backward_ops(forward) + [cross_entropy]


#: Bytes of memory traffic per parameter in one mixed-precision Adam step (Megatron-LM 2019 fp16 optimizer):
#: fp16 grad -> fp32 copy (2 r + 4 w), unscale + overflow check (4 r + 4 w + 4 r), grad-norm for clipping (4 r),
#: Adam (p, g, m, v read 16 + p, m, v write 12), fp32 master -> fp16 model copy (4 r + 2 w), zero grads (2 w).
ADAM_BYTES_PER_PARAM = 6 + 12 + 4 + 28 + 6 + 2


#: fp32 Adam (CPU runs): p, g, m, v read (16) + p, m, v written (12) + grad-norm read (4) + zero grads (4).
FP32_ADAM_BYTES_PER_PARAM = 16 + 12 + 4 + 4


def optimizer_ops(*, params_per_rank: float, bytes_per_param: float = ADAM_BYTES_PER_PARAM,
                  launches: int = 7) -> list[Op]:
    """The optimizer step on one rank's ``params_per_rank`` parameters: memory-bound; ``launches`` kernels
    (flat buffers: ~7; per-tensor optimizers: ~7 per parameter tensor)."""
    return [elementwise("Adam step", elements=params_per_rank, bytes_per_element=bytes_per_param,
                        launches=launches)]
