"""A small trainer for GPT under any tensor x pipeline x data parallel layout, and its data."""

from repro.training.data import local_micro_batches, synthetic_tokens
from repro.training.trainer import PipelineTrainer, TrainSettings, train_gpt

__all__ = ["PipelineTrainer", "TrainSettings", "local_micro_batches", "synthetic_tokens", "train_gpt"]
