"""The 1-GPU baseline of Megatron-LM's weak scaling (paper sec. 5.1.1) measured two ways, beside a plain GPT.

Repro's trainer (compiled layers, or eager) and a plain single-GPU GPT (the same GPT with no parallel step, compiled
whole, or eager) on the same configuration, batch and precision: each built and stepped once (compiled) by a
``prepare_*`` function, then either timed alone (``measure_*``, :func:`repro.training.throughput.measure_steps`) or,
for the comparison users can trust, timed in turn with the others in one process (:func:`run_alternated`: A B A B
A B, median and range of the repetitions). :mod:`repro.experiments.megatron_weak_scaling_gpu` declares the points.
"""

from __future__ import annotations

from repro.experiments.base import Point, RunContext

VARIANTS = ("repro", "repro_eager", "plain_compiled", "plain_eager")
METRICS = ("iteration_s", "tokens_per_s", "model_tflops_per_gpu", "share_of_peak", "peak_memory_gib", "setup_s",
           "loss", "tokens_per_s_vs_plain_compiled", "executed_tflops_per_gpu", "share_of_peak_executed",
           "repetition_iteration_s")
UNITS = {"iteration_s": "s", "tokens_per_s": "tokens/s", "model_tflops_per_gpu": "TFLOP/s", "share_of_peak": "%",
         "peak_memory_gib": "GiB", "setup_s": "s", "loss": "nats", "tokens_per_s_vs_plain_compiled": "x",
         "executed_tflops_per_gpu": "TFLOP/s", "share_of_peak_executed": "%", "repetition_iteration_s": "s"}


def runnable_variants(variants) -> list[str]:
    """``variants`` this torch can measure: repro's compiled layers (``repro``) need torch >= 2.5."""
    from repro.tensor_parallel.random import OPS_IN_GRAPH

    return [v for v in variants if v != "repro" or OPS_IN_GRAPH]


def measure_repro(params, config, device, groups, *, compiled: bool):
    """Repro's trainer built, stepped once and timed alone (:func:`repro.training.throughput.measure_trainer`)."""
    from repro.training.throughput import measure_trainer

    return measure_trainer(config, groups, repro_settings(params, device, compiled=compiled), device=device,
                           warmup=params["warmup"], iters=params["iters"])


def prepare_repro(params, config, device, groups, *, compiled: bool):
    """Repro's trainer built and stepped once, ready for :func:`repro.training.throughput.alternate`."""
    from repro.training.throughput import prepare_trainer

    return prepare_trainer(config, groups, repro_settings(params, device, compiled=compiled), device=device)


def repro_settings(params, device, *, compiled: bool):
    """The trainer's settings of a point: bf16 autocast, fp32 masters, clipping at 1.0, checkpointing as declared."""
    from repro.training.trainer import TrainSettings

    return TrainSettings(steps=1, micro_batches=1, micro_batch_size=params["micro_batch_size"],
                         seq_len=params["seq_len"], lr=1.5e-4, clip_grad=1.0, device=str(device),
                         precision=params["precision"], activation_checkpointing=params["checkpointing"],
                         compile_layers=compiled)


def prepare_plain(params, config, device, *, compiled: bool):
    """The plain GPT (:func:`repro.training.parallelize.build_plain_gpt`: the trainer's GPT with no parallel step),
    its fused AdamW and its step, built and stepped once."""
    import torch

    from repro.training.parallelize import build_plain_gpt
    from repro.training.throughput import Prepared, Stopwatch, model_flops

    b, s = params["micro_batch_size"], params["seq_len"]
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    with Stopwatch(device) as build:
        torch.manual_seed(0)
        model = build_plain_gpt(config, activation_checkpointing=params["checkpointing"]).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1.5e-4, betas=(0.9, 0.95),
                                      fused=True if device.type == "cuda" else None)

        def mean_loss(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return model.loss(ids, labels).mean()

        loss_fn = torch.compile(mean_loss) if compiled else mean_loss
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params["precision"])
    generator = torch.Generator().manual_seed(1234)
    batch = torch.randint(0, config.vocab_size, (b, s + 1), generator=generator).to(device)
    ids, labels = batch[:, :-1], batch[:, 1:]

    def step() -> torch.Tensor:  # as repro's step_lazy: the loss stays on the device, no step waits for the GPU
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.detach()

    model.train()
    with Stopwatch(device) as first:
        step()
    sizes = dict(global_batch=b, seq_len=s, num_layers=config.num_layers, hidden_size=config.hidden_size,
                 vocab_size=config.vocab_size)
    return Prepared(step, model_flops(**sizes, recompute=params["checkpointing"]), model_flops(**sizes, recompute=False),
                    b * s, build.s + first.s, None if before is None else torch.cuda.memory_allocated(device) - before)


