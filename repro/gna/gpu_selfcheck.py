"""A first check on a GPU, before any timing: compiled Flex GNA forward + backward once per small config against
dense masked SDPA over every query (GNA §3's definition), so that a wrong block mask or token permutation shows up
as an error of order 1 instead of as a speedup.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from repro.gna.flex_problem import Attend, FlexProblem, compile_settings, flex_attend
from repro.gna.gpu_check import check_against_reference
from repro.gna.gpu_config import GpuConfig, random_inputs
from repro.gna.spec import GNASpec

#: The smallest of the paper's shapes: Cosmos-7B's 16x44x80 tokens (3-D; 44 is padded to 48 by the 8-token tiles)
#: with window 16x24x16 and stride 1x8x16 (partial and full tiles), on HunyuanVideo's tiles; then FLUX.1-dev 4K
#: (2-D, 256x256, window 80x80, stride 16x16: perfectly block-sparse, Q tile 16x16, KV tile 16x8). Two heads each,
#: so that the dense check over every query is cheap.
SELFCHECKS = (
    GpuConfig("cosmos_selfcheck", "cosmos7b", (16, 44, 80), GNASpec((16, 24, 16), stride=(1, 8, 16)), (4, 8, 8),
              (2, 8, 8), heads=2),
    GpuConfig("flux_selfcheck", "flux1dev_4k", (256, 256), GNASpec((80, 80), stride=(16, 16)), (16, 16), (16, 8),
              heads=2),
)


def selfcheck(config: GpuConfig, device: torch.device | str, *, dtype: torch.dtype = torch.bfloat16,
              attend: Attend | None = None) -> dict[str, float]:
    """GNA forward + backward once (compiled Flex unless ``attend`` is given) against dense masked SDPA over every
    query: max abs and relative errors of out, dq, dk, dv."""
    device = torch.device(device)
    problem = FlexProblem(config, device, flex_attend(compile=True) if attend is None else attend)
    q, k, v, grad_out = random_inputs(config, device, dtype)
    with compile_settings():
        return check_against_reference(problem, q, k, v, grad_out, torch.arange(config.tokens), backward=True)


def cuda_selfcheck(configs: Sequence[GpuConfig] = SELFCHECKS, *, dtype: torch.dtype = torch.bfloat16,
                   tolerance: float = 5e-2) -> dict:
    """On CUDA: compiled Flex GNA forward + backward once per config against dense masked SDPA over every query
    (fp32). Returns ``max_rel_error`` (max abs error over the reference's max abs value, over out, dq, dk, dv and
    the configs), ``ok`` (within ``tolerance``: bf16 inputs with fp32 accumulation should stay near 1e-2, a wrong
    mask or permutation gives errors of order 1), ``seconds`` and per-config ``details``. About a minute per config,
    mostly compilation."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_selfcheck needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda", torch.cuda.current_device())
    started = time.perf_counter()
    details = {config.name: selfcheck(config, device, dtype=dtype) for config in configs}
    worst = max(value for errors in details.values() for name, value in errors.items() if name.endswith("_rel_error"))
    return {"max_rel_error": worst, "ok": worst <= tolerance, "seconds": time.perf_counter() - started,
            "details": details}
