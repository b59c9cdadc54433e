"""ZeRO settings: validation at the boundary and DeepSpeed-style zero_optimization blocks."""

import re

import pytest

from repro.zero import OffloadConfig, ZeroConfig


@pytest.mark.parametrize("stage", [4, -1, True, False, 1.0, "1", None])
def test_stage_must_be_an_int_from_0_to_3(stage):
    with pytest.raises(ValueError, match=rf"^stage={re.escape(repr(stage))} is not a ZeRO stage: must be an int"):
        ZeroConfig(stage=stage)


@pytest.mark.parametrize("value", [0, -5, True, 1.5, 1e6, "auto", None])
def test_bucket_numel_and_prefetch_numel_must_be_positive_ints(value):
    for key in ("bucket_numel", "prefetch_numel"):
        if value is None and key == "prefetch_numel":
            continue  # None: no prefetch cap
        with pytest.raises(ValueError, match=rf"^{key}={re.escape(repr(value))} is not allowed: .*positive integer"):
            ZeroConfig(**{key: value})


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
    # stage 3 reduces and steps by the same buckets: the smaller size honours both documented bounds
    assert config.bucket_numel == 500_000 and config.prefetch_numel is None
    big = dict(ds["zero_optimization"], reduce_bucket_size=5e8, stage3_prefetch_bucket_size=5e7)
    config = ZeroConfig.from_deepspeed({"zero_optimization": big})
    assert config.bucket_numel == 1_000_000 and config.prefetch_numel == 50_000_000
    # stages 0-2: reduce_bucket_size is the bucket; the stage-3 keys are ignored there, as DeepSpeed does
    stage2 = ZeroConfig.from_deepspeed({"zero_optimization": dict(big, stage=2, offload_param={})})
    assert stage2.bucket_numel == 500_000_000 and stage2.prefetch_numel is None
    assert ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2}}).bucket_numel == 500_000  # the default


def test_from_deepspeed_errors():
    with pytest.raises(ValueError, match="needs stage 3"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    with pytest.raises(ValueError, match="unknown zero_optimization keys"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"stgae": 2}})
    with pytest.raises(ValueError, match="both enabled"):
        ZeroConfig.from_deepspeed({"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    fp16 = ZeroConfig.from_deepspeed({"fp16": {"enabled": True, "initial_scale_power": 8}, "zero_optimization": {"stage": 1}})
    assert fp16.dtype == "fp16" and fp16.loss_scale.initial_scale_power == 8 and fp16.stage == 1


@pytest.mark.parametrize("stage", [True, False, 1.0, "2", 4])
def test_from_deepspeed_stage_must_be_an_int(stage):
    key = r"zero_optimization\.stage"
    with pytest.raises(ValueError, match=rf"^{key}={re.escape(repr(stage))} is not a ZeRO stage"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"stage": stage}})


@pytest.mark.parametrize("key", ["reduce_bucket_size", "sub_group_size", "stage3_prefetch_bucket_size"])
@pytest.mark.parametrize("value", [0, 0.0, -1, True, 1.5, "auto", None, [5]])
def test_from_deepspeed_bucket_sizes_must_be_positive_ints(key, value):
    """0 is refused, never replaced by the default; the error is one line with the key, the value and the rule."""
    with pytest.raises(ValueError) as err:
        ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 3, key: value}})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"zero_optimization.{key}={value!r} is not allowed")
    assert "positive integer" in message


def test_from_deepspeed_accepts_integral_sizes_written_as_floats():
    """DeepSpeed's own examples write 5e8: JSON reads it as a float, and it is a whole number of elements."""
    config = ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 1, "reduce_bucket_size": 2e4}})
    assert config.bucket_numel == 20_000 and isinstance(config.bucket_numel, int)


def test_from_deepspeed_keys_that_would_change_results_are_refused():
    for key, value in (("load_from_fp32_weights", False), ("zero_quantized_weights", True),
                       ("zero_quantized_gradients", True), ("cpu_offload", "yes")):
        with pytest.raises(ValueError, match=rf"^zero_optimization\.{key}={re.escape(repr(value))} "):
            ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, key: value}})
    fine = {"load_from_fp32_weights": True, "zero_quantized_weights": False, "zero_quantized_gradients": False}
    assert ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, **fine}}).stage == 2


def test_from_deepspeed_cpu_offload_is_the_old_spelling_of_offload_optimizer_cpu():
    config = ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, "cpu_offload": True}})
    assert config.offload_optimizer.device == "cpu"
    assert ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, "cpu_offload": False}}).offload_optimizer \
        == OffloadConfig()
    with pytest.raises(ValueError, match="cpu_offload=True contradicts offload_optimizer.device='nvme'"):
        ZeroConfig.from_deepspeed({"zero_optimization": {
            "stage": 3, "cpu_offload": True, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})
