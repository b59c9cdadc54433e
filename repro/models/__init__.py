"""GPT-2 and BERT built from the tensor-parallel layers, their closed-form parameter counts, and references."""

from repro.models.bert import BertModel
from repro.models.config import BertConfig, GPTConfig, TransformerConfig
from repro.models.gpt import GPTModel
from repro.models.params import count_model_parameters, count_parameters
from repro.models.reference import ReferenceBert, ReferenceGPT
from repro.models.sharding import merge_state_dicts, shard_state_dict

__all__ = [
    "BertConfig", "BertModel", "GPTConfig", "GPTModel", "ReferenceBert", "ReferenceGPT", "TransformerConfig",
    "count_model_parameters", "count_parameters", "merge_state_dicts", "shard_state_dict",
]