def measure_plain(params, config, device, *, compiled: bool):
    """The plain GPT built, stepped once and timed alone."""
    from repro.training.throughput import measure_steps

    prepared = prepare_plain(params, config, device, compiled=compiled)
    result = measure_steps(prepared.step, device=device, flops_per_iteration=prepared.flops_per_iteration,
                           tokens_per_iteration=prepared.tokens_per_iteration, num_gpus=1, warmup=params["warmup"],
                           iters=params["iters"], setup_s=prepared.setup_s)
    del prepared
    return result


def run_alternated(point: Point, ctx: RunContext, params, config, device, groups, fixed, peak) -> list[dict]:
    """The 1-GPU comparison users can trust: every variant built (and compiled) first, then timed in turn, A B A B ...,
    ``repetitions`` times (:func:`repro.training.throughput.alternate`), in one process. A variant's rows give the
    median over the repetitions as ``value`` and their range as ``value_min`` / ``value_max``; the ratio to the plain
    GPT is the ratio of the medians (its range: the lowest and highest ratio of one repetition's pair). The share of
    peak is given twice: by the paper's formula (``share_of_peak``: 96 B s l h^2 (...), the recomputation counted
    under checkpointing) and by the FLOPs of one forward and one backward (``share_of_peak_executed``: 72 instead of
    96, model FLOPs utilisation's count; a recomputation the kernels run is not model work)."""
    import torch

    from repro.training.throughput import alternate, release

    names = [v for v in params["variants"] if v in runnable_variants([v])]
    for skipped in sorted(set(params["variants"]) - set(names)):
        print(f"[{point.name}] variant {skipped!r} not run: compiled transformer layers need torch >= 2.5 "
              f"(this torch is {torch.__version__})", flush=True)
    if ctx.world_size > 1 and any(v.startswith("plain") for v in names):
        raise ValueError(f"the plain GPT is single-GPU; point {point.name!r} has {ctx.world_size} ranks")
    repetitions = params["repetitions"]
    common = dict(fixed, repetitions=repetitions, alternated_with=",".join(names))
    prepared, rows = {}, []

    def emit(new: list[dict]) -> None:  # written now (a time limit keeps them) and returned (the runner's rule)
        ctx.emit_rows(new)
        rows.extend(new)

    for variant in names:
        if variant in ("repro", "repro_eager"):
            prepared[variant] = prepare_repro(params, config, device, groups, compiled=variant == "repro")
        elif variant in ("plain_compiled", "plain_eager"):
            prepared[variant] = prepare_plain(params, config, device, compiled=variant == "plain_compiled")
        else:
            raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
        emit([dict(metric="setup_s", value=prepared[variant].setup_s, unit="s", variant=variant, **common)])

    def repetition_done(variant: str, k: int, seconds: float) -> None:
        emit([dict(metric="repetition_iteration_s", value=seconds, unit="s", variant=variant, repetition=k + 1,
                   **common)])

    measured = alternate(prepared, device=device, warmup=params["warmup"], iters=params["iters"],
                         repetitions=repetitions, num_gpus=groups.world_size, on_repetition=repetition_done)
    del prepared
    release(device)
    for variant, result in measured.items():
        spreads = {"iteration_s": result.iteration_s, "tokens_per_s": result.tokens_per_s,
                   "model_tflops_per_gpu": result.model_tflops_per_gpu,
                   "executed_tflops_per_gpu": result.executed_tflops_per_gpu}
        if peak is not None:
            for share, tflops in (("share_of_peak", "model_tflops_per_gpu"),
                                  ("share_of_peak_executed", "executed_tflops_per_gpu")):
                spread = spreads[tflops]
                spreads[share] = type(spread)(*(100 * v * 1e12 / peak.peak_flops
                                                for v in (spread.median, spread.min, spread.max)))
        done = [dict(metric=name, value=float(spread.median), unit=UNITS[name], variant=variant,
                     value_min=float(spread.min), value_max=float(spread.max), **common)
                for name, spread in spreads.items()]
        done += [dict(metric="loss", value=result.last_loss, unit="nats", variant=variant, **common)]
        if result.peak_memory_gib is not None:
            done.append(dict(metric="peak_memory_gib", value=result.peak_memory_gib, unit="GiB", variant=variant,
                             **common))
        emit(done)
    if "plain_compiled" in measured:
        plain = measured["plain_compiled"]
        for variant, result in measured.items():
            pairs = [p / r for r, p in zip(result.repetition_s, plain.repetition_s)]  # tokens/s ratio per pair
            rows.append(dict(metric="tokens_per_s_vs_plain_compiled", unit="x", variant=variant,
                             value=result.tokens_per_s.median / plain.tokens_per_s.median,
                             value_min=min(pairs), value_max=max(pairs), **common))
    return rows


