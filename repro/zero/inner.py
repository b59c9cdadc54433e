"""The wrapped optimizer: any torch optimizer stepping fp32 master shards that live in a tier.

ZeRO is built by wrapping an optimizer (DESIGN.md): the Adam math is torch.optim.AdamW's own, applied to the
elements a rank owns. Each sub-group (a bucket's shard) gets its own instance of the optimizer class, holding one
flat master tensor; its state tensors (exp_avg, exp_avg_sq, ...) are handed to the tier after the first step and
fetched back before every later one. The step loop over sub-groups is DeepSpeed's stage-3 loop (fetch, unscale,
step, write back, release) and ZeRO-Infinity's: the next sub-group's reads are issued before this one computes.

Where the states live decides the Adam implementation, unless the caller chose one (``fused=`` or ``foreach=``):
states on a GPU use torch's fused AdamW (one kernel per sub-group); states in CPU memory for a model on a GPU use
torch's fused CPU AdamW (vectorised and multi-threaded: the role of ZeRO-Offload's CPU-Adam, sec. 5.1). A CPU-only
run keeps the optimizer's default, so its numbers do not depend on whether a GPU exists.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from repro.zero.offload.tiers import ResidentTier, Tier

OptimizerFactory = Callable[..., torch.optim.Optimizer]


def optimizer_defaults(optimizer_cls: OptimizerFactory, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameters ``optimizer_cls(**kwargs)`` would use (read from a throw-away instance)."""
    probe = optimizer_cls([torch.zeros(1, requires_grad=True)], **kwargs)
    return {k: v for k, v in probe.defaults.items()}


#: Optimizers with a fused implementation on CUDA and on the CPU (torch >= 2.4).
FUSED_CAPABLE = (torch.optim.Adam, torch.optim.AdamW)


def use_fused(optimizer_cls: OptimizerFactory, hparams: dict[str, Any], *, state_device: torch.device,
              param_device: torch.device) -> bool:
    """Whether sub-groups run the fused kernel: Adam/AdamW whose caller left ``fused`` and ``foreach`` unset, with
    states on a GPU, or in CPU memory for a model on a GPU (ZeRO-Offload's CPU step)."""
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, FUSED_CAPABLE)):
        return False
    if hparams.get("fused") is not None or hparams.get("foreach") is not None:
        return False
    if hparams.get("differentiable") or hparams.get("capturable"):
        return False
    return state_device.type == "cuda" or (state_device.type == "cpu" and param_device.type == "cuda")


class SubGroup:
    """One sub-group: its key prefix in the tier, its optimizer and the names of its swappable state tensors."""

    def __init__(self, key: str, numel: int, optimizer: torch.optim.Optimizer, holder: torch.Tensor,
                 stored_as: str | None = None) -> None:
        self.key, self.numel = key, numel
        self.optimizer, self.holder = optimizer, holder
        self.state_names: list[str] = []
        self.stored_as = stored_as  # the tier key of a master that is another tensor's storage (adopt())

    @property
    def master_key(self) -> str:
        return self.stored_as if self.stored_as is not None else f"{self.key}.master"

    def state_key(self, name: str) -> str:
        return f"{self.key}.{name}"


