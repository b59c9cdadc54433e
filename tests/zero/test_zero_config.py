"""ZeRO settings: validation at the boundary and DeepSpeed-style zero_optimization blocks."""

import pytest

from repro.zero import OffloadConfig, ZeroConfig


def test_unknown_stage_is_rejected():
    with pytest.raises(ValueError, match="stage 4 is unknown"):
        ZeroConfig(stage=4)


def test_param_offload_needs_stage_3():
    for stage in (0, 1, 2):
        with pytest.raises(ValueError, match="needs stage 3"):
            ZeroConfig(stage=stage, offload_param=OffloadConfig("cpu"))
    ZeroConfig(stage=3, offload_param=OffloadConfig("cpu"))


def test_offload_device_and_nvme_path():
    with pytest.raises(ValueError, match="'disk' is unknown"):
        OffloadConfig("disk")
    with pytest.raises(ValueError, match="needs nvme_path"):
        OffloadConfig("nvme")
    with pytest.raises(ValueError, match="dtype"):
        ZeroConfig(dtype="fp8")


def test_from_deepspeed_reads_the_zero_block():
    ds = {
        "train_micro_batch_size_per_gpu": 4,
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": 3, "overlap_comm": True, "reduce_bucket_size": 5e5, "sub_group_size": 1e6,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True},
            "offload_param": {"device": "cpu"},
        },
    }
    config = ZeroConfig.from_deepspeed(ds)
    assert config.stage == 3 and config.dtype == "bf16" and config.max_grad_norm == 1.0
    assert config.offload_optimizer == OffloadConfig("nvme", nvme_path="/local_nvme")
    assert config.offload_param.device == "cpu"
    assert config.bucket_numel == 1_000_000


def test_from_deepspeed_errors():
    with pytest.raises(ValueError, match="needs stage 3"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    with pytest.raises(ValueError, match="unknown zero_optimization keys"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"stgae": 2}})
    with pytest.raises(ValueError, match="both enabled"):
        ZeroConfig.from_deepspeed({"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    fp16 = ZeroConfig.from_deepspeed({"fp16": {"enabled": True, "initial_scale_power": 8}, "zero_optimization": {"stage": 1}})
    assert fp16.dtype == "fp16" and fp16.loss_scale.initial_scale_power == 8 and fp16.stage == 1
