"""Model configurations (frozen dataclasses), validated against the tensor-parallel size at the boundary."""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.tensor_parallel.vocab import pad_vocab_size


@dataclass(frozen=True)
class TransformerConfig:
    """What every transformer layer needs. ``ffn_hidden_size`` defaults to 4 x hidden (GPT-2, BERT)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    ffn_hidden_size: int | None = None
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-5
    init_std: float = 0.02
    make_vocab_size_divisible_by: int = 128
    gelu_approximate: str = "tanh"  # GPT-2's gelu_new; BERT uses "none" (erf)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1)")
        if self.gelu_approximate not in ("tanh", "none"):
            raise ValueError(f"gelu_approximate={self.gelu_approximate!r} must be 'tanh' or 'none'")

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tp_size: int = 1) -> int:
        """Megatron pads the vocabulary to a multiple of 128 x tp (sec. 5.1: 50,257 -> 51,200 at tp=8)."""
        return pad_vocab_size(self.vocab_size, tp_size, self.make_vocab_size_divisible_by)

    def check_tensor_parallel(self, tp_size: int) -> None:
        """Heads, hidden size and FFN size must split evenly across ``tp_size`` ranks (Megatron sec. 3)."""
        if self.num_attention_heads % tp_size != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by tp={tp_size}: "
                "each tensor-parallel rank must own whole heads"
            )
        # hidden_size = heads x head_dim, so whole heads per rank also split the hidden size evenly.
        if self.ffn_size % tp_size != 0:
            raise ValueError(f"ffn_hidden_size={self.ffn_size} is not divisible by tp={tp_size}")


@dataclass(frozen=True)
class GPTConfig(TransformerConfig):
    """GPT-2 as Megatron trains it: pre-LN layers, learned positions, tied embeddings, tanh-GELU."""


@dataclass(frozen=True)
class BertConfig(TransformerConfig):
    """BERT; ``layernorm_placement`` is "megatron" (pre-LN, paper Fig. 7b) or "original" (post-LN, Fig. 7a)."""

    num_tokentypes: int = 2
    layernorm_placement: str = "megatron"
    layernorm_epsilon: float = 1e-12
    gelu_approximate: str = "none"
    make_vocab_size_divisible_by: int = field(default=128)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layernorm_placement not in ("megatron", "original"):
            raise ValueError(
                f"layernorm_placement={self.layernorm_placement!r} must be 'megatron' (pre-LN) or 'original' (post-LN)"
            )
