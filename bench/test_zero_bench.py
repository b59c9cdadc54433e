"""ZeRO against DeepSpeed (0.19.8, CPU accelerator, gloo) on the same GPT, 2 ranks, fp32 AdamW, each stage and tier.

Per case both frameworks train the same model on the same synthetic stream: 2 warm-up steps, then 5 measured ones,
each framework in its own processes (peak RSS, memory split, communication). Step times come from a third run in
which both live in the same processes and alternate steps (10 timed pairs), because this CPU is shared with other
jobs and separate runs see different loads. Reported per rank 0: the median per-pair step-time ratio
repro / DeepSpeed (goal <= 1.0), peak RSS (goal <= DeepSpeed's),
communication per step counted the same way for both (ring-algorithm wire bytes of every torch.distributed
collective, in units of psi elements), and DeepSpeed's measurements in the memory-report schema (written to
``$ZERO_BENCH_OUT``, default ``.benchmarks/zero_bench_measurements.json``, with repro's beside them) for
``python -m repro.harness.zero_report --no-measure --rows .benchmarks/zero_bench_measurements.json``.
A separate case measures the NVMe tier's bandwidth against the raw drive's in the same run (goal >= 0.7).

DeepSpeed settings that make it comparable: ``torch_adam`` (the same torch AdamW, no FusedAdam build),
``stage3_param_persistence_threshold: 0`` (partition every parameter, as the formula assumes),
``reduce_bucket_size: 5e5`` (the same bucket as repro), ``stage3_max_reuse_distance: 0`` (free parameters after
use; by default DeepSpeed keeps every parameter gathered between forward and backward when the model is small
enough, skipping the backward all-gather: 2 psi instead of 3, and a full copy of the parameters resident). It builds its C++ ops on first use (shared-memory comm
~30 s, async I/O ~150-230 s; cached in ~/.cache/torch_extensions). NVMe needs ``apt-get install libaio-dev``.

Run: ``python -m pytest bench/test_zero_bench.py --benchmark-only -s`` (skips when deepspeed is missing).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

from repro.dist import init_parallel, spawn  # noqa: E402
from repro.dist.ledger import WIRE_FACTORS  # noqa: E402
from repro.models import GPTConfig, GPTModel  # noqa: E402
from repro.training.data import synthetic_tokens  # noqa: E402
from repro.zero import OffloadConfig, ZeroConfig  # noqa: E402
from repro.experiments.zero_measure import RunSpec, SavedActivations, measure_run  # noqa: E402
from repro.machine import peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402
from repro.zero.offload.bandwidth import raw_disk_bandwidth, tier_bandwidth  # noqa: E402

MODEL = GPTConfig(vocab_size=8192, hidden_size=256, num_layers=4, num_attention_heads=4, max_position_embeddings=64,
                  hidden_dropout=0.0, attention_dropout=0.0)
MICRO_BATCH, SEQ, WARMUP, STEPS, LR = 2, 64, 2, 5, 1e-4
CASES = [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "cpu"), (2, "cpu"), (3, "cpu"), (3, "nvme")]
RESULTS: dict[str, dict] = {}


class LossModel(torch.nn.Module):
    def __init__(self, model: GPTModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model.loss(ids, labels).float().mean()


def _nbytes(tensor) -> int:
    if isinstance(tensor, (list, tuple)):
        return sum(_nbytes(t) for t in tensor)
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def _arg(args, kwargs, index: int, *names: str):
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[index] if len(args) > index else None


class CountCollectives:
    """Wire bytes of every torch.distributed collective (ring accounting, as repro's ledger), by patching.
    The buffer counted is the one repro's ledger counts: the tensor (all-reduce, broadcast), the gathered
    output (all-gather), the full input (reduce-scatter)."""

    BUFFERS = {  # function -> (ledger kind, how to find the counted buffer)
        "all_reduce": ("all_reduce", lambda a, k: _arg(a, k, 0, "tensor")),
        "broadcast": ("broadcast", lambda a, k: _arg(a, k, 0, "tensor")),
        "all_gather_into_tensor": ("all_gather", lambda a, k: _arg(a, k, 0, "output_tensor", "output")),
        "all_gather": ("all_gather", lambda a, k: _arg(a, k, 0, "tensor_list")),
        "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input", "input_tensor")),
        "reduce_scatter": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input_list")),
    }

    def __init__(self) -> None:
        self.wire = 0.0
        self.by_kind: dict[str, float] = {}
        dist = torch.distributed
        for name, (kind, buffer) in self.BUFFERS.items():
            original = getattr(dist, name)

            def wrapped(*args, _original=original, _kind=kind, _buffer=buffer, **kwargs):
                size = dist.get_world_size(kwargs.get("group"))
                if size > 1:
                    wire = WIRE_FACTORS[_kind](size) * _nbytes(_buffer(args, kwargs))
                    self.wire += wire
                    self.by_kind[_kind] = self.by_kind.get(_kind, 0.0) + wire
                return _original(*args, **kwargs)

            setattr(dist, name, wrapped)


def _deepspeed_memory(engine) -> dict[str, int]:
    """Tensors DeepSpeed holds, by kind, found by walking its optimizer and the module (storages counted once)."""
    seen, out = set(), {}

    def add(kind: str, tensor) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                out[kind] = out.get(kind, 0) + storage.nbytes()

    def kind_of(path: str) -> str:
        path = path.lower()
        if "swap" in path or "aio" in path or "pinned" in path:
            return "io_buffers"
        if "fp32" in path or "single_partition" in path or "master" in path:
            return "master"
        if "ipg" in path or "bucket" in path or "reduce" in path or "extra_large" in path:
            return "comm_buffers"
        if "grad" in path:
            return "grads"
        if "bit16" in path or "fp16" in path or "bf16" in path:
            return "params"
        return "other"

    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    if isinstance(inner, torch.optim.Optimizer):
        for param, state in inner.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    add("optimizer_states", value)
            add("master", param)
            add("grads", param.grad)
    for param in engine.module.parameters():
        add("params", getattr(param, "ds_tensor", None))
        status = str(getattr(param, "ds_status", "NOT_AVAILABLE"))
        add("gathered_params" if hasattr(param, "ds_tensor") and "NOT_AVAILABLE" not in status else "params", param.data)
        add("grads", param.grad)
    visited = set()

    def walk(obj, path: str, depth: int) -> None:
        if id(obj) in visited or depth > 5:
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            add(kind_of(path), obj)
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                walk(item, path, depth + 1)
        elif isinstance(obj, dict):
            for key, item in obj.items():
                walk(item, f"{path}.{key}", depth + 1)
        elif type(obj).__module__.startswith("deepspeed") and hasattr(obj, "__dict__"):
            for key, item in vars(obj).items():
                walk(item, f"{path}.{key}", depth + 1)

    walk(engine.optimizer, "optimizer", 0)
    return out


def _deepspeed_engine(stage: int, tier: str, nvme_path: str):
    """DeepSpeed's engine for the bench model (torch.distributed is already initialised by spawn)."""
    import logging

    deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = LossModel(GPTModel(MODEL))
    zero = {"stage": stage, "reduce_bucket_size": 5e5, "stage3_param_persistence_threshold": 0,
            "stage3_max_reuse_distance": 0}
    if tier != "none":
        zero["offload_optimizer"] = {"device": tier, "nvme_path": nvme_path}
        if stage == 3:
            zero["offload_param"] = {"device": tier, "nvme_path": nvme_path}
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0, "torch_adam": True}},
              "zero_optimization": zero, "steps_per_print": 10**9, "zero_force_ds_cpu_optimizer": False}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, model


