"""The models, tensor-parallel degrees, sublayers and token counts T3 evaluates (T3 sec. 5 per T3-SEC1/2).

Models (public configurations): Megatron GPT-2 8.3B (72 layers, hidden 3072, 32 heads, sequence 1024), T-NLG 17B
(78, 4256, 28, 1024), at TP 8 and 16; GPT-3 175B (96, 12288, 96, 2048), PaLM 540B (118, 18432, 48, 2048) and
MT-NLG 530B (105, 20480, 128, 2048) at TP 32. All are modelled as GPT layers with a 4h feed-forward (PaLM's
SwiGLU and parallel attention/MLP are not modelled).

Sublayers (T3 sec. 1): forward OP (attention output projection) and FC-2, backward IP (input/QKV projection) and
FC-1. Each is the GEMM that produces the tensor the layer all-reduces, ``[T x h]`` on every rank:

* OP forward: ``[T x h/p] @ [h/p x h]``; FC-2 forward: ``[T x 4h/p] @ [4h/p x h]``;
* IP backward (input gradient): ``[T x 3h/p] @ [3h/p x h]``; FC-1 backward: ``[T x 4h/p] @ [4h/p x h]``.

The weight-gradient GEMMs of the backward pass need no collective and are not part of a sublayer (they count in
the rest of the layer, ``endtoend``).

Token counts: the sources give none (``model_configs`` is not found). Chosen once for every model: a micro-batch
of 8 sequences of the model's own length (8192 tokens for the TP 8/16 models, 16384 for the TP 32 ones), both for
training and for the prompt phase of inference (a batch of 8 prompts of full length); the two then differ only in
which passes run, which is what T3 contrasts.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schedules import Sublayer

SUBLAYERS = ("OP", "FC-2", "IP", "FC-1")  # T3's names, forward two first
FORWARD = ("OP", "FC-2")
MICRO_BATCH = 8


@dataclass(frozen=True)
class Model:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    seq_length: int
    tp_sizes: tuple[int, ...]
    group: str  # "small" (TP 8/16, the geomeans of T3's abstract), "large" (TP 32) or "reference" (not T3's)

    @property
    def tokens(self) -> int:
        return MICRO_BATCH * self.seq_length


MODELS = {
    "Mega-GPT-2": Model("Mega-GPT-2", 72, 3072, 32, 1024, (8, 16), "small"),
    "T-NLG": Model("T-NLG", 78, 4256, 28, 1024, (8, 16), "small"),
    "GPT-3": Model("GPT-3", 96, 12288, 96, 2048, (32,), "large"),
    "PaLM": Model("PaLM", 118, 18432, 48, 2048, (32,), "large"),
    "MT-NLG": Model("MT-NLG", 105, 20480, 128, 2048, (32,), "large"),
}
#: The ~500B models of T3's abstract.
MODELS_500B = ("PaLM", "MT-NLG")

#: BERT-large as MLPerf Training v1.1 runs it (24 layers, hidden 1024, 16 heads, sequence 512), the implementation
#: T3 takes its share of non-sliced attention time from (``nonsliced_attn_share``). MLPerf's BERT trains data-
#: parallel, one whole layer per GPU, so it is evaluated at TP 1; micro-batch as for every model here.
MLPERF_BERT = Model("BERT-large (MLPerf v1.1)", 24, 1024, 16, 512, (1,), "reference")

_INNER = {"OP": 1, "FC-2": 4, "IP": 3, "FC-1": 4}  # the producer GEMM's inner dimension, in units of h / p


def sublayer(model: Model, name: str, tp: int) -> Sublayer:
    """The producer GEMM of sublayer ``name`` of ``model`` at tensor-parallel degree ``tp``."""
    if name not in _INNER:
        raise ValueError(f"sublayer {name!r} must be one of {SUBLAYERS}")
    if model.hidden_size % tp:
        raise ValueError(f"hidden_size {model.hidden_size} of {model.name} is not divisible by tp={tp}")
    return Sublayer(name, m=model.tokens, n=model.hidden_size, k=_INNER[name] * model.hidden_size // tp, ranks=tp)


def configurations(group: str | None = None):
    """``(model, tp, sublayer name)`` for every evaluated sublayer (of one group, or all)."""
    for model in MODELS.values():
        if group is not None and model.group != group:
            continue
        for tp in model.tp_sizes:
            for name in SUBLAYERS:
                yield model, tp, name
