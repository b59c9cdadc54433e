"""What the next decisions about the 1-GPU step and GNA's kernel need, measured in one command within 9 minutes.

``python -m repro.gpu_probe --out DIR [--budget-s 505] [--toy]`` (or, with provenance and a hard deadline,
``python -m repro.gpu_session --plan probe``) measures on this machine's device, in order, each section skipped
(saying so) when less of the budget is left than it needs:

1. ``gemm``: bf16 GEMM rates at the 1.2B model's shapes (paper sec. 5.1.1: 8 x 1024 tokens, hidden 1536, vocabulary
   51200): the forward's QKV, attention output, FC1, FC2 and logits products and their backward's (input gradient,
   weight gradient), as TFLOP/s and share of the datasheet peak;
2. ``sdpa``: which SDPA kernel runs the model's attention (causal, 16 heads of 96) with and without dropout (the
   aten operation SDPA dispatches), and every backend's forward + backward time or its refusal;
3. ``step``: the trainer's 1.2B step (compiled layers, checkpointing, bf16, clipping at 1.0) under the profiler, two
   steady-state steps: per phase its device span, kernel time, idle time and kernel count
   (:func:`repro.training.step_probe.profile_phases`);
4. ``optimizer``: that step's optimizer three ways (per parameter; flat with the clipping as a multiplication; flat
   with it folded into fused AdamW's ``grad_scale``), host and GPU time apart, against the HBM floor at a measured
   bandwidth (:func:`repro.training.step_probe.optimizer_variants`);
5. ``variants``: the trainer with one setting changed, each timed in turn with the baseline (A B A B A B): the
   per-parameter optimizer, autocast's weight casts (recast in the recomputation), the final layer norm eager;
6. ``gna``: GNA's Flex kernel at FLUX 4K and HunyuanVideo (forward; FLUX forward + backward) with today's options,
   with an all-full block mask (Flex's dense speed per tile), with Triton's options one at a time and with the
   FLASH backend where importable (:mod:`repro.gna.kernel_probe`).

Rows (``metric``, ``value``, ``unit``, the section as ``point``, ``variant``, the GPU's name, provenance) are appended
to a result run of ``gpu_probe`` under the results folder (``$REPRO_RESULTS_DIR``; the session sets it to
``DIR/results``) as each result comes. ``--toy``: the rehearsal's sizes on the CPU (a 2-layer GPT, eager; a toy GNA
grid), every section through the same code.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch

EXPERIMENT = "gpu_probe"
FULL = dict(layers=40, hidden=1536, heads=16, vocab=51200, seq=1024, batch=8)
TOY = dict(layers=2, hidden=64, heads=4, vocab=512, seq=32, batch=2)
#: (section, seconds it needs at full size, at toy size), in order of value
SECTIONS = (("gemm", 20, 5), ("sdpa", 20, 5), ("step", 60, 20), ("optimizer", 30, 10), ("variants", 100, 30),
            ("gna", 60, 10))
#: the trainer's settings changed one at a time against the baseline
VARIANTS = {"per_parameter_optimizer": {"flat_buffers": False}, "weight_casts_autocast": {"weight_casts": "autocast"},
            "final_norm_eager": {"final_norm_in_loss": False}}
_UNITS = (("_ms", "ms"), ("_s", "s"), ("tflops", "TFLOP/s"), ("_gib", "GiB"), ("share_of_peak", "%"),
          ("kernels", "count"), ("bandwidth", "GB/s"))


def _unit(metric: str) -> str:
    return next((unit for suffix, unit in _UNITS if metric.endswith(suffix)), "x")


class Probe:
    """The budget's clock and the rows: each result appended to the run as it comes, and printed."""

    def __init__(self, out: Path, budget_s: float, size: dict, device: torch.device, *, toy: bool) -> None:
        from repro.provenance import new_run_id, provenance
        from repro.results import results_dir

        self.out, self.budget_s, self.start = out, budget_s, time.monotonic()
        self.size, self.device, self.toy = size, device, toy
        self.run_id = new_run_id()
        self.root = results_dir()
        self.prov = provenance(config=dict(size, toy=toy), world_size=1, device=device.type, elapsed_s=0.0)
        self.gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        out.mkdir(parents=True, exist_ok=True)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def deadline(self) -> float:
        """The budget's end as ``time.perf_counter()`` seconds."""
        return time.perf_counter() + self.left_s()

    def fits(self, section: str, need_s: float) -> bool:
        if self.left_s() >= need_s:
            return True
        self.emitter(section)("skipped", {"skipped": None},
                              {"note": f"{self.left_s():.0f} s left of the budget, needs ~{need_s:.0f} s"})
        return False

    def emitter(self, section: str) -> Callable[[str, dict, dict], None]:
        """``emit(variant, {metric: value}, {field: value})`` for ``section``."""
        from repro.results import append_rows

        def emit(variant: str, values: dict, fields: dict) -> None:
            rows = [dict(metric=metric, value=None if value is None else float(value), unit=_unit(metric),
                         section=section, variant=variant, gpu=self.gpu, **fields)
                    for metric, value in values.items()]
            append_rows(self.root, experiment=EXPERIMENT, scale="toy" if self.toy else "paper", point=section,
                        run_id=self.run_id, rows=rows, prov=self.prov)
            shown = ", ".join([f"{k} {v:.4g}" for k, v in values.items() if v is not None]
                              + [f"{k} {fields[k]}" for k in ("kernel", "flex_kernel", "fastest") if k in fields])
            note = fields.get("note")
            print(f"[{section}] {variant}: {shown}" + (f" ({note})" if note else ""), flush=True)

        return emit


