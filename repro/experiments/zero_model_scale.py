"""The largest model a tier trains on this machine (ZeRO-Infinity Fig. 1 / 5a, scaled to one small node).

Two pieces: an *estimate* of what a GPT needs per rank in memory and on disk at stage 3 with a given placement
(model states 16 bytes per parameter, fp32 parameters and gradients and Adam's two moments, the master weights
being the fp32 parameters; plus the working set: one block during partitioned construction, a few gathered
operators in forward and backward, the NVMe tier's sub-group buffers), used to pick the largest candidate before
anything is allocated; and a *measured run* of that candidate: built partitioned, trained a few steps on one
repeated batch, with the construction's and the training's peak RSS, step times and the bytes each NVMe tier
moved. The estimate only chooses what to try; every reported number comes from the run.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from repro.models import GPTConfig
from repro.zero.config import OffloadConfig, ZeroConfig
from repro.machine import peak_rss_bytes, reset_peak_rss, rss_bytes

if TYPE_CHECKING:  # annotations only: torch loads where it runs, not for `repro list` or Slurm's planning
    from repro.dist.groups import ParallelGroups
    from repro.zero.offload.nvme import NvmeTier

#: bytes per parameter of the model states (fp32 params = master, fp32 grads, Adam m and v)
STATE_BYTES_PER_PARAM = 16
#: the Python + torch + gloo process before any model exists, measured on this machine's CPU ranks (~0.45 GB)
RUNTIME_BYTES = 600 << 20


def gpt_params(config: GPTConfig) -> int:
    """psi of a GPT (tied embeddings): 12 h^2 + 13 h per layer, V_pad h + positions h, two LayerNorms each."""
    h = config.hidden_size
    per_layer = 3 * h * h + 3 * h + h * h + h + 2 * (h * config.ffn_size) + config.ffn_size + h + 4 * h
    return config.num_layers * per_layer + (config.padded_vocab_size() + config.max_position_embeddings) * h + 2 * h


def placement(tier: str, nvme_path: str | None, bucket_numel: int) -> ZeroConfig:
    """Stage 3, fp32: ``memory`` keeps every state in memory, ``nvme`` puts parameters, optimizer states and
    gradients under ``nvme_path``."""
    offload = OffloadConfig("nvme", nvme_path=nvme_path) if tier == "nvme" else OffloadConfig()
    return ZeroConfig(stage=3, dtype="fp32", offload_param=offload, offload_optimizer=offload,
                      bucket_numel=bucket_numel)


def estimate(config: GPTConfig, *, tier: str, world_size: int, micro_batch: int, seq_len: int,
             bucket_numel: int) -> dict[str, int]:
    """Host bytes per rank and disk bytes (all ranks) that stage 3 needs for ``config`` on ``tier``."""
    h, psi = config.hidden_size, gpt_params(config)
    layer = 4 * (12 * h * h + 13 * h)
    embedding = 4 * (config.padded_vocab_size() + config.max_position_embeddings) * h
    block = max(layer, embedding)
    largest_op = 4 * max(h * config.ffn_size + config.ffn_size, config.padded_vocab_size() * h)
    shard = min(largest_op, 4 * bucket_numel) // world_size + 4096
    activations = 4 * micro_batch * seq_len * (config.num_layers * 20 * h + 3 * config.padded_vocab_size())
    # construction: the block and its flat copy; training: two operators gathered, their flat gradient and
    # autograd's gradient, the reduce-scatter shards
    working = RUNTIME_BYTES + max(2 * block, 5 * largest_op) + activations
    states = STATE_BYTES_PER_PARAM * psi // world_size
    if tier == "nvme":
        buffers = (2 * 3 + 9 + 2 + 9) * shard  # two sub-groups' reads and the writes in flight, both tiers
        return {"host_bytes_per_rank": working + buffers, "disk_bytes": STATE_BYTES_PER_PARAM * psi, "psi": psi}
    return {"host_bytes_per_rank": working + states, "disk_bytes": 0, "psi": psi}


def largest_fitting(candidates: list[GPTConfig], *, tier: str, memory_budget: int, disk_budget: int,
                    world_size: int, micro_batch: int, seq_len: int, bucket_numel: int) -> list[dict[str, Any]]:
    """Every candidate with its estimate and whether it fits, the largest fitting one marked ``chosen``."""
    rows = []
    for config in candidates:
        need = estimate(config, tier=tier, world_size=world_size, micro_batch=micro_batch, seq_len=seq_len,
                        bucket_numel=bucket_numel)
        fits = need["host_bytes_per_rank"] * world_size <= memory_budget and need["disk_bytes"] <= disk_budget
        rows.append({"config": config, **need, "fits": fits, "chosen": False})
    fitting = [row for row in rows if row["fits"]]
    if fitting:
        max(fitting, key=lambda row: row["psi"])["chosen"] = True
    return rows


def swap_used_bytes() -> int:
    fields = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    return fields.get("SwapTotal", 0) - fields.get("SwapFree", 0)


def _nvme_tiers(optimizer) -> list[NvmeTier]:
    from repro.zero.offload.nvme import NvmeTier

    tiers = [getattr(optimizer, name, None) for name in ("tier", "param_tier", "grad_tier")]
    unique = {id(t): t for t in tiers if isinstance(t, NvmeTier)}
    return list(unique.values())


def _moved(tiers: list[NvmeTier]) -> tuple[int, int]:
    return sum(t.bytes_read for t in tiers), sum(t.bytes_written for t in tiers)


def scale_run(config: GPTConfig, zero: ZeroConfig, groups: ParallelGroups, *, steps: int, micro_batch: int,
              seq_len: int, lr: float = 1e-4, seed: int = 0, log=None) -> dict[str, Any]:
    """Build ``config`` partitioned and train ``steps`` steps on one repeated batch; measurements of this rank."""
    import torch
    import torch.distributed as dist

    from repro.zero.offload.aio import IO_BUSY
    from repro.models.partitioned_gpt import build_partitioned_gpt

    say = log or (lambda message: None)
    rss_start = rss_bytes()
    reset_peak_rss()
    torch.manual_seed(seed)
    start = time.perf_counter()
    model, optimizer = build_partitioned_gpt(config, zero, dp_group=groups.dp, tp_group=groups.tp, lr=lr)
    optimizer.param_tier.flush()
    optimizer.tier.flush()
    dist.barrier() if dist.is_initialized() else None
    construction_s = time.perf_counter() - start
    construction_peak = peak_rss_bytes()
    say(f"built psi={optimizer.num_parameters} in {construction_s:.1f}s, construction peak RSS "
        f"{construction_peak / 2**30:.2f} GiB")
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, config.vocab_size, (micro_batch * groups.dp_size, seq_len + 1), generator=generator)
    rows = slice(groups.dp_rank * micro_batch, (groups.dp_rank + 1) * micro_batch)
    ids, labels = tokens[rows, :-1], tokens[rows, 1:]
    tiers = _nvme_tiers(optimizer)
    reset_peak_rss()
    losses, step_s, backward_s, update_s, read, written = [], [], [], [], [], []
    busy: dict[str, list] = {"read": [], "write": []}  # per step: this rank's I/O-in-flight intervals
    blocks: dict[str, list] = {"read": [], "write": []}  # per step: this rank's requests (start, end, bytes)
    for step in range(steps):
        read0, written0 = _moved(tiers)
        IO_BUSY.reset(keep_blocks=True)  # every request's timing, for the split by regime (io_regimes)
        start = time.perf_counter()
        loss = model.loss(ids, labels).mean()
        optimizer.backward(loss)
        optimizer.finish_backward()
        middle = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        for tier in tiers:
            tier.flush()  # the step's writes are part of the step
        end = time.perf_counter()
        value = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(value)
        losses.append(value.item() / groups.dp_size)
        step_s.append(end - start)
        backward_s.append(middle - start)
        update_s.append(end - middle)
        read1, written1 = _moved(tiers)
        read.append(read1 - read0)
        written.append(written1 - written0)
        for direction in busy:
            busy[direction].append(list(IO_BUSY.intervals[direction]))
            blocks[direction].append(list(IO_BUSY.blocks[direction]))
        say(f"step {step}: loss {losses[-1]:.6f}, {end - start:.1f}s (forward+backward {middle - start:.1f}s, "
            f"step {end - middle:.1f}s), read {read[-1] / 1e9:.2f} GB in {IO_BUSY.busy_s('read'):.1f}s of I/O, "
            f"wrote {written[-1] / 1e9:.2f} GB in {IO_BUSY.busy_s('write'):.1f}s of I/O, peak RSS {peak_rss_bytes() / 2**30:.2f} GiB")
    result = {
        "model": asdict(config), "zero": {"stage": zero.stage, "dtype": zero.dtype,
                                          "offload": zero.offload_optimizer.device,
                                          "bucket_numel": zero.bucket_numel},
        "psi": optimizer.num_parameters, "dp_size": groups.dp_size, "micro_batch": micro_batch, "seq_len": seq_len,
        "model_state_bytes": STATE_BYTES_PER_PARAM * optimizer.num_parameters,
        "ledger": {f"{k}/{t}": v for (k, t), v in optimizer.memory_ledger().bytes.items()},
        "construction_s": construction_s, "construction_peak_rss": construction_peak,
        "construction_block_bytes": optimizer.materializer.peak_block_bytes,
        "rss_start": rss_start, "train_peak_rss": peak_rss_bytes(), "swap_used": swap_used_bytes(),
        "losses": losses, "step_s": step_s, "backward_s": backward_s, "update_s": update_s,
        "bytes_read": read, "bytes_written": written, "lr": lr,
        "read_busy_intervals": busy["read"], "write_busy_intervals": busy["write"],
        "read_blocks": blocks["read"], "write_blocks": blocks["write"],
        "nvme_peak_buffer_bytes": sum(t.peak_buffer_bytes for t in tiers),
    }
    optimizer.close()
    return result
