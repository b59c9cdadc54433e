"""ZeRO on the parameters' device: stages 0-3 with offload none / cpu, single process, on every device this machine
has ("cpu" always, "cuda" when a GPU is present: the same tests then check the GPU path, pinned host tiers, the
fused Adam choice, stage 3's side-stream prefetch and the asynchronous host <-> GPU copies).

Each test builds the model on the device, trains a few steps and compares the losses with torch's own AdamW on the
same device, then checks where every buffer the optimizer allocated lives."""

from __future__ import annotations

import pytest
import torch

from repro.dist.comm import CommGroup
from repro.models import GPTModel
from repro.zero import OffloadConfig, ZeroConfig, build_zero_optimizer
from repro.zero.grad_norm import global_grad_stats
from repro.zero.inner import use_fused
from repro.zero.offload import build_tier
from repro.zero.offload.pinned import PinnedHostMemory, PinningError
from repro.zero.offload.tiers import ResidentTier
from repro.zero.param_units import param_key
from repro.zero.transfer import GradientStager, async_safe, copy_into
from zero_cases import LR, MAX_NORM, TINY, WEIGHT_DECAY, batch, reference_losses

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU"))]
STEPS = 5
CASES = [(stage, tier) for stage in (0, 1, 2, 3) for tier in ("none", "cpu")]


def _config(stage: int, tier: str, dtype: str = "fp32") -> ZeroConfig:
    offload = OffloadConfig(tier)
    return ZeroConfig(stage=stage, dtype=dtype, offload_optimizer=offload,
                      offload_param=offload if stage == 3 else OffloadConfig(), max_grad_norm=MAX_NORM,
                      bucket_numel=20_000)


def _model(device: str) -> GPTModel:
    torch.manual_seed(0)
    return GPTModel(TINY).to(device)


def _train(optimizer, model, device: str, steps: int = STEPS, first: int = 0) -> list[float]:
    losses = []
    for step in range(first, first + steps):
        ids, labels = (t.to(device) for t in batch(step))
        loss = model.loss(ids, labels).float().mean()
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, list[float]] = {}

    def get(device: str) -> list[float]:
        if device not in cache:
            cache[device] = reference_losses(STEPS, device)
        return cache[device]
    return get


def _where(optimizer) -> dict[str, set[str]]:
    """Device types of every buffer the optimizer holds, by role."""
    out: dict[str, set[str]] = {}

    def add(role: str, tensor) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.numel():
            out.setdefault(role, set()).add(tensor.device.type)

    for bucket in optimizer.buckets:
        add("flat_param", bucket.flat_param)
        add("flat_grad", bucket.flat_grad)
        add("grad_shard", bucket.grad_shard)
    for key, tensor in optimizer.tier.tensors().items():
        add(f"optimizer_tier/{key.split('.', 1)[1]}", tensor)
    if optimizer.stage == 3:
        for bucket in optimizer.buckets:
            add("param_tier", optimizer.param_tier.fetch(param_key(bucket)))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage,tier", CASES, ids=[f"stage{s}-{t}" for s, t in CASES])
def test_stage_trains_like_adamw_on_the_device(stage, tier, device, reference):
    model = _model(device)
    optimizer = build_zero_optimizer(model, _config(stage, tier), dp_group=CommGroup.single("dp"), lr=LR,
                                     weight_decay=WEIGHT_DECAY)
    losses = _train(optimizer, model, device)
    expected = reference(device)
    # cpu: the same AdamW arithmetic; cuda: the fused kernels of the reference, or the CPU's for the cpu tier.
    tolerance = 1e-6 if device == "cpu" else 2e-5
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, expected)) <= tolerance, (losses, expected)
    assert losses[-1] < losses[0]

    where = _where(optimizer)
    state_place = device if tier == "none" else "cpu"
    assert all(places == {state_place} for role, places in where.items() if role.startswith("optimizer_tier")), where
    for role in ("flat_param", "grad_shard", "flat_grad"):
        assert where.get(role, {device}) == {device}, where
    if stage == 3:
        assert where["param_tier"] == {state_place}, where
        assert (optimizer.gatherer.stream is not None) == (device == "cuda")
    assert optimizer.inner.fused == (device == "cuda")
    pinned = {key: t.is_pinned() for key, t in optimizer.tier.tensors().items() if t.device.type == "cpu"}
    if device == "cuda" and tier == "cpu":
        masters = [pinned[key] for key in pinned if key.endswith(".master")]
        assert masters and all(masters), "the cpu tier keeps the fp32 masters in page-locked memory on a GPU run"
    else:
        assert not any(pinned.values())
    optimizer.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage,tier", [(0, "none"), (2, "cpu"), (3, "none"), (3, "cpu")])