def section_gemm(probe: Probe) -> None:
    from repro.perfmodel.gpus import gpu_peak
    from repro.timing import time_iterations

    s, device = probe.size, probe.device
    tokens, h, v = s["batch"] * s["seq"], s["hidden"], s["vocab"]
    shapes = {"qkv": (tokens, h, 3 * h), "attention_out": (tokens, h, h), "fc1": (tokens, h, 4 * h),
              "fc2": (tokens, 4 * h, h), "logits": (tokens, h, v),
              "qkv_dgrad": (tokens, 3 * h, h), "fc1_dgrad": (tokens, 4 * h, h), "fc2_dgrad": (tokens, h, 4 * h),
              "logits_dgrad": (tokens, v, h), "qkv_wgrad": (3 * h, tokens, h), "fc1_wgrad": (4 * h, tokens, h),
              "fc2_wgrad": (h, tokens, 4 * h), "logits_wgrad": (v, tokens, h)}
    peak = gpu_peak(device).peak_flops if device.type == "cuda" else None
    emit = probe.emitter("gemm")
    for name, (m, k, n) in shapes.items():
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        seconds = time_iterations(lambda: a @ b, device=device, warmup=3, iters=10 if not probe.toy else 3).median_s
        rate = 2 * m * k * n / seconds
        values = {"ms": 1e3 * seconds, "tflops": rate / 1e12}
        if peak is not None:
            values["share_of_peak"] = 100 * rate / peak
        emit(name, values, {"m": m, "k": k, "n": n})
        del a, b