class TieredOptimizer:
    """Sub-group optimizers whose fp32 master weights and states are stored in ``tier``."""

    def __init__(self, optimizer_cls: OptimizerFactory, tier: Tier, *,
                 param_device: torch.device | str | None = None) -> None:
        self.optimizer_cls, self.tier = optimizer_cls, tier
        self.param_device = torch.device(param_device) if param_device is not None else tier.compute_device
        self.groups: dict[str, SubGroup] = {}
        self.fused: bool | None = None  # decided by the first sub-group's hyperparameters

    def _hparams(self, hparams: dict[str, Any]) -> dict[str, Any]:
        """The wrapper's hyperparameters, with ``fused=True`` where :func:`use_fused` says so."""
        if self.fused is None:
            self.fused = use_fused(self.optimizer_cls, hparams, state_device=self.tier.compute_device,
                                   param_device=self.param_device)
        return {**hparams, "fused": True} if self.fused else hparams

    def add(self, key: str, master: torch.Tensor, hparams: dict[str, Any]) -> None:
        """Register a sub-group. ``master`` is kept without a copy when it is fp32 and already in the tier's memory
        (an fp32 model's own parameter shard), otherwise copied to fp32 in the tier."""
        alias = master.dtype == torch.float32 and isinstance(self.tier, ResidentTier)
        self.tier.create(f"{key}.master", master if alias else master.detach().float(), alias=alias)
        holder = torch.empty(0, dtype=torch.float32, device=self.tier.compute_device, requires_grad=True)
        optimizer = self.optimizer_cls([{"params": [holder], **self._hparams(hparams)}])
        self.groups[key] = SubGroup(key, master.numel(), optimizer, holder)

    def adopt(self, key: str, stored_as: str, numel: int, hparams: dict[str, Any]) -> None:
        """Register a sub-group whose fp32 master is the tensor the tier already stores under ``stored_as`` (an fp32
        stage-3 parameter shard on the same tier: the master weights *are* the parameters, so no second copy)."""
        holder = torch.empty(0, dtype=torch.float32, device=self.tier.compute_device, requires_grad=True)
        optimizer = self.optimizer_cls([{"params": [holder], **self._hparams(hparams)}])
        self.groups[key] = SubGroup(key, numel, optimizer, holder, stored_as=stored_as)

    def prefetch(self, key: str) -> None:
        group = self.groups[key]
        self.tier.prefetch(group.master_key)
        for name in group.state_names:
            self.tier.prefetch(group.state_key(name))

    def master(self, key: str) -> torch.Tensor:
        """The fp32 master shard (fetched; valid until :meth:`release`)."""
        return self.tier.fetch(self.groups[key].master_key)

    def step(self, key: str, grad: torch.Tensor, hparams: dict[str, Any]) -> torch.Tensor:
        """One optimizer step of sub-group ``key`` with fp32 gradient ``grad``; returns the updated master."""
        group = self.groups[key]
        master = self.master(key)
        group.holder.data = master
        state = group.optimizer.state[group.holder]
        for name in group.state_names:
            state[name] = self.tier.fetch(group.state_key(name))
        group.optimizer.param_groups[0].update(self._hparams(hparams))
        group.holder.grad = grad.to(master.device)
        group.optimizer.step()
        group.holder.grad = None
        for name, value in list(state.items()):
            if not (isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == group.numel):
                continue  # scalars such as Adam's step stay with the optimizer
            if name not in group.state_names:  # created by the optimizer's first step
                group.state_names.append(name)
                self.tier.create(group.state_key(name), value, alias=True)
            else:
                self.tier.writeback(group.state_key(name), value)
        self.tier.writeback(group.master_key, master)
        return master

    def release(self, key: str) -> None:
        """Hand the sub-group's tensors back to the tier (NVMe buffers become reusable)."""
        group = self.groups[key]
        group.holder.data = torch.empty(0, dtype=torch.float32, device=group.holder.device)
        state = group.optimizer.state[group.holder]
        for name in group.state_names:
            state[name] = torch.empty(0, dtype=torch.float32, device=group.holder.device)
            self.tier.release(group.state_key(name))
        self.tier.release(group.master_key)

    # -- inspection and checkpoints ------------------------------------------------------------------------
    def keys_by_kind(self) -> Iterator[tuple[str, str]]:
        """(kind, tier key) of everything stored: "master" or "optimizer_states". An adopted master (see
        :meth:`adopt`) is the parameters' storage, counted once there."""
        for group in self.groups.values():
            if group.stored_as is None:
                yield "master", group.master_key
            for name in group.state_names:
                yield "optimizer_states", group.state_key(name)

    def state_dict(self, key: str) -> dict[str, Any]:
        group = self.groups[key]
        out: dict[str, Any] = {"master": self.master(key).detach().cpu().clone(), "tensors": {}, "scalars": {}}
        for name in group.state_names:
            out["tensors"][name] = self.tier.fetch(group.state_key(name)).detach().cpu().clone()
            self.tier.release(group.state_key(name))
        for name, value in group.optimizer.state[group.holder].items():
            if name not in group.state_names:  # Adam's step: a GPU tensor under the fused kernel, saved on the CPU
                out["scalars"][name] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
        self.tier.release(group.master_key)
        return out

    def load_state_dict(self, key: str, state: dict[str, Any]) -> torch.Tensor:
        """Restore a sub-group; returns the restored master (fetched; release it afterwards)."""
        group = self.groups[key]
        if state["master"].numel() != group.numel:
            raise ValueError(f"checkpoint shard {key} has {state['master'].numel()} elements, expected {group.numel}")
        master = self.master(key)
        master.copy_(state["master"].reshape(-1).to(master.device))
        self.tier.writeback(group.master_key, master)
        opt_state = group.optimizer.state[group.holder]
        opt_state.clear()
        # torch's own rule (Optimizer.load_state_dict): a scalar state stays on the CPU unless the fused or
        # capturable kernel reads it on the parameters' device.
        options = group.optimizer.param_groups[0]
        scalar_device = group.holder.device if options.get("fused") or options.get("capturable") else "cpu"
        for name, value in state["scalars"].items():
            opt_state[name] = value.clone().to(scalar_device) if isinstance(value, torch.Tensor) else value
        for name, value in state["tensors"].items():
            value = value.reshape(-1).to(self.tier.compute_device)
            if name in group.state_names:
                stored = self.tier.fetch(group.state_key(name))
                stored.copy_(value)
                self.tier.writeback(group.state_key(name), stored)
                self.tier.release(group.state_key(name))
            else:
                group.state_names.append(name)
                self.tier.create(group.state_key(name), value.clone())
            opt_state[name] = torch.empty(0, dtype=torch.float32, device=group.holder.device)
        return self.tier.fetch(group.master_key)