def _deepspeed_run(rank: int, world_size: int, stage: int, tier: str, nvme_path: str) -> dict:
    counter = CountCollectives()  # before DeepSpeed binds torch.distributed's functions
    groups = init_parallel()
    import torch._dynamo  # noqa: F401 - as in measure_run: library memory belongs to the runtime line

    rss_start = rss_bytes()
    engine, model = _deepspeed_engine(stage, tier, nvme_path)
    tokens = synthetic_tokens(vocab_size=MODEL.vocab_size, seq_len=SEQ, batch_size=MICRO_BATCH * world_size,
                              steps=WARMUP + STEPS, seed=0)
    times, wire, losses, activations, memory = [], [], [], 0, None
    for step in range(WARMUP + STEPS):
        if step == WARMUP:
            reset_peak_rss()
        rows = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
        ids, labels = tokens[step, rows, :-1], tokens[step, rows, 1:]
        before, start = counter.wire, time.perf_counter()
        with SavedActivations(model.parameters()) as saved:
            loss = engine(ids, labels)
        engine.backward(loss)
        if step == WARMUP:
            memory = _deepspeed_memory(engine)
        engine.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
            wire.append(counter.wire - before)
            activations = max(activations, saved.bytes)
        losses.append(loss.item())
    psi = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    notes = []
    if memory.get("other", 0) >= 1e5:
        notes.append(f"DeepSpeed tensors not classified: {memory['other'] / 1e6:.1f} MB")
    param_offload = engine.zero_offload_param()
    if param_offload is not None and str(getattr(param_offload, "device", "none")).endswith("nvme"):
        pool = param_offload.buffer_count * param_offload.buffer_size * 4
        notes.append(f"NVMe parameter swap pool configured: buffer_count {param_offload.buffer_count} x buffer_size "
                     f"{param_offload.buffer_size:.0e} elements x 4 B = {pool / 1e6:.0f} MB of aligned (pinned) host "
                     "buffers, allocated by its aio engine (not reachable from Python, so under 'rest')")
    states = sum(memory.get(k, 0) for k in ("params", "grads", "master", "optimizer_states"))
    return {
        "framework": "deepspeed", "stage": stage, "dp_size": groups.dp_size, "psi": psi,
        "spec": {"zero": {"dtype": "fp32", "offload_optimizer": {"device": tier},
                          "offload_param": {"device": tier if stage == 3 else "none"}}},
        "rss_start": rss_start, "rss_peak": peak_rss_bytes(), "model_states_in_memory": states,
        "comm_buffer_bytes": memory.get("comm_buffers", 0), "gathered_param_bytes": memory.get("gathered_params", 0),
        "io_buffer_bytes": memory.get("io_buffers", 0), "activation_bytes": activations,
        "step_time_s": statistics.median(times), "wire_bytes_per_step": statistics.median(wire), "losses": losses,
        "memory_by_kind": memory, "wire_by_kind_total": dict(counter.by_kind),
        "notes": "; ".join(notes),
    }


