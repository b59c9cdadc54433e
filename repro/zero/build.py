"""Build the ZeRO optimizer a :class:`ZeroConfig` describes: choose the stage class, make its tiers, cast the model.

    config = ZeroConfig(stage=3, dtype="bf16", offload_optimizer=OffloadConfig("nvme", nvme_path="/local/nvme"))
    optimizer = build_zero_optimizer(model, config, dp_group=groups.dp, lr=1e-4)
    loss = model.loss(ids, labels).mean(); optimizer.backward(loss); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.zero.config import ZeroConfig
from repro.zero.grad_norm import tensor_parallel_duplicates
from repro.zero.offload import build_tier
from repro.zero.precision import TORCH_DTYPES
from repro.zero.stage0 import DataParallelOptimizer
from repro.zero.stage1 import ZeroStage1
from repro.zero.stage2 import ZeroStage2
from repro.zero.stage3 import ZeroStage3
from repro.zero.stage3_infinity import ZeroInfinityStage3

STAGE_CLASSES = {0: DataParallelOptimizer, 1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}


def shares_nvme_tier(config: ZeroConfig) -> bool:
    """Stage 3, fp32, parameters and optimizer states in the same NVMe directory: they share one tier and the fp32
    master weights are the parameter shard (stored once: 16 bytes per parameter with the moments and gradients)."""
    param, optimizer = config.offload_param, config.offload_optimizer
    return (config.stage == 3 and config.dtype == "fp32" and param.device == optimizer.device == "nvme"
            and param.nvme_path == optimizer.nvme_path)


def build_zero_optimizer(
    model: nn.Module,
    config: ZeroConfig,
    *,
    dp_group: CommGroup,
    params: Iterable[nn.Parameter] | Iterable[dict] | None = None,
    tp_group: CommGroup | None = None,
    model_parallel_group: CommGroup | None = None,
    optimizer_cls=torch.optim.AdamW,
    materializer=None,
    **optimizer_kwargs: Any,
) -> DataParallelOptimizer:
    """The optimizer for ``model`` at ``config.stage`` over ``dp_group``; the model is cast to ``config.dtype``.

    ``tp_group``: under tensor parallelism, parameters replicated over it are counted once in the clipping norm,
    and the norm is summed over ``model_parallel_group`` (default: ``tp_group``).
    """
    model.to(TORCH_DTYPES[config.dtype])
    device = next(model.parameters()).device
    excluded = tensor_parallel_duplicates(model, tp_group) if tp_group is not None else []
    if model_parallel_group is None and tp_group is not None and tp_group.size > 1:
        model_parallel_group = tp_group
    common = dict(
        dp_group=dp_group, optimizer_cls=optimizer_cls, max_grad_norm=config.max_grad_norm,
        bucket_numel=config.bucket_numel, loss_scale=config.loss_scale, model_parallel_group=model_parallel_group,
        norm_excluded=excluded,
        optimizer_tier=build_tier(config.offload_optimizer, device=device, role="optimizer"),
        **optimizer_kwargs,
    )
    if config.stage == 3:
        stage3 = dict(prefetch=config.prefetch, prefetch_numel=config.prefetch_numel, materializer=materializer)
        if shares_nvme_tier(config):
            # fp32 parameters and optimizer on one NVMe directory: one tier, the master is the parameter file
            common["optimizer_tier"].close()
            common["optimizer_tier"] = build_tier(config.offload_optimizer, device=device, role="states")
            stage3["param_tier"] = common["optimizer_tier"]
        else:
            stage3["param_tier"] = build_tier(config.offload_param, device=device, role="param")
        if config.offload_optimizer.device == "nvme":  # ZeRO-Infinity: the gradients go to NVMe as well
            grad_tier = build_tier(config.offload_optimizer, device=device, role="grads")
            return ZeroInfinityStage3(model, params, grad_tier=grad_tier, **stage3, **common)
        return ZeroStage3(model, params, **stage3, **common)
    if materializer is not None:
        raise ValueError(f"a partitioned model (materializer) needs stage 3, got stage {config.stage}")
    return STAGE_CLASSES[config.stage](
        model.parameters() if params is None else params, param_names=list(model.named_parameters()), **common
    )
