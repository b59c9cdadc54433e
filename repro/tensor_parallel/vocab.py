"""The padded vocabulary size (Megatron-LM sec. 5.1): arithmetic only, without torch, so that a model's
configuration (:class:`repro.models.config.GPTConfig`) can be declared without importing torch."""

from __future__ import annotations


def pad_vocab_size(vocab_size: int, tp_size: int, make_divisible_by: int = 128) -> int:
    """Smallest multiple of ``make_divisible_by * tp_size`` that is >= ``vocab_size``."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be positive")
    multiple = make_divisible_by * tp_size
    return ((vocab_size + multiple - 1) // multiple) * multiple
