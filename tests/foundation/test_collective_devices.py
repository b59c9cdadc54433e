"""Device discipline for collectives (issue 25): every tensor a collective receives is on the device its group's
backend needs. On CPU (gloo) every tensor is a CPU tensor, so a missing ``device=`` passes every CPU test and
fails the first nccl run; :mod:`repro.dist.device_audit` remembers which tensors were made without a device and
fails the collective that receives one. Here the real code paths that feed collectives run under the audit on
real gloo ranks (trainer steps at tp 2, pp 2 and dp 2 with ZeRO 1-3 and its CPU and NVMe tiers, checkpoint
save/resume and failed loads, failfast's agreement, sequence-parallel layers, a partitioned activation checkpoint,
pipeline idle measurement, the overlap timer, tensor-parallel evaluation), and planted defects show that the audit
catches a CPU tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from repro.dist import comm, init_parallel, spawn
from repro.dist.device_audit import CollectiveDeviceError, device_audit, made_without_device
from repro.dist.spawn import SpawnError
from repro.models import GPTConfig, GPTModel

CPU = torch.device("cpu")  # the compute device of these gloo ranks, named as a GPU run names its cuda:N
CONFIG = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                   hidden_dropout=0.0, attention_dropout=0.0)
HERE = "tests/foundation/test_collective_devices.py"


def test_tagging_rules():
    """Factories without ``device=`` tag their result; an explicit device, ``.to(device)`` and ``.to(other)``
    clear it; ops, ``*_like`` and ``new_*`` inherit their sources' tags; parameters inherit their data's."""
    import numpy as np

    with device_audit():
        made = torch.tensor([1, 2])
        assert made_without_device(made).startswith(f"{HERE}:")
        assert made_without_device(torch.zeros(3, device=None)) is not None  # device=None is no device
        assert made_without_device(torch.from_numpy(np.zeros(2))) is not None
        placed = torch.zeros(3, device="cpu")
        assert made_without_device(placed) is None
        assert made_without_device(torch.empty(2, pin_memory=False, device=CPU)) is None
        # derived tensors: inherit when every tensor input is tagged
        assert made_without_device(made.double()[1:]) is not None
        assert made_without_device(torch.cat([made, made])) is not None
        assert made_without_device(made + torch.ones(2, dtype=torch.long, device=CPU)) is None
        assert made_without_device(torch.zeros_like(made)) is not None  # *_like takes its source's device
        assert made_without_device(torch.zeros_like(made, device=CPU)) is None
        assert made_without_device(made.new_zeros(4)) is not None and made_without_device(placed.new_zeros(4)) is None
        assert made_without_device(torch.as_tensor(placed)) is None  # a tensor's data keeps its device
        # explicit placement clears the tag; on the CPU .to("cpu") is the same tensor, cleared in place
        moved = made.to(CPU)
        assert moved is made and made_without_device(made) is None
        other = torch.ones(2)
        assert made_without_device(other.to(torch.float64)) is not None  # a dtype is no device
        assert made_without_device(other.to(placed)) is None  # .to(other tensor): where that tensor is
        # modules: built without a device (as layers are), placed by .to(device)
        layer = torch.nn.Linear(2, 2)
        assert made_without_device(layer.weight) is not None
        layer.to(CPU)
        assert made_without_device(layer.weight) is None and made_without_device(layer.bias) is None
        param = torch.nn.Parameter(torch.zeros(2))
        param.data = torch.zeros(2, device=CPU)
        assert made_without_device(param) is None


def test_backward_code_is_audited():
    """Custom autograd backward code runs under the audit too (torch runs backward outside torch-function modes
    unless told otherwise)."""

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            made.append(torch.empty(grad.shape))
            return grad * 2

    made: list[torch.Tensor] = []
    with device_audit():
        x = torch.ones(3, device=CPU, requires_grad=True)
        Twice.apply(x).sum().backward()
        torch.autograd.grad(Twice.apply(x).sum(), x)
    assert len(made) == 2 and all(made_without_device(t) for t in made)
    assert made_without_device(torch.zeros(1)) is None  # nothing is tagged after the audit


# -- planted defects ------------------------------------------------------------------------------------------------
def _planted_flag(group):
    flag = torch.zeros(4)  # the defect: no device=, a CPU tensor under nccl
    comm.all_reduce(flag, group)


def _planted_rank(rank, world_size):
    groups = init_parallel(tp=world_size)
    with device_audit():
        comm.all_reduce(torch.zeros(4, device=comm.group_device(groups.tp)), groups.tp)  # placed: passes
        _planted_flag(groups.tp)


def test_planted_cpu_tensor_is_caught():
    with pytest.raises(SpawnError) as caught:
        spawn(_planted_rank, 2, timeout_s=60)
    message = str(caught.value)
    assert "CollectiveDeviceError: all_reduce was given a (4,) torch.float32 tensor made without a device" in message
    assert f"{HERE}:" in message and "(_planted_flag)" in message


def _failfast_rank(rank, world_size, planted):
    from repro.training import failfast

    def build_failing_on_rank_1():
        if rank == 1:
            raise ValueError("bad setting on rank 1")
        return rank

    init_parallel()
    with device_audit():
        if planted:  # failfast before the fix: torch.tensor([...], dtype=torch.int64), no device
            failfast._agreement_device = lambda: None
        agreed = failfast.agree_on_setup(lambda: rank)
        try:
            failfast.agree_on_setup(build_failing_on_rank_1)
            message = "no error"
        except failfast.UsageError as err:
            message = err.message
    return agreed, message


def test_failfast_agreement_is_on_the_groups_device():
    assert spawn(_failfast_rank, 2, False, timeout_s=60) == [(0, None), (1, "rank 1: bad setting on rank 1")]


def test_failfast_with_its_old_cpu_tensor_is_caught():
    with pytest.raises(SpawnError, match=r"all_reduce was given a \(2,\) torch.int64 tensor made without a device "
                                         r"at repro/training/failfast.py:\d+ \(agree_on_setup\)"):
        spawn(_failfast_rank, 2, True, timeout_s=60)


# -- the real code paths ----------------------------------------------------------------------------------------------
def _train_rank(rank, world_size, layout, zero_stage, precision, offload, root):
    from repro.training.checkpoint import CheckpointError, load_training_checkpoint
    from repro.training.data import SyntheticSamples
    from repro.training.log import TrainingLog
    from repro.training.loop import Validation, train_loop
    from repro.training.preemption import PreemptionFlag
    from repro.training.trainer import PipelineTrainer, TrainSettings
    from repro.zero import OffloadConfig, ZeroConfig

    groups = init_parallel(**layout)
    zero = None
    if offload != "none":  # ZeRO-Offload / ZeRO-Infinity tiers: optimizer states (and stage 3's parameters)
        nvme = Path(root).parent / f"nvme{rank}"
        if offload == "nvme":
            nvme.mkdir()
        tier = OffloadConfig(offload, nvme_path=str(nvme) if offload == "nvme" else None)
        zero = ZeroConfig(stage=zero_stage, offload_optimizer=tier, offload_param=tier if zero_stage == 3 else
                          OffloadConfig(), bucket_numel=4096)
    settings = TrainSettings(steps=2, micro_batches=2, micro_batch_size=2, seq_len=16, zero_stage=zero_stage,
                             clip_grad=1.0, precision=precision, device="cpu", zero=zero)
    source = SyntheticSamples(vocab_size=CONFIG.vocab_size, seq_len=16, seed=0)
    with device_audit():
        trainer = PipelineTrainer(CONFIG, groups, settings)
        outcome = train_loop(trainer, source, steps=2, log=TrainingLog(total_iters=2, enabled=False), save=root,
                             save_interval=1, validation=Validation(source, interval=2, iters=1),
                             preemption=PreemptionFlag())
        resumed = PipelineTrainer(CONFIG, groups, settings)
        load_training_checkpoint(root, resumed)
        if groups.pp_size > 1:
            from repro.pipeline.measure import measure_idle

            measure_idle(lambda: (resumed.step(source.batch(0, resumed.global_batch_size)), resumed.last_result)[1],
                         groups.pp, steps=1, warmup=0)
        comm.barrier(groups.world)
        if rank == 1:  # a file that fails its check on one rank: every rank learns it from the agreement
            (max(Path(root).glob("iter_*")) / "rank00001.pt").write_bytes(b"corrupt")
        comm.barrier(groups.world)
        try:
            load_training_checkpoint(root, PipelineTrainer(CONFIG, groups, settings))
            failed = "loaded"
        except CheckpointError as err:
            failed = str(err)
    return outcome.losses, failed


@pytest.mark.parametrize("layout,zero_stage,precision,offload", [
    ({"tp": 2}, 0, "fp16", "none"),  # tensor parallel, fp16 overflow agreement over tp and pp
    ({"pp": 2}, 1, "fp32", "none"),  # pipeline p2p, tied embedding, loss broadcast, idle measurement; ZeRO-1
    ({"dp": 2}, 2, "fp32", "cpu"),  # ZeRO-2 reduce-scatter, global norm, optimizer states in host memory
    ({"dp": 2}, 3, "bf16", "none"),  # ZeRO-3 parameter gathers
    ({"dp": 2}, 3, "fp32", "nvme"),  # ZeRO-Infinity: parameters and optimizer states on NVMe
], ids=["tp2-fp16", "pp2-zero1", "dp2-zero2-cpu", "dp2-zero3", "dp2-zero3-nvme"])
def test_training_collectives_are_on_the_device(tmp_path, layout, zero_stage, precision, offload):
    results = spawn(_train_rank, 2, layout, zero_stage, precision, offload, str(tmp_path / "ckpt"), timeout_s=120)
    assert results[0][0] == results[1][0] and len(results[0][0]) == 2
    assert "rank 1 could not load" in results[0][1], results[0][1]
    assert "cannot resume" in results[1][1], results[1][1]


def _zero_checkpoint_rank(rank, world_size, root):
    from repro.zero import ZeroConfig, build_zero_optimizer
    from repro.zero.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    groups = init_parallel()
    with device_audit():
        torch.manual_seed(0)
        model = GPTModel(CONFIG).to(CPU)
        optimizer = build_zero_optimizer(model, ZeroConfig(stage=1), dp_group=groups.dp, lr=1e-3)
        save_checkpoint(root, optimizer, extra={"step": 1})
        load_checkpoint(root, optimizer)  # success: the agreement's all-reduce only
        comm.barrier(groups.dp)
        if rank == 1:
            (Path(root) / "rank00001.pt").write_bytes(b"corrupt")
        comm.barrier(groups.dp)
        try:
            load_checkpoint(root, optimizer)  # failure: the all-reduce, then the broadcast of rank 1's reason
            return "loaded"
        except CheckpointError as err:
            return str(err)
        finally:
            optimizer.close()


def test_zero_checkpoint_agreement_is_on_the_device(tmp_path):
    for message in spawn(_zero_checkpoint_rank, 2, str(tmp_path / "ckpt"), timeout_s=60):
        assert "failed on rank 1" in message, message


def _layers_rank(rank, world_size):
    from repro.overlap.sequence_parallel import SequenceParallelColumnLinear, SequenceParallelRowLinear
    from repro.overlap.timing import time_sublayer, transformer_sublayers
    from repro.pipeline.measure import fixed_cost_step, measure_idle
    from repro.tensor_parallel.partitioned_checkpoint import PartitionedCheckpoint

    groups = init_parallel(tp=world_size)
    with device_audit():
        torch.manual_seed(0)
        row = SequenceParallelRowLinear(8, 6, group=groups.tp, num_chunks=2).to(CPU)
        column = SequenceParallelColumnLinear(6, 8, group=groups.tp, num_chunks=2).to(CPU)
        x = torch.randn(2, 16, 8 // world_size, device=CPU, requires_grad=True)  # full sequence, features split
        column(row(x)).sum().backward()  # reduce-scatter, all-gather forward; all-gather, reduce-scatter backward
        # ZeRO-R's P_a+cpu: a 1/tp slice of the layer input in host memory, all-gathered in backward
        checkpointed = PartitionedCheckpoint(torch.nn.Linear(8, 8), groups.tp, offload=True).to(CPU)
        checkpointed(torch.randn(2, 3, 8, device=CPU, requires_grad=True)).sum().backward()
        timings = [time_sublayer(spec, groups.tp, tokens=16, num_chunks=2, rounds=1, warmup=0)
                   for spec in transformer_sublayers(16).values()]
    pp = init_parallel(pp=world_size).pp
    with device_audit():
        run_step = fixed_cost_step(pp, num_micro_batches=2, forward_s=0.001, backward_s=0.001)
        idle = measure_idle(run_step, pp, steps=1, warmup=0)
    return x.grad.shape, len(timings), len(idle.events)


def test_overlap_and_pipeline_helpers_are_on_the_device():
    for grad_shape, timings, events in spawn(_layers_rank, 2, timeout_s=120):
        assert grad_shape == (2, 16, 4) and timings == 5 and events == 2 * 2 * 2


def _evals_rank(rank, world_size):
    from evals.repro_lm import ReproCausalLM
    from evals.scoring import score_continuations

    groups = init_parallel(tp=world_size)
    with device_audit():
        torch.manual_seed(0)
        model = GPTModel(CONFIG, tp_group=groups.tp).to(torch.float64).to(CPU)  # as load_gpt_for_eval places it
        scores = score_continuations(ReproCausalLM(model), [([1, 2, 3], [4, 5]), ([7, 8], [9])], progress=False)
    return [score.logprob for score in scores]


def test_tensor_parallel_evaluation_is_on_the_device():
    first, second = spawn(_evals_rank, 2, timeout_s=60)
    assert first == second


def test_nccl_check_names_the_device(monkeypatch):
    """Where the group's backend is nccl, a tensor not on a GPU fails even when it was made with a device."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    with device_audit(), pytest.raises(CollectiveDeviceError, match="all_reduce over nccl was given a tensor on cpu"):
        dist.all_reduce(torch.zeros(1, device=CPU))