def test_bf16_stages_agree_and_learn(stage, tier, device):
    """bf16 parameters with fp32 masters: every stage and tier at one rank does the same arithmetic as stage 0."""
    results = {}
    for label, (s, t) in {"base": (0, "none"), "this": (stage, tier)}.items():
        model = _model(device)
        optimizer = build_zero_optimizer(model, _config(s, t, "bf16"), dp_group=CommGroup.single("dp"), lr=LR,
                                         weight_decay=WEIGHT_DECAY)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        results[label] = _train(optimizer, model, device)
        optimizer.close()
    assert all(torch.isfinite(torch.tensor(results["this"])))
    assert results["this"][-1] < results["this"][0]
    assert max(abs(a - b) / abs(b) for a, b in zip(results["this"], results["base"])) <= 2e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [None, True], ids=["default-adam", "fused-adam"])
def test_state_dict_round_trip_continues_identically(device, fused):
    """Save after 3 steps, load into a fresh optimizer, continue: the same losses as without the interruption.
    ``fused=True`` runs torch's fused AdamW on the CPU too, so its tensor ``step`` state is exercised here."""
    kwargs = {} if fused is None else {"fused": True}

    def build():
        model = _model(device)
        return model, build_zero_optimizer(model, _config(2, "cpu"), dp_group=CommGroup.single("dp"), lr=LR,
                                           weight_decay=WEIGHT_DECAY, **kwargs)

    model, optimizer = build()
    straight = _train(optimizer, model, device, steps=6)
    model, optimizer = build()
    _train(optimizer, model, device, steps=3)
    saved = optimizer.state_dict()
    scalars = [v for b in saved["buckets"] for v in b["state"]["scalars"].values() if isinstance(v, torch.Tensor)]
    assert scalars and all(v.device.type == "cpu" for v in scalars)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    model2, optimizer2 = build()
    optimizer2.load_state_dict(saved)
    for name, p in model2.named_parameters():
        assert torch.equal(p.detach(), weights[name]), name
    resumed = _train(optimizer2, model2, device, steps=3, first=3)
    # cuda: attention's backward may sum in another order from run to run
    assert resumed == pytest.approx(straight[3:], rel=1e-6 if device == "cpu" else 1e-5)


def test_fused_adam_is_chosen_by_where_the_states_live():
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    adamw = torch.optim.AdamW
    assert use_fused(adamw, {}, state_device=gpu, param_device=gpu)
    assert use_fused(adamw, {}, state_device=cpu, param_device=gpu)  # ZeRO-Offload's CPU step
    assert use_fused(torch.optim.Adam, {"fused": None, "foreach": None}, state_device=gpu, param_device=gpu)
    assert not use_fused(adamw, {}, state_device=cpu, param_device=cpu)  # CPU-only runs keep torch's default
    assert not use_fused(adamw, {"fused": False}, state_device=gpu, param_device=gpu)
    assert not use_fused(adamw, {"foreach": True}, state_device=gpu, param_device=gpu)
    assert not use_fused(torch.optim.SGD, {}, state_device=gpu, param_device=gpu)


def test_cpu_tier_pins_only_for_a_model_on_a_gpu():
    cpu_model = build_tier(OffloadConfig("cpu"), device="cpu", role="optimizer")
    assert isinstance(cpu_model, ResidentTier) and not cpu_model.pin_memory
    gpu_model = build_tier(OffloadConfig("cpu"), device="cuda", role="optimizer")
    assert gpu_model.pin_memory == CUDA
    assert not build_tier(OffloadConfig("cpu", pin_memory=False), device="cuda", role="optimizer").pin_memory
    assert build_tier(OffloadConfig("none"), device="cpu", role="optimizer").compute_device.type == "cpu"