def _sdpa_dispatched(fn: Callable[[], object]) -> str:
    """The SDPA implementation ``fn`` dispatched (the aten operation's name), '' when none was named."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            if "scaled_dot_product" in name and "backward" not in name:
                seen.append(name.removeprefix("aten."))
            return func(*args, **(kwargs or {}))

    with Names():
        fn()
    return seen[0] if seen else "math (decomposed)"


def section_sdpa(probe: Probe) -> None:
    import torch.nn.functional as F

    from repro.gna.dense_baseline import sdpa_backends
    from repro.timing import time_iterations

    s, device = probe.size, probe.device
    head_dim = s["hidden"] // s["heads"]
    shape = (s["batch"], s["heads"], s["seq"], head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    flops = 3.5 * 4 * s["batch"] * s["heads"] * s["seq"] ** 2 * head_dim / 2  # causal: half the pairs
    emit = probe.emitter("sdpa")
    for dropout in (0.0, 0.1):
        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
            out.sum().backward()

        emit(f"dropout_{dropout}_default", {"chosen": 1.0}, {"dropout": dropout, "kernel": _sdpa_dispatched(step)})
        for backend in sdpa_backends():
            def forced(backend=backend):
                with backend.context():
                    step()
            try:
                seconds = time_iterations(forced, device=device, warmup=2, iters=5 if not probe.toy else 2).median_s
            except (RuntimeError, NotImplementedError, ValueError) as err:
                emit(f"dropout_{dropout}_{backend.name}", {"fwd_bwd_ms": None},
                     {"dropout": dropout, "note": " ".join(str(err).split())[:200] or type(err).__name__})
                continue
            emit(f"dropout_{dropout}_{backend.name}", {"fwd_bwd_ms": 1e3 * seconds, "tflops": flops / seconds / 1e12},
                 {"dropout": dropout})


def _config(size: dict):
    from repro.models.config import GPTConfig

    return GPTConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], num_layers=size["layers"],
                     num_attention_heads=size["heads"], max_position_embeddings=size["seq"],
                     hidden_dropout=0.1, attention_dropout=0.1)


def baseline_settings(probe: Probe) -> dict:
    """The 1-GPU baseline's trainer settings (megatron_weak_scaling_gpu's ``1p2B_1gpu``), eager at toy size."""
    s = probe.size
    return dict(steps=1, micro_batches=1, micro_batch_size=s["batch"], seq_len=s["seq"], lr=1.5e-4, clip_grad=1.0,
                device=probe.device.type, precision="bf16", activation_checkpointing=True,
                compile_layers=not probe.toy)


def section_step(probe: Probe):
    """Build the baseline trainer, profile its steady-state step; returns it prepared (the next sections use it)."""
    from repro.dist.groups import init_parallel
    from repro.training.settings import TrainSettings
    from repro.training.step_probe import profile_phases
    from repro.training.throughput import prepare_trainer

    prepared = prepare_trainer(_config(probe.size), init_parallel(), TrainSettings(**baseline_settings(probe)),
                               device=probe.device)
    emit = probe.emitter("step")
    emit("baseline", {"first_step_s": prepared.setup_s}, {})
    s = probe.size
    batch = torch.randint(0, s["vocab"], (s["batch"], s["seq"] + 1), generator=torch.Generator().manual_seed(1234))
    profile_phases(prepared.owner, batch, emit, device=probe.device)
    return prepared


def section_gna(probe: Probe) -> None:
    from repro.experiments.gna_speedup_gpu import CONFIGS
    from repro.gna.gpu_config import heads_that_fit
    from repro.gna.kernel_probe import probe_flex_options

    emit = probe.emitter("gna")
    if probe.toy:
        plan = [("toy2d_w16x16_s8x16", False)]
    else:
        plan = [("flux1dev_4k_w80x80_s16x16", False), ("hunyuanvideo_w18x24x24_s16x8x8", False),
                ("flux1dev_4k_w80x80_s16x16", True)]
    memory = torch.cuda.get_device_properties(probe.device).total_memory / 2**30 if probe.device.type == "cuda" else 0
    for index, (name, backward) in enumerate(plan):
        config = CONFIGS[name]
        if probe.device.type == "cuda":
            import dataclasses

            config = dataclasses.replace(config, heads=heads_that_fit(config, backward=backward, dtype=torch.bfloat16,
                                                                      memory_gib=memory))
        # each problem gets its share of what is left; the last takes the rest
        share = time.perf_counter() + probe.left_s() / (len(plan) - index)
        probe_flex_options(config, backward=backward, device=probe.device, deadline=share,
                           emit=lambda variant, values, fields: emit(variant, values, fields),
                           iters=10 if not probe.toy else 2)
        if probe.device.type == "cuda":
            torch.cuda.empty_cache()


def run(probe: Probe) -> None:
    from repro.dist.groups import init_parallel
    from repro.training.step_probe import optimizer_variants, trainer_variants
    from repro.training.throughput import release

    prepared = None
    for name, full_s, toy_s in SECTIONS:
        if not probe.fits(name, toy_s if probe.toy else full_s):
            continue
        if name == "gemm":
            section_gemm(probe)
        elif name == "sdpa":
            section_sdpa(probe)
        elif name == "step":
            prepared = section_step(probe)
        elif name == "optimizer" and prepared is not None:
            optimizer_variants(prepared.owner, probe.emitter("optimizer"), device=probe.device)
        elif name == "variants":
            need = 15 if probe.toy else 45
            trainer_variants(_config(probe.size), baseline_settings(probe), VARIANTS, probe.emitter("variants"),
                             groups=init_parallel(), device=probe.device, warmup=1 if probe.toy else 3,
                             iters=2 if probe.toy else 10, repetitions=3, deadline=probe.deadline(), need_s=need,
                             base=prepared)
            prepared = None
            release(probe.device)
        elif name == "gna":
            section_gna(probe)


def main(argv: list[str] | None = None) -> int:
    from repro.cliargs import OneLineParser, positive_float
    from repro.paths import writable_dir_problem

    parser = OneLineParser(prog="python -m repro.gpu_probe", description=__doc__.split("\n")[0],
                           epilog="\n".join(__doc__.split("\n")[2:]))
    parser.add_argument("--out", required=True, help="folder for this probe's files (created)")
    parser.add_argument("--budget-s", type=positive_float, default=505.0,
                        help="seconds for all sections; a section that would not fit is skipped (default 505)")
    parser.add_argument("--toy", action="store_true", help="the rehearsal's toy sizes (a 2-layer GPT, eager)")
    args = parser.parse_args(argv)
    problem = writable_dir_problem(args.out)
    if problem is not None:
        parser.error(f"--out {args.out} {problem}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run(Probe(Path(args.out), args.budget_s, TOY if args.toy else FULL, device, toy=args.toy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
