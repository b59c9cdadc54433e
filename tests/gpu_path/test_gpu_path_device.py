"""repro.dist.device: which device a rank computes on (cuda:LOCAL_RANK or cpu) and its backend.

GPUs are simulated with ``cuda_devices=``, so every rule is checked on a CPU-only machine too."""

from __future__ import annotations

import pytest
import torch

from repro.dist.device import DeviceError, backend_for, describe, local_rank_from_env, select_device


@pytest.mark.parametrize("cuda_devices", [None, 0, 1, 8])
def test_cpu_is_always_cpu(cuda_devices):
    assert select_device("cpu", cuda_devices=cuda_devices) == torch.device("cpu")
    assert select_device("cpu", local_rank=99, cuda_devices=cuda_devices) == torch.device("cpu")


def test_auto_without_gpus_is_cpu():
    assert select_device("auto", cuda_devices=0) == torch.device("cpu")
    assert select_device("auto", local_rank=5, cuda_devices=0) == torch.device("cpu")


def test_cuda_without_gpus_is_an_error_naming_cuda():
    with pytest.raises(DeviceError, match="cuda"):
        select_device("cuda", cuda_devices=0)
    assert issubclass(DeviceError, ValueError)


@pytest.mark.parametrize("requested", ["auto", "cuda"])
@pytest.mark.parametrize("rank,count", [(0, 1), (1, 2), (3, 4), (7, 8)])
def test_simulated_gpus_give_cuda_local_rank(requested, rank, count):
    device = select_device(requested, local_rank=rank, cuda_devices=count)
    assert device == torch.device("cuda", rank)
    assert device.type == "cuda" and device.index == rank


@pytest.mark.parametrize("requested", ["auto", "cuda"])
@pytest.mark.parametrize("rank,count", [(1, 1), (2, 2), (8, 8), (11, 4)])
def test_a_rank_beyond_the_gpus_is_an_error_naming_rank_and_count(requested, rank, count):
    with pytest.raises(DeviceError) as info:
        select_device(requested, local_rank=rank, cuda_devices=count)
    message = str(info.value)
    assert f"local rank {rank}" in message and f"{count} GPU" in message
    assert "\n" not in message  # one line


def test_negative_local_rank_is_a_device_error():
    with pytest.raises(DeviceError, match="-1"):
        select_device("cuda", local_rank=-1, cuda_devices=2)


def test_local_rank_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert select_device("cuda", cuda_devices=2) == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(DeviceError, match="local rank 2"):
        select_device("cuda", cuda_devices=2)


@pytest.mark.parametrize("requested", ["tpu", "gpu", "CUDA", "", "cuda:0", "mps"])
def test_unknown_device_string_is_an_error_naming_it(requested):
    with pytest.raises(DeviceError) as info:
        select_device(requested, cuda_devices=1)
    assert repr(requested) in str(info.value)


@pytest.mark.parametrize("env,expected", [
    ({}, 0),
    ({"LOCAL_RANK": "3"}, 3),
    ({"SLURM_LOCALID": "2"}, 2),
    ({"LOCAL_RANK": "1", "SLURM_LOCALID": "5"}, 1),  # torchrun's variable wins
    ({"LOCAL_RANK": "0"}, 0),
    ({"OTHER": "7"}, 0),
])
def test_local_rank_from_env(env, expected):
    assert local_rank_from_env(env) == expected


@pytest.mark.parametrize("env,name", [
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK"),
    ({"LOCAL_RANK": ""}, "LOCAL_RANK"),
    ({"LOCAL_RANK": "1.5"}, "LOCAL_RANK"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK"),
    ({"SLURM_LOCALID": "abc"}, "SLURM_LOCALID"),
    ({"SLURM_LOCALID": "-3"}, "SLURM_LOCALID"),
])
def test_bad_local_rank_values_are_errors_naming_the_variable(env, name):
    with pytest.raises(DeviceError) as info:
        local_rank_from_env(env)
    assert name in str(info.value) and env[name] in str(info.value)


def test_local_rank_from_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "4")
    assert local_rank_from_env() == 4


@pytest.mark.parametrize("device,backend", [
    ("cpu", "gloo"), (torch.device("cpu"), "gloo"), ("cuda", "nccl"), ("cuda:3", "nccl"),
    (torch.device("cuda", 1), "nccl"),
])
def test_backend_for(device, backend):
    assert backend_for(device) == backend


def test_select_device_matches_this_machine(device):
    """With the real GPU count: ``auto`` gives cuda:0 where a GPU is, cpu elsewhere; backend follows."""
    chosen = select_device("auto", local_rank=0)
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert chosen == expected
    assert backend_for(chosen) == ("nccl" if torch.cuda.is_available() else "gloo")
    info = describe(device)
    assert info["type"] == torch.device(device).type
    if info["type"] == "cuda":
        assert info["name"] == torch.cuda.get_device_name(0) and info["count"] >= 1


def test_shared_gpus_names_both_ranks():
    from repro.dist.device import shared_gpus

    hosts = [("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a"), ("n1", "GPU-a")]
    assert shared_gpus(hosts) == [(0, 3, "n1", "GPU-a")]
    assert shared_gpus(hosts[:3]) == []


def _report_gpu(rank: int, world_size: int, gpus: list[str]) -> str:
    from repro.dist.device import check_one_gpu_per_rank

    try:
        check_one_gpu_per_rank(("node7", gpus[rank]))
    except DeviceError as err:
        return str(err)
    return "ok"


def test_two_ranks_on_one_gpu_is_an_error_on_every_rank():
    """Real ranks (gloo) exchange their (host, GPU): distinct GPUs pass, one GPU twice fails on both ranks."""
    from repro.dist import spawn

    assert spawn(_report_gpu, 2, ["GPU-0", "GPU-1"]) == ["ok", "ok"]
    messages = spawn(_report_gpu, 2, ["GPU-0", "GPU-0"])
    assert messages[0] == messages[1]
    assert "ranks 0 and 1 both compute on GPU GPU-0 of host node7" in messages[0]
