"""BERT with a multiple-choice head, as Megatron-LM finetunes it on RACE (paper sec. 5.3).

Each (question, option) sequence is encoded independently; the pooled [CLS] vector goes through dropout and a
``hidden -> 1`` linear layer, and the 4 scores of a question are a softmax over its options.
"""

from __future__ import annotations

import torch
from torch import nn

from repro.dist.comm import CommGroup
from repro.models import BertConfig, BertModel
from repro.tensor_parallel.layers import normal_init


class MultipleChoiceModel(nn.Module):
    """``forward(input_ids [B, C, S], token_type_ids, attention_mask) -> scores [B, C]``."""

    def __init__(self, config: BertConfig, *, tp_group: CommGroup | None = None) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, tp_group=tp_group)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.head = nn.Linear(config.hidden_size, 1)
        normal_init(config.init_std)(self.head.weight.data)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.dim() != 3:
            raise ValueError(f"input_ids must be [batch, choices, seq], got shape {tuple(input_ids.shape)}")
        batch, choices, seq = input_ids.shape

        def flat(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.reshape(batch * choices, seq)

        _, pooled = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask))  # [B*C, h]
        return self.head(self.dropout(pooled)).view(batch, choices)

    def load_encoder(self, bert_state: dict[str, torch.Tensor]) -> None:
        """Initialise the encoder from a (pretrained) BERT state dict for this tp rank; heads absent from it
        (pooler, MLM, NSP) keep their initialisation, as in Megatron's finetuning from a BERT checkpoint."""
        missing, unexpected = self.bert.load_state_dict(bert_state, strict=False)
        required = [k for k in missing if not k.startswith(("pooler.", "lm_head.", "binary_head."))]
        if required or unexpected:
            raise ValueError(f"BERT state does not fit the encoder: missing {required}, unexpected {unexpected}")
