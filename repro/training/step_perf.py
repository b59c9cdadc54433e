"""The 1-GPU training step taken apart, before and after each change that made it faster.

``python -m repro.training.step_perf --out DIR [--budget-s 270] [--toy]`` measures, on this machine's device, the
model of Megatron's 1-GPU baseline (paper sec. 5.1.1: GPT 1.2B, 40 layers, hidden 1536, 16 heads, seq 1024, micro-batch
8, bf16, activation checkpointing; ``--toy``: a 2-layer model, the rehearsal's size), in sections that each write
their rows the moment they end and are skipped when less of the budget is left than they need:

1. ``step``: the trainer with compiled layers: seconds per iteration of ``step_lazy`` (no host sync) and of ``step``
   (one), the device time of each phase (forward, loss, backward, optimizer), host syncs (CUDA's sync debug mode),
   peak memory, model TFLOP/s by the paper's formula;
2. ``grad_norm``: the gradient norm and clipping before (a per-parameter fp64 loop, a host sync, a host factor) and
   after (foreach norms, a device factor), on the step's own gradients;
3. ``cross_entropy``: the vocab-parallel cross-entropy before (fp32 copy, fp32 softmax saved) and after (the logits
   saved as they come), forward + backward on [b*s, V] bf16 logits: time and memory held from forward to backward;
4. ``recompute``: four transformer layers, forward + backward, with ``checkpoint(compiled layer)`` (before),
   :class:`~repro.training.recompute.CompiledCheckpointed` (after) and no checkpoint: time per layer, peak memory.

Rows (``metric``, ``value``, ``unit``, ``section``, ``variant``, provenance) go to ``DIR/step_perf.jsonl``; the
``perf`` plan of ``python -m repro.gpu_session`` runs this within its deadline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

FULL = dict(layers=40, hidden=1536, heads=16, vocab=51200, seq=1024, batch=8)
TOY = dict(layers=2, hidden=64, heads=4, vocab=512, seq=32, batch=2)


class Report:
    """Rows with provenance, appended to ``out/step_perf.jsonl`` as they come; the budget's clock."""

    def __init__(self, out: Path, budget_s: float, size: dict, device: torch.device) -> None:
        from repro.provenance import new_run_id, provenance

        self.path, self.budget_s, self.start = out / "step_perf.jsonl", budget_s, time.monotonic()
        self.run_id = new_run_id()
        self.prov = provenance(config=size, world_size=1, device=device.type, elapsed_s=0.0)
        out.mkdir(parents=True, exist_ok=True)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def fits(self, section: str, need_s: float) -> bool:
        if self.left_s() >= need_s:
            return True
        self.rows(section, "skipped", {"skipped": (1, f"{self.left_s():.0f} s left, needs ~{need_s:.0f} s")})
        return False

    def rows(self, section: str, variant: str, values: dict[str, tuple[float, str]]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            for metric, (value, unit) in values.items():
                if value is None:  # not measurable on this device
                    continue
                row = dict(metric=metric, value=value, unit=unit, section=section, variant=variant,
                           run_id=self.run_id, provenance=self.prov)
                handle.write(json.dumps(row) + "\n")
        shown = ", ".join(f"{k} {v:.4g} {u}" if isinstance(v, (int, float)) else f"{k}: {u}"
                          for k, (v, u) in values.items() if v is not None)
        print(f"[{section}] {variant}: {shown}", flush=True)


def _median_s(fn: Callable[[], object], device: torch.device, iters: int, warmup: int = 2) -> float:
    from repro.timing import time_iterations

    return time_iterations(fn, device=device, warmup=warmup, iters=iters).median_s


def _peak_gib(device: torch.device, fn: Callable[[], object]) -> float | None:
    """Peak device memory while ``fn`` runs, above what was allocated before (None off a GPU)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**30


def _config(size: dict, layers: int | None = None):
    from repro.models.config import GPTConfig

    return GPTConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], num_layers=layers or size["layers"],
                     num_attention_heads=size["heads"], max_position_embeddings=size["seq"])


def section_step(report: Report, size: dict, device: torch.device, iters: int) -> torch.nn.Module:
    """The trainer's step as the baseline runs it; returns the trainer's stage (its gradients feed section 2)."""
    from repro.dist.groups import init_parallel
    from repro.perfmodel.gpus import gpu_peak
    from repro.training.phases import PhaseMarks
    from repro.training.settings import TrainSettings
    from repro.training.throughput import model_flops
    from repro.training.trainer import PipelineTrainer

    settings = TrainSettings(steps=1, micro_batches=1, micro_batch_size=size["batch"], seq_len=size["seq"],
                             lr=1.5e-4, clip_grad=1.0, device=device.type, precision="bf16",
                             activation_checkpointing=True, compile_layers=True)
    trainer = PipelineTrainer(_config(size), init_parallel(), settings)
    batch = torch.randint(0, size["vocab"], (size["batch"], size["seq"] + 1),
                          generator=torch.Generator().manual_seed(1234))
    started = time.perf_counter()
    float(trainer.step_lazy(batch))
    first_s = time.perf_counter() - started
    lazy_s = _median_s(lambda: trainer.step_lazy(batch), device, iters)
    read_s = _median_s(lambda: trainer.step(batch), device, iters)
    flops = model_flops(global_batch=size["batch"], seq_len=size["seq"], num_layers=size["layers"],
                        hidden_size=size["hidden"], vocab_size=size["vocab"], recompute=True)
    values = {"first_step_s": (first_s, "s"), "iteration_s": (lazy_s, "s"), "iteration_s_reading_loss": (read_s, "s"),
              "model_tflops": (flops / lazy_s / 1e12, "TFLOP/s")}
    peak = gpu_peak(device) if device.type == "cuda" else None
    if peak is not None:
        values["share_of_peak"] = (100 * flops / lazy_s / peak.peak_flops, "%")
    with PhaseMarks(device, trainer) as marks:
        trainer.step_lazy(batch)
    values.update({f"phase_{name}_ms": (ms, "ms") for name, ms in marks.milliseconds().items()})
    values["host_syncs_step"] = (_cuda_syncs(device, lambda: trainer.step(batch)), "count")
    values["host_syncs_step_lazy"] = (_cuda_syncs(device, lambda: trainer.step_lazy(batch)), "count")
    memory = _peak_gib(device, lambda: trainer.step_lazy(batch))
    if memory is not None:
        values["peak_memory_gib"] = (memory + torch.cuda.memory_allocated(device) / 2**30, "GiB")
    report.rows("step", "repro_compiled_ckpt", values)
    return trainer.stage


def _cuda_syncs(device: torch.device, fn: Callable[[], object]) -> float | None:
    """Host syncs inside ``fn`` as CUDA's sync debug mode reports them (None off a GPU: the census tests count
    them there)."""
    import warnings

    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return float(sum("synchroniz" in str(w.message) for w in caught))


def section_grad_norm(report: Report, stage: torch.nn.Module, device: torch.device, iters: int) -> None:
    from repro.dist.comm import CommGroup
    from repro.training.grads import clip_grad_norm_
    from repro.training.reference_steps import clip_grad_norm_loop

    single = CommGroup.single("tp")
    saved = [p.grad.clone() for p in stage.parameters() if p.grad is not None]
    for variant, clip in (("before_fp64_loop_host_sync", clip_grad_norm_loop), ("after_foreach_on_device",
                                                                                clip_grad_norm_)):
        ms = 1e3 * _median_s(lambda: clip(stage, 1e-3, tp_group=single, pp_group=single), device, iters)
        report.rows("grad_norm", variant, {"ms": (ms, "ms"), "host_syncs": (_cuda_syncs(
            device, lambda: clip(stage, 1e-3, tp_group=single, pp_group=single)), "count")})
    for p, grad in zip((p for p in stage.parameters() if p.grad is not None), saved):
        p.grad = grad


def section_cross_entropy(report: Report, size: dict, device: torch.device, iters: int) -> None:
    from repro.tensor_parallel import vocab_parallel_cross_entropy
    from repro.training.reference_steps import saved_softmax_cross_entropy

    tokens = size["batch"] * size["seq"]
    logits = torch.randn(tokens, size["vocab"], device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, size["vocab"], (tokens,), device=device)
    for variant, loss_fn in (("before_fp32_softmax_saved", saved_softmax_cross_entropy),
                             ("after_logits_saved", vocab_parallel_cross_entropy)):
        held = _peak_gib(device, lambda: loss_fn(logits, target))  # the forward, its saved tensors included
        ms = 1e3 * _median_s(lambda: loss_fn(logits, target).mean().backward(), device, iters)
        values = {"fwd_bwd_ms": (ms, "ms")}
        if held is not None:
            values["forward_peak_gib"] = (held, "GiB")
        report.rows("cross_entropy", variant, values)
    del logits


def section_recompute(report: Report, size: dict, device: torch.device, iters: int, layers: int = 4) -> None:
    from repro.dist.comm import CommGroup
    from repro.models.transformer import TransformerLayer
    from repro.tensor_parallel import RNGTracker
    from repro.training.recompute import CompiledCheckpointed, Checkpointed
    from repro.training.throughput import release

    config = _config(size, layers)
    x = torch.randn(size["batch"], size["seq"], size["hidden"], device=device, requires_grad=True)
    for variant in ("before_checkpoint_of_compiled", "after_compiled_checkpoint", "no_checkpoint"):
        tracker = RNGTracker(seed=0, tp_rank=0, device=device.type)
        built = []
        for _ in range(layers):
            layer = TransformerLayer(config, group=CommGroup.single("tp"), causal=True, pre_norm=True,
                                     rng_tracker=tracker).to(device)
            if variant == "after_compiled_checkpoint":
                layer = CompiledCheckpointed(layer)
                layer.compile()
            else:
                layer.compile()
                layer = Checkpointed(layer, tracker) if variant.startswith("before") else layer
            built.append(layer)

        def fwd_bwd():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = x
                for layer in built:
                    y = layer(y)
            y.float().square().mean().backward()

        started = time.perf_counter()
        fwd_bwd()
        compile_s = time.perf_counter() - started
        ms = 1e3 * _median_s(fwd_bwd, device, iters) / layers
        values = {"ms_per_layer": (ms, "ms"), "compile_s": (compile_s, "s")}
        memory = _peak_gib(device, fwd_bwd)
        if memory is not None:
            values["peak_gib"] = (memory, "GiB")
        report.rows("recompute", variant, values)
        del built
        release(device)


#: (section, seconds it needs at full size, at toy size)
SECTIONS = (("step", 120, 60), ("grad_norm", 10, 5), ("cross_entropy", 15, 5), ("recompute", 110, 60))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.training.step_perf", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[2:]))
    parser.add_argument("--out", type=Path, required=True, help="folder for step_perf.jsonl (created)")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="seconds for all sections; a section that would not fit is skipped (default 270)")
    parser.add_argument("--toy", action="store_true", help="a 2-layer model instead of the 1.2B one (rehearsal)")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per measurement (default 10)")
    args = parser.parse_args(argv)
    if not args.budget_s > 0 or args.iters < 1:
        parser.exit(2, f"{parser.prog}: error: --budget-s must be > 0 and --iters >= 1 "
                       f"(got {args.budget_s!r}, {args.iters!r})\n")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = TOY if args.toy else FULL
    report = Report(args.out, args.budget_s, size, device)
    stage = None
    for name, full_s, toy_s in SECTIONS:
        if not report.fits(name, toy_s if args.toy else full_s):
            continue
        if name == "step":
            stage = section_step(report, size, device, args.iters)
        elif name == "grad_norm" and stage is not None:
            section_grad_norm(report, stage, device, args.iters)
        elif name == "cross_entropy":
            section_cross_entropy(report, size, device, args.iters)
        elif name == "recompute":
            stage = None
            section_recompute(report, size, device, args.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