class FakeCudart:
    """cudaHostRegister / cudaHostUnregister without a GPU: records the calls, fails on request."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.registered: dict[int, int] = {}
        self.fail_after = fail_after

    def cudaHostRegister(self, pointer, nbytes, flags):  # noqa: N802 - the CUDA runtime's name
        if self.fail_after is not None and len(self.registered) >= self.fail_after:
            return 2  # cudaErrorMemoryAllocation
        assert pointer % 4096 == 0 and pointer not in self.registered
        self.registered[pointer] = nbytes
        return 0

    def cudaHostUnregister(self, pointer):  # noqa: N802
        del self.registered[pointer]
        return 0


def test_pinned_host_memory_registers_exact_page_aligned_tensors():
    cudart = FakeCudart(fail_after=2)
    host = PinnedHostMemory(cudart)
    a, b = host.empty((3, 5), torch.float32), host.empty((7,), torch.bfloat16)
    assert a.shape == (3, 5) and a.untyped_storage().nbytes() == 60 and not a.any()
    assert cudart.registered == {a.data_ptr(): 60, b.data_ptr(): 14} and host.pinned_bytes == 74
    a.copy_(torch.arange(15.0).view(3, 5))
    assert a.sum() == 105
    with pytest.raises(PinningError, match="cudaHostRegister of 4 bytes failed"):
        host.empty((1,), torch.float32)
    host.unregister(a)
    assert list(cudart.registered) == [b.data_ptr()]
    host.release_all()
    assert cudart.registered == {} and host.pinned_bytes == 0
    assert host.empty((0,), torch.float32).numel() == 0


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_pinned_tier_is_page_locked_exactly_and_released():
    tier = ResidentTier("cpu", "cpu", pin_memory=True)
    source = torch.randn(3, 1000, device="cuda")
    tier.create("a", source)
    stored = tier.fetch("a")
    assert stored.is_pinned() and stored.untyped_storage().nbytes() == source.numel() * 4
    assert torch.equal(stored, source.cpu())
    target = torch.empty(3, 1000, device="cuda", dtype=torch.bfloat16)
    assert copy_into(target, stored)  # asynchronous from pinned memory, converted on the GPU
    torch.cuda.synchronize()
    assert torch.equal(target, source.to(torch.bfloat16))
    tier.close()
    assert not stored.is_pinned()


def test_transfers_are_plain_copies_on_one_device():
    shard = torch.arange(6.0)
    stager = GradientStager("cpu")
    stager.start(0, shard)
    assert stager.fetch(0, shard) is shard and stager.bytes_moved == 0
    target = torch.zeros(6, dtype=torch.bfloat16)
    assert not async_safe(target, shard) and not copy_into(target, shard)
    assert torch.equal(target, shard.to(torch.bfloat16))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gradients_are_staged_to_pinned_host_memory():
    shards = [torch.randn(1000, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    stager = GradientStager("cpu")
    stager.start(1, shards[1])
    got = [stager.fetch(i, shard) for i, shard in enumerate(shards)]
    assert all(g.device.type == "cpu" and g.is_pinned() for g in got)
    assert all(torch.equal(g, s.cpu()) for g, s in zip(got, shards))
    assert stager.bytes_moved == 3 * 2000


@pytest.mark.parametrize("device", DEVICES)
def test_grad_stats_stay_on_the_device(device):
    shards = [torch.full((4,), 2.0, device=device), torch.full((3,), 1.0, device=device)]
    group = CommGroup.single("dp")
    sumsq, found_inf = global_grad_stats(((s, None) for s in shards), dp_group=group, model_parallel_group=None,
                                         device=device)
    assert (sumsq, found_inf) == (19.0, False)
    shards[1][0] = float("inf")
    assert global_grad_stats(((s, [(0, 2)]) for s in shards), dp_group=group, model_parallel_group=None)[1]
