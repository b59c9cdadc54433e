"""GPT-2 and BERT built from the tensor-parallel layers, their closed-form parameter counts, and references.

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (the experiments' declarations, which `repro list` and the Slurm planning step import) does not import torch
through this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.lazy import lazy_names

#: name -> the module that defines it, imported at the name's first use
_HOMES = {
    **dict.fromkeys(("BertModel",), "repro.models.bert"),
    **dict.fromkeys(("BertConfig", "GPTConfig", "TransformerConfig"), "repro.models.config"),
    **dict.fromkeys(("GPTModel",), "repro.models.gpt"),
    **dict.fromkeys(("count_model_parameters", "count_parameters"), "repro.models.params"),
    **dict.fromkeys(("ReferenceBert", "ReferenceGPT"), "repro.models.reference"),
    **dict.fromkeys(("merge_state_dicts", "shard_state_dict"), "repro.models.sharding"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from repro.models.bert import BertModel
    from repro.models.config import BertConfig, GPTConfig, TransformerConfig
    from repro.models.gpt import GPTModel
    from repro.models.params import count_model_parameters, count_parameters
    from repro.models.reference import ReferenceBert, ReferenceGPT
    from repro.models.sharding import merge_state_dicts, shard_state_dict


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