def _repro_run(rank: int, world_size: int, stage: int, tier: str, nvme_path: str) -> dict:
    groups = init_parallel()
    offload = OffloadConfig(tier, nvme_path=nvme_path if tier == "nvme" else None)
    zero = ZeroConfig(stage=stage, offload_optimizer=offload, offload_param=offload if stage == 3 else OffloadConfig())
    spec = RunSpec(model=MODEL, zero=zero, micro_batch=MICRO_BATCH, seq_len=SEQ, steps=STEPS, warmup=WARMUP, lr=LR)
    got = measure_run(spec, groups)
    got["step_time_s"] = statistics.median(got["step_times_s"])
    return {**got, "framework": "repro"}


def _paired_timing(rank: int, world_size: int, stage: int, tier: str, nvme_path: str) -> list[tuple[float, float]]:
    """Both frameworks in the same processes, steps alternating, so that both see the same machine load (this
    CPU is shared): returns (repro, deepspeed) step times of the timed steps."""
    from repro.zero import build_zero_optimizer

    groups = init_parallel()
    engine, _ = _deepspeed_engine(stage, tier, os.path.join(nvme_path, "ds"))
    torch.manual_seed(0)
    ours = LossModel(GPTModel(MODEL))
    offload = OffloadConfig(tier, nvme_path=nvme_path if tier == "nvme" else None)
    zero = ZeroConfig(stage=stage, offload_optimizer=offload, offload_param=offload if stage == 3 else OffloadConfig())
    optimizer = build_zero_optimizer(ours.model, zero, dp_group=groups.dp, lr=LR)
    tokens = synthetic_tokens(vocab_size=MODEL.vocab_size, seq_len=SEQ, batch_size=MICRO_BATCH * world_size,
                              steps=WARMUP + 2 * STEPS, seed=0)
    pairs = []
    for step in range(WARMUP + 2 * STEPS):
        rows = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
        ids, labels = tokens[step, rows, :-1], tokens[step, rows, 1:]
        start = time.perf_counter()
        optimizer.backward(ours(ids, labels))
        optimizer.step()
        optimizer.zero_grad()
        middle = time.perf_counter()
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
        end = time.perf_counter()
        if step >= WARMUP:
            pairs.append((middle - start, end - middle))
    optimizer.close()
    return pairs


