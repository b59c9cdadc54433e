"""What a GPU session measures, as data: each plan is its parts in order of value, with limits that add up to the
deadline (540 s on a GPU; 170 s for the CPU rehearsal of the same parts at toy sizes). Run by
:mod:`repro.gpu_session` (``--plan NAME``).

* ``headline``: provenance; Megatron's 1.2B baseline on 1 GPU (paper sec. 5.1.1): repro's compiled layers and the
  plain GPT compiled whole, built in one process and timed in turn three times (median and range of each); GNA at
  FLUX 4K and HunyuanVideo (GNA sec. 5), forward then forward + backward, against the fastest dense SDPA backend; the
  tests marked ``cuda``.
* ``zero_offload``: ZeRO-Offload's largest model on one GPU (``zero_gpu``'s ``offload_1gpu``: stage 2 with the
  optimizer on the CPU beside the same stage without offload; its arms' time caps add up to 450 s).
* ``node``: the ``node`` scale of ``megatron_weak_scaling_gpu`` beyond the headline: the 1.2B baseline without
  activation checkpointing (repro and the plain GPT, alternated), the 2-8 GPU points (Table 1's models, Table 8's
  strong scaling) that fit the machine (those that need more GPUs are reported as skipped), and repro eager.
* ``perf``: the 1.2B step taken apart (:mod:`repro.training.step_perf`): its phases, host syncs and memory, and the
  gradient norm, cross-entropy and recomputation before and after they moved to the device (within 5 minutes).
* ``probe``: what the next decisions need (:mod:`repro.gpu_probe`, within 9 minutes): GEMM rates at the model's
  shapes, which SDPA kernel runs with and without dropout, each optimizer variant's GPU and host time, the step's
  steady-state phases from a profile, the trainer's variants against its baseline (alternated), and GNA's Flex kernel
  options against its all-full block mask (Flex's dense speed per tile) and the FLASH backend where importable.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DEADLINE_S = 540.0
REHEARSAL_DEADLINE_S = 170.0
#: The rehearsal checks that every part's code runs, not how fast a CPU is: its limits (and deadline) stretch by this
#: factor, so that a 2-core machine at load 8 (each part ~4-5x slower, compile caches cold) still finishes. Its
#: own limits are the toy sizes' times on an idle 2-core machine with margin; the GPU plan's come from GPU runs.
REHEARSAL_SLACK = 6.0
#: GNA's first configurations (forward, then forward + backward): §5's FLUX 4K and HunyuanVideo.
GNA_POINTS = ("flux1dev_4k_w80x80_s16x16_fwd", "hunyuanvideo_w18x24x24_s16x8x8_fwd",
              "flux1dev_4k_w80x80_s16x16_fwd_bwd", "hunyuanvideo_w18x24x24_s16x8x8_fwd_bwd")
#: ``node`` points on 2-8 GPUs (Table 1's models on 2/4/8 GPUs, Table 8's strong scaling of the 1.2B model).
MULTI_GPU_POINTS = ("2p5B_2gpu", "1p2B_2gpu_strong", "4p2B_4gpu", "1p2B_4gpu_strong", "8p3B_8gpu",
                    "1p2B_8gpu_strong")
PLANS = ("headline", "zero_offload", "node", "perf", "probe")


@dataclass(frozen=True)
class Part:
    """One bounded step: ``argv`` runs in its own process group, stopped at ``limit_s``; skipped when less than
    ``min_s`` of the deadline is left, when this torch is older than ``needs_torch`` (``(version, feature)``), or
    when the machine has fewer GPUs than ``needs_gpus``.
    ``env`` is added to the session's environment."""

    name: str
    limit_s: float
    min_s: float
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""
    needs_torch: tuple[tuple[int, int], str] | None = None
    needs_gpus: int = 0


#: GNA on a GPU compiles FlexAttention, which torch has from 2.5
FLEX = ((2, 5), "FlexAttention")
#: the trainer's compiled transformer layers (repro.tensor_parallel.random.COMPILED_LAYERS_TORCH)
COMPILED_LAYERS = ((2, 5), "compiled transformer layers")


def _points(*names: str) -> tuple[str, ...]:
    return tuple(arg for name in names for arg in ("--point", name))


