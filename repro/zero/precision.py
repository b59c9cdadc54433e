"""Mixed precision as ZeRO uses it (ZeRO sec. 3.1): 16-bit parameters and gradients for forward and backward,
fp32 master weights and Adam moments in the optimizer, dynamic loss scaling when the 16-bit format is fp16.

fp16 has a narrow exponent, so small gradients underflow; the loss is multiplied by a scale S before backward and
the gradients divided by S before the update. When any gradient overflows (inf/nan) the step is skipped and S
halved; after ``growth_interval`` clean steps S doubles again. bf16 shares fp32's exponent and needs no scaling.
"""

from __future__ import annotations

import torch

from repro.zero.config import LossScaleConfig

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in TORCH_DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"parameter dtype {dtype} is not supported; ZeRO here trains in {sorted(TORCH_DTYPES)}")


class DynamicLossScaler:
    """S starts at 2**initial_scale_power; ``update(found_inf)`` returns True when the step must be skipped."""

    def __init__(self, config: LossScaleConfig = LossScaleConfig()) -> None:
        self.config = config
        self.scale = float(config.static_scale or 2.0 ** config.initial_scale_power)
        self.dynamic = not config.static_scale
        self.clean_steps = 0
        self.hysteresis_left = config.hysteresis
        self.skipped_steps = 0

    def update(self, found_inf: bool) -> bool:
        if not found_inf:
            self.clean_steps += 1
            self.hysteresis_left = self.config.hysteresis
            if self.dynamic and self.clean_steps % self.config.growth_interval == 0:
                self.scale *= 2.0
            return False
        self.skipped_steps += 1
        self.clean_steps = 0
        if self.dynamic:
            self.hysteresis_left -= 1
            if self.hysteresis_left <= 0:
                self.scale = max(self.scale / 2.0, self.config.min_scale)
                self.hysteresis_left = self.config.hysteresis
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "hysteresis_left": self.hysteresis_left,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.hysteresis_left = int(state["hysteresis_left"])
        self.skipped_steps = int(state["skipped_steps"])


class Precision:
    """The training dtype of parameters and gradients, and the loss scaler it needs (fp16 only)."""

    def __init__(self, dtype: torch.dtype, loss_scale: LossScaleConfig = LossScaleConfig()) -> None:
        self.name = dtype_name(dtype)
        self.dtype = dtype
        self.scaler = DynamicLossScaler(loss_scale) if self.name == "fp16" else None

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    @property
    def checks_overflow(self) -> bool:
        return self.scaler is not None

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.loss_scale if self.scaler is not None else loss

    def update(self, found_inf: bool) -> bool:
        """True when the step is to be skipped (fp16 overflow)."""
        return self.scaler.update(found_inf) if self.scaler is not None else False

    def state_dict(self) -> dict:
        return {"dtype": self.name, "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        if state["dtype"] != self.name:
            raise ValueError(f"checkpoint was trained in {state['dtype']}, this optimizer trains in {self.name}")
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