def _out_path() -> Path:
    return Path(os.environ.get("ZERO_BENCH_OUT", ".benchmarks/zero_bench_measurements.json"))


@pytest.mark.parametrize("stage,tier", CASES, ids=[f"stage{s}-{t}" for s, t in CASES])
def test_zero_vs_deepspeed(benchmark, stage, tier):
    torch.set_num_threads(1)
    nvme_path = tempfile.mkdtemp(prefix="zero-bench-nvme-")

    os.makedirs(os.path.join(nvme_path, "ds"), exist_ok=True)

    def case():
        return (spawn(_repro_run, 2, stage, tier, nvme_path, timeout_s=900)[0],
                spawn(_deepspeed_run, 2, stage, tier, nvme_path, timeout_s=900)[0],
                spawn(_paired_timing, 2, stage, tier, nvme_path, timeout_s=900)[0])

    try:
        ours, theirs, pairs = benchmark.pedantic(case, rounds=1, iterations=1)
    finally:
        shutil.rmtree(nvme_path, ignore_errors=True)
    psi = ours["psi"]
    row = {
        "repro_step_s": statistics.median(p[0] for p in pairs),
        "deepspeed_step_s": statistics.median(p[1] for p in pairs),
        "step_time_ratio": statistics.median(p[0] / p[1] for p in pairs),
        "repro_rss_mb": ours["rss_peak"] / 1e6, "deepspeed_rss_mb": theirs["rss_peak"] / 1e6,
        "repro_comm_psi": ours["wire_bytes_per_step"] / (4 * psi) / 0.5,
        "deepspeed_comm_psi": theirs["wire_bytes_per_step"] / (4 * psi) / 0.5,
        "first_loss_repro": ours["losses"][0], "first_loss_deepspeed": theirs["losses"][0],
    }
    benchmark.extra_info.update(row)
    RESULTS[f"stage{stage}-{tier}"] = {"row": row, "repro": ours, "deepspeed": theirs}
    out = _out_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([r[name] for r in RESULTS.values() for name in ("repro", "deepspeed")], indent=1))
    assert abs(row["first_loss_repro"] - row["first_loss_deepspeed"]) < 1e-4  # the same model and data
    print(f"\nstage {stage} {tier:5s} step repro {row['repro_step_s'] * 1e3:7.1f} ms  deepspeed "
          f"{row['deepspeed_step_s'] * 1e3:7.1f} ms  ratio {row['step_time_ratio']:.2f}  RSS repro "
          f"{row['repro_rss_mb']:.0f} MB deepspeed {row['deepspeed_rss_mb']:.0f} MB  comm repro "
          f"{row['repro_comm_psi']:.2f} psi deepspeed {row['deepspeed_comm_psi']:.2f} psi")


def test_nvme_tier_bandwidth(benchmark):
    """Raw drive and tier measured alternately, 5 rounds of 256 MiB per direction; the ratio is the median of the
    per-round ratios (the virtual disk's speed drifts between rounds). Goal: tier >= 0.7 of the raw drive."""
    path = os.environ.get("REPRO_NVME_PATH", tempfile.gettempdir())

    def measure():
        return [(raw_disk_bandwidth(path), tier_bandwidth(path)) for _ in range(5)]

    rounds = benchmark.pedantic(measure, rounds=1, iterations=1)
    ratios = {}
    for direction in ("read", "write"):
        key = f"{direction}_gbs"
        raw = statistics.median(r[key] for r, _ in rounds)
        tier = statistics.median(t[key] for _, t in rounds)
        ratios[direction] = statistics.median(t[key] / r[key] for r, t in rounds)
        benchmark.extra_info.update({f"raw_{key}": raw, f"tier_{key}": tier, f"{direction}_ratio": ratios[direction]})
        print(f"\nNVMe {direction}: raw {raw:.2f} GB/s, tier {tier:.2f} GB/s (medians), per-round ratio "
              f"{ratios[direction]:.2f} (O_DIRECT: {rounds[0][1]['direct']})")
    assert min(ratios.values()) >= 0.7, ratios
