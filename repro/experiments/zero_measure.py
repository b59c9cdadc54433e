"""One measured ZeRO training run on this rank: what the experiments, the memory report and the bench read.

For a GPT and a :class:`ZeroConfig` it trains a few steps on a learnable synthetic stream and records, per rank:
the memory ledger after backward (model states by kind and tier), the running peaks of transient buffers, the
bytes of activations saved for backward (a ``saved_tensors_hooks`` count), the process's resident set (RSS:
before the model exists, after set-up, and the peak over the measured steps), the ledger's communication per
step and the step time. Every number is measured; the paper's formula is set beside them by the callers.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from repro.machine import peak_rss_bytes, reset_peak_rss, rss_bytes
from repro.models import GPTConfig
from repro.zero.config import ZeroConfig
from repro.perfmodel.zero_memory import model_state_bytes

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    import torch
    from torch import nn

    from repro.dist.groups import ParallelGroups


@dataclass(frozen=True)
class RunSpec:
    model: GPTConfig
    zero: ZeroConfig
    micro_batch: int = 2
    seq_len: int = 32
    steps: int = 3
    warmup: int = 1
    lr: float = 1e-4
    seed: int = 0
    extra: dict = field(default_factory=dict)


class SavedActivations:
    """Counts the bytes autograd saves for backward, each storage once, leaving out parameters: also the views of
    them that ops save (``F.linear`` saves ``weight.t()``, a view of the parameter's, or of a flat buffer's,
    storage), judged by the parameters' storages at the moment of saving (stage 3 gathers them on the fly)."""

    def __init__(self, parameters: Iterable[nn.Parameter] = ()) -> None:
        self.bytes = 0
        self._parameters = list(parameters)
        self._seen: set[int] = set()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        from torch import nn

        if isinstance(tensor, nn.Parameter):
            return tensor
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in self._seen:
            return tensor
        if any(p.untyped_storage().data_ptr() == pointer for p in self._parameters):
            return tensor
        self._seen.add(pointer)
        self.bytes += tensor.untyped_storage().nbytes()
        return tensor

    def __enter__(self) -> "SavedActivations":
        import torch

        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._seen.clear()


def measure_run(spec: RunSpec, groups: ParallelGroups, *, device: str = "cpu") -> dict[str, Any]:
    """Train ``spec.warmup + spec.steps`` steps on this rank; return the measurements (JSON-serialisable)."""
    import torch
    import torch._dynamo  # noqa: F401 - torch.optim imports it on first use (~100 MB): runtime, not model states

    from repro.zero.offload.nvme import NvmeTier
    from repro.zero.build import build_zero_optimizer
    from repro.training.data import synthetic_tokens
    from repro.models import GPTModel

    rss_start = rss_bytes()
    device_start = torch.cuda.memory_allocated() if device.startswith("cuda") else None
    torch.manual_seed(spec.seed)
    model = GPTModel(spec.model, tp_group=groups.tp).to(device)
    optimizer = build_zero_optimizer(model, spec.zero, dp_group=groups.dp, tp_group=groups.tp, lr=spec.lr)
    tokens = synthetic_tokens(vocab_size=spec.model.vocab_size, seq_len=spec.seq_len,
                              batch_size=spec.micro_batch * groups.dp_size, steps=spec.warmup + spec.steps,
                              seed=spec.seed)
    rss_setup = rss_bytes()
    losses, times, wire, calls, activations = [], [], [], [], 0
    ledger = None
    for step in range(spec.warmup + spec.steps):
        measured = step >= spec.warmup
        if step == spec.warmup:
            optimizer.transient.reset_peak()
            reset_peak_rss()
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
        rows = slice(groups.dp_rank * spec.micro_batch, (groups.dp_rank + 1) * spec.micro_batch)
        ids, labels = tokens[step, rows, :-1].to(device), tokens[step, rows, 1:].to(device)
        before = groups.ledger.snapshot()
        start = time.perf_counter()
        with SavedActivations(model.parameters()) as saved:
            loss = model.loss(ids, labels).float().mean()
        optimizer.backward(loss)
        if hasattr(optimizer, "finish_backward"):
            optimizer.finish_backward()
        if measured and ledger is None:
            ledger = optimizer.memory_ledger()
        optimizer.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - start
        traffic = groups.ledger.since(before)
        losses.append(loss.item())
        if measured:
            times.append(elapsed)
            wire.append(traffic.wire_bytes(group="dp"))
            calls.append(traffic.calls(group="dp"))
            activations = max(activations, saved.bytes)
    psi = optimizer.num_parameters
    element = torch.empty(0, dtype=optimizer.precision.dtype).element_size()
    result = {
        "spec": {"model": asdict(spec.model), "zero": _plain(asdict(spec.zero)), "micro_batch": spec.micro_batch,
                 "seq_len": spec.seq_len, "steps": spec.steps, **spec.extra},
        "stage": spec.zero.stage, "dp_size": groups.dp_size, "tp_size": groups.tp_size, "psi": psi,
        "padding": optimizer.padding_elements, "element_bytes": element,
        "ledger": {f"{kind}/{tier}": value for (kind, tier), value in ledger.bytes.items()},
        "model_states_bytes": ledger.model_states(),
        "model_states_device_bytes": ledger.model_states("device"),
        "formula_bytes": model_state_bytes(num_params=psi, stage=spec.zero.stage, dp_size=groups.dp_size)
        if spec.zero.dtype != "fp32" else None,
        "transient_peak": dict(optimizer.transient.peak), "transient_largest": dict(optimizer.transient.largest),
        "activation_bytes": activations,
        "rss_start": rss_start, "rss_setup": rss_setup, "rss_peak": peak_rss_bytes(),
        # on a GPU the report splits the allocator's peak instead of the process's RSS
        "device_peak": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
        "device_start": device_start,
        "wire_bytes_per_step": sum(wire) / len(wire), "calls_per_step": sum(calls) / len(calls),
        "step_time_s": sum(times) / len(times), "step_times_s": times, "losses": losses,
    }
    for role, tier in (("optimizer", optimizer.tier), ("param", getattr(optimizer, "param_tier", None))):
        if isinstance(tier, NvmeTier):
            result[f"nvme_{role}"] = {"bytes_read": tier.bytes_read, "bytes_written": tier.bytes_written,
                                      "direct": tier.direct}
    optimizer.close()
    return result


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def nvme_dir(default: str | None = None) -> str:
    """Where measurement runs put NVMe swap files: $REPRO_NVME_PATH, else ``default``, else the temp dir."""
    return os.environ.get("REPRO_NVME_PATH") or default or os.environ.get("TMPDIR", "/tmp")