def parts(name: str, out: Path, *, rehearse: bool, run_id: str) -> list[Part]:
    """The parts of plan ``name`` (one of :data:`PLANS`). Rehearsal: the same experiments' toy points on the CPU,
    with ``REPRO_STANDIN_GPUS`` standing in for the GPUs."""
    if name not in PLANS:
        raise ValueError(f"unknown plan {name!r}; the plans are {', '.join(PLANS)}")
    py = sys.executable
    megatron = (py, "-m", "repro.harness.worker", "megatron_weak_scaling_gpu", "--device", "cuda",
                "--run-id", run_id, "--results-dir", str(out / "results"))
    run = (py, "-m", "repro", "run")
    provenance = (py, "-m", "repro.gpu_session", "--provenance", str(out / "provenance.json"))
    one = {"REPRO_STANDIN_GPUS": "1"} if rehearse else {}
    first = Part("provenance", 10 if rehearse else 15, 3, provenance, one,
                 "this machine (CPU stand-in)" if rehearse else "GPU, driver, torch, CUDA, cuDNN, triton")
    # the toy 1-GPU baseline both rehearsals run: repro's compiled layers and the plain GPT compiled whole, alternated
    toy_repro = Part("megatron_1gpu", 90, 30, megatron + ("--scale", "smoke", "--point", "toy_1rank"), one,
                     "toy GPT: repro compiled layers and the plain GPT compiled whole, A B A B A B")
    toy_eager = Part("megatron_eager", 25, 8, megatron + ("--scale", "smoke", "--point", "toy_1rank_eager"), one,
                     "toy GPT: repro eager")
    if name == "zero_offload":
        point = ("--scale", "smoke", "--point", "search_1rank") if rehearse else (
            "--scale", "paper", "--point", "offload_1gpu")
        return [first, Part("zero_offload", 160 if rehearse else 525, 20 if rehearse else 120,
                            run + ("zero_gpu", "--device", "cuda") + point, one,
                            "ZeRO-Offload: the largest model on one GPU, offloaded and not")]
    if name == "perf":
        # the rehearsal's sections are never skipped for a busy CPU: its budget stretches as its limit does
        budget = ("--toy", "--budget-s", f"{120 * REHEARSAL_SLACK:.0f}", "--iters", "3") if rehearse else (
            "--budget-s", "270")
        return [first, Part("step_perf", 150 if rehearse else 290, 30 if rehearse else 90,
                            (py, "-m", "repro.training.step_perf", "--out", str(out)) + budget, one,
                            "the 1.2B step's phases and syncs; grad norm, cross-entropy and recompute before/after",
                            COMPILED_LAYERS)]
    if name == "probe":
        # every section's budget stretches with the rehearsal's limit: the rehearsal checks the code, at toy sizes
        budget = ("--toy", "--budget-s", f"{140 * REHEARSAL_SLACK:.0f}") if rehearse else ("--budget-s", "505")
        return [first, Part("probe", 150 if rehearse else 520, 40 if rehearse else 200,
                            (py, "-m", "repro.gpu_probe", "--out", str(out)) + budget, one,
                            "GEMM rates, SDPA kernels, optimizer variants, the step's phases and variants, GNA's "
                            "kernel options", COMPILED_LAYERS)]
    if name == "node":
        if rehearse:
            return [first, Part("megatron_no_ckpt", 70, 30, megatron + ("--scale", "smoke", "--point", "toy_1rank"),
                                one, "toy GPT: repro and the plain GPT, A B A B A B"),
                    Part("multi_gpu", 50, 10, megatron + ("--scale", "smoke", "--point", "toy_tp2"),
                         {"REPRO_STANDIN_GPUS": "2"}, "toy GPT at tp 2 on 2 stand-in GPUs", needs_gpus=2), toy_eager]
        return [first,
                Part("megatron_no_ckpt", 250, 200, megatron + ("--scale", "node", "--point", "1p2B_1gpu_no_ckpt"),
                     what="1.2B GPT on 1 GPU without activation checkpointing: repro compiled layers and the plain "
                          "GPT compiled whole, A B A B A B"),
                Part("multi_gpu", 210, 60, run + ("megatron_weak_scaling_gpu", "--scale", "node", "--device", "cuda")
                     + _points(*MULTI_GPU_POINTS), what="the 2-8 GPU points that fit this machine", needs_gpus=2),
                Part("megatron_eager", 60, 40, megatron + ("--scale", "node", "--point", "1p2B_1gpu_eager"),
                     what="1.2B GPT on 1 GPU, repro eager (with checkpointing)")]
    tests = (py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-o", "addopts=",
             f"--junitxml={out / 'tests-cuda.xml'}")
    if rehearse:
        # the tests part at toy size: the same command on the GPU path's own tests (tests/gpu_path: some pass on the
        # CPU, the rest skip), since collecting the whole suite to select the marked tests took 21 s of the
        # rehearsal's CPU (2400 tests, 37 marked) and checks nothing of this part that the suite's own run does not
        return [first, toy_repro,
                Part("gna", 20, 8, run + ("gna_speedup_gpu", "--scale", "smoke", "--device", "cuda"), one,
                     "GNA toy grids, forward", FLEX),
                Part("cuda_tests", 30, 5, tests + (str(REPO / "tests" / "gpu_path"),),
                     what="the GPU path's tests marked cuda (skipped without a GPU)")]
    # Limits from the GPU sessions (one H200, torch 2.11, 2026-11-27 and -28; gpu-sessions READMEs): provenance 5-6 s,
    # repro's 1.2B step compiled and first run 14 s, the plain GPT's whole-model compile 110-162 s, 3 x 2 blocks of 13
    # steps ~15 s, gna 115-119 s, cuda_tests 65-76 s. Each has ~15 % or more margin.
    return [first,
            Part("megatron_1gpu", 280, 200, megatron + ("--scale", "node", "--point", "1p2B_1gpu"),
                 what="1.2B GPT on 1 GPU: repro compiled layers and the plain GPT compiled whole, A B A B A B"),
            Part("gna", 140, 50, run + ("gna_speedup_gpu", "--scale", "paper", "--device", "cuda")
                 + _points(*GNA_POINTS), what="GNA FLUX 4K and HunyuanVideo vs the fastest dense SDPA",
                 needs_torch=FLEX),
            Part("cuda_tests", 90, 30, tests + (str(REPO / "tests"),), what="tests marked cuda")]
