"""The output layer tied to the input embedding (Megatron sec. 3, "output embedding").

``logits_i = f(X) E_i^T``: each rank multiplies by its vocabulary shard of the embedding; f all-reduces dX in
backward. The logits stay split (``[b, s, V_padded/p]``) for the vocab-parallel cross-entropy.
Logits of padding rows (ids >= vocab_size) are set to the dtype's minimum, so the loss and the softmax do not depend
on how much padding the tensor-parallel size asked for. (Megatron leaves them in the softmax; a model trained with
one tp size then gives slightly different losses at another. We prefer losses independent of tp.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from repro.tensor_parallel import VocabParallelEmbedding, copy_to_tensor_parallel


def parallel_lm_logits(
    hidden: torch.Tensor, embedding: VocabParallelEmbedding, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """[b, s, h] -> this rank's logits shard [b, s, V_padded/tp]; padding columns masked to the dtype minimum."""
    hidden = copy_to_tensor_parallel(hidden, embedding.group)  # f
    logits = F.linear(hidden, embedding.weight, bias)
    real = embedding.vocab_size - embedding.start  # columns of this shard that are real tokens
    if real < logits.shape[-1]:
        pad = torch.arange(logits.shape[-1], device=logits.device) >= real
        logits.masked_fill_(pad, torch.finfo(logits.dtype).min)  # in place: a fresh GEMM output, no copy
    return logits
