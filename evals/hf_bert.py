"""BERT in Hugging Face's names, both ways: ``BertModel``/``BertForPreTraining`` (post-LN) and ``MegatronBert*``
(pre-LN), to and from repro's BERT; the multiple-choice head of RACE finetuning as ``*ForMultipleChoice``.

Megatron-LM's paper compares the two placements of LayerNorm (Shoeybi et al. 2019, sec. 3.2 and Fig. 7): the
original BERT's post-LN (7a, repro's ``layernorm_placement="original"``) and Megatron's pre-LN (7b, ``"megatron"``,
repro's default), which also drops the embedding LayerNorm and adds one after the last layer. Hugging Face has both:
``bert`` for 7a and ``megatron-bert`` for 7b. Query, key and value are separate there; repro fuses them with rows
ordered (head, q|k|v, head_dim), so that a tensor-parallel split hands each rank whole heads.

Name tables, as repro name -> Hugging Face name (the encoder's names are under ``bert.`` in the heads' models):

============================================  ==========================================  =======================
repro                                         ``bert`` (post-LN)                          ``megatron-bert`` (pre-LN)
============================================  ==========================================  =======================
``embedding_layernorm``                       ``embeddings.LayerNorm``                    (none)
``layers.i.input_layernorm``                  ``encoder.layer.i.attention.output.LayerNorm``  ``...attention.ln``
``layers.i.post_attention_layernorm``         ``encoder.layer.i.output.LayerNorm``        ``encoder.layer.i.ln``
``final_layernorm``                           (none)                                      ``encoder.ln``
============================================  ==========================================  =======================
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from repro.models import BertConfig
from repro.zero.checkpoint import CheckpointError

#: Hugging Face's model_type for each of repro's LayerNorm placements
MODEL_TYPES = {"original": "bert", "megatron": "megatron-bert"}
_PLACEMENTS = {v: k for k, v in MODEL_TYPES.items()}
#: Hugging Face's hidden_act -> repro's gelu_approximate
_GELUS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}

#: the heads repro's BERT has, as (repro name, Hugging Face name) with the encoder's prefix left out
_HEADS = (
    ("pooler.weight", "bert.pooler.dense.weight"), ("pooler.bias", "bert.pooler.dense.bias"),
    ("lm_head.dense.weight", "cls.predictions.transform.dense.weight"),
    ("lm_head.dense.bias", "cls.predictions.transform.dense.bias"),
    ("lm_head.layernorm.weight", "cls.predictions.transform.LayerNorm.weight"),
    ("lm_head.layernorm.bias", "cls.predictions.transform.LayerNorm.bias"),
    ("binary_head.weight", "cls.seq_relationship.weight"), ("binary_head.bias", "cls.seq_relationship.bias"),
)


def _layernorm_names(placement: str, i: int) -> dict[str, str]:
    """repro -> Hugging Face names of layer ``i``'s two LayerNorms (prefixes: ``layers.i.``, ``encoder.layer.i.``)."""
    if placement == "original":
        return {"input_layernorm": "attention.output.LayerNorm", "post_attention_layernorm": "output.LayerNorm"}
    return {"input_layernorm": "attention.ln", "post_attention_layernorm": "ln"}


def _split_heads(fused: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """repro's fused rows (head, q|k|v, head_dim) -> [query, key, value]; weights [3h, in] and biases [3h]."""
    rest = fused.shape[1:]
    by_part = fused.reshape(heads, 3, -1, *rest).transpose(0, 1)
    return [by_part[j].reshape(-1, *rest).contiguous() for j in range(3)]


def _fuse_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of :func:`_split_heads`."""
    stacked = torch.stack([query, key, value])  # [3, h(, in)]
    rest = query.shape[1:]
    return stacked.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(3 * query.shape[0], *rest).contiguous()


def hf_config_values(hf: Mapping, where: str, *, ints: tuple[str, ...],
                     optional: Mapping[str, Any]) -> dict[str, Any]:
    """The values of a Hugging Face config.json that a repro config is built from: each of ``ints`` present and a
    positive integer, each of ``optional`` (name -> default) a number or null when present; a CheckpointError
    starting with ``where`` and naming the key otherwise."""
    values = {}
    for key in ints:
        value = hf.get(key)
        if key not in hf:
            raise CheckpointError(f"{where} lacks the key {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"{where}: {key}={value!r} must be a positive integer")
        values[key] = value
    for key, default in optional.items():
        value = hf.get(key, default)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise CheckpointError(f"{where}: {key}={value!r} must be a number")
        values[key] = value
    return values


def source_tensor(src: Mapping[str, torch.Tensor], name: str, where: str) -> torch.Tensor:
    """``src[name]``, or a CheckpointError naming the tensor the config needs and the weights lack, or one that is
    not floating point (integer weights would be cast without a word)."""
    if name not in src:
        raise CheckpointError(f"{where}: the checkpoint does not match its config: tensor {name!r} is missing")
    tensor = src[name]
    if not tensor.is_floating_point():
        raise CheckpointError(f"{where}: tensor {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}; a "
                              "model's weights are floating point (F16, BF16, F32 or F64)")
    return tensor


def bert_config(hf: Mapping, where: str = "config.json") -> BertConfig:
    """repro's BertConfig from a ``bert`` or ``megatron-bert`` config.json; CheckpointError for what repro lacks."""
    if not isinstance(hf, Mapping):
        raise CheckpointError(f"{where} holds a JSON {type(hf).__name__}, not an object")
    model_type = hf.get("model_type")
    if model_type not in _PLACEMENTS:
        raise CheckpointError(f"{where} has model_type {model_type!r}, expected 'bert' or 'megatron-bert' for a "
                              "BERT model")
    act = hf.get("hidden_act", "gelu")
    if act not in _GELUS:
        raise CheckpointError(f"{where}: hidden_act={act!r}: repro's BERT has erf-GELU ('gelu') and tanh-GELU "
                              "('gelu_new') only")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{where}: only absolute position embeddings are supported")
    v = hf_config_values(hf, where, ints=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                          "max_position_embeddings", "intermediate_size"),
                         optional={"type_vocab_size": 2, "layer_norm_eps": 1e-12})
    try:
        return BertConfig(
            vocab_size=v["vocab_size"], hidden_size=v["hidden_size"], num_layers=v["num_hidden_layers"],
            num_attention_heads=v["num_attention_heads"], max_position_embeddings=v["max_position_embeddings"],
            ffn_hidden_size=v["intermediate_size"], num_tokentypes=v["type_vocab_size"],
            layernorm_epsilon=v["layer_norm_eps"], layernorm_placement=_PLACEMENTS[model_type],
            gelu_approximate=_GELUS[act], hidden_dropout=0.0, attention_dropout=0.0,
        )
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None


def _renamed(config: BertConfig) -> list[tuple[str, str]]:
    """(repro name, Hugging Face name) of every tensor that is only renamed, both ways: the embeddings, the
    placement's LayerNorms, and each layer's attention output and MLP. The fused QKV and the heads are apart."""
    names = [("embedding.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"),
             ("embedding.position_embeddings.weight", "bert.embeddings.position_embeddings.weight"),
             ("embedding.tokentype_embeddings.weight", "bert.embeddings.token_type_embeddings.weight")]
    outer = ("embedding_layernorm", "bert.embeddings.LayerNorm") if config.layernorm_placement == "original" else (
        "final_layernorm", "bert.encoder.ln")
    names += [(f"{outer[0]}.{part}", f"{outer[1]}.{part}") for part in ("weight", "bias")]
    for i in range(config.num_layers):
        p, q = f"bert.encoder.layer.{i}.", f"layers.{i}."
        pairs = {"attention.dense": "attention.output.dense", "mlp.fc1": "intermediate.dense",
                 "mlp.fc2": "output.dense", **_layernorm_names(config.layernorm_placement, i)}
        names += [(f"{q}{ours}.{part}", f"{p}{theirs}.{part}") for ours, theirs in pairs.items()
                  for part in ("weight", "bias")]
    return names


def convert_bert(hf_state: Mapping[str, torch.Tensor], config: BertConfig,
                 where: str = "the weights") -> dict[str, torch.Tensor]:
    """HF ``Bert*``/``MegatronBert*`` state dict (with or without heads) -> repro BERT state dict. Heads absent
    from the source (pooler, MLM, NSP) are left out (the caller's model keeps its initialisation); a
    ``*ForMultipleChoice`` classifier becomes ``head.*`` and the encoder ``bert.*`` (:class:`MultipleChoiceModel`).
    A tensor the config needs and the weights lack, or that does not fuse, is a CheckpointError naming it."""
    src = {k if k.startswith(("bert.", "cls.", "classifier.")) else f"bert.{k}": v for k, v in hf_state.items()}
    out = {ours: source_tensor(src, theirs, where) for ours, theirs in _renamed(config)}
    for i in range(config.num_layers):
        p = f"bert.encoder.layer.{i}.attention.self."
        for part in ("weight", "bias"):
            parts = [source_tensor(src, f"{p}{n}.{part}", where) for n in ("query", "key", "value")]
            try:
                out[f"layers.{i}.attention.qkv.{part}"] = _fuse_heads(*parts, config.num_attention_heads)
            except RuntimeError:
                raise CheckpointError(f"{where}: the checkpoint does not match its config: {p}query/key/value.{part} "
                                      f"of shapes {[tuple(t.shape) for t in parts]} do not fuse into "
                                      f"{config.num_attention_heads} heads") from None
    out.update({ours: src[theirs] for ours, theirs in _HEADS if theirs in src})
    if "cls.predictions.bias" in src:
        out["lm_head.bias"] = src["cls.predictions.bias"]
    out = {k: v.clone() for k, v in out.items()}
    if "classifier.weight" in src and "classifier.bias" in src:  # the multiple-choice model: encoder under bert., its head as head.
        out = {f"bert.{k}": v for k, v in out.items()}
        out["head.weight"], out["head.bias"] = src["classifier.weight"].clone(), src["classifier.bias"].clone()
    return out


def bert_hf_state(state: Mapping[str, torch.Tensor], config: BertConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`convert_bert`: a consolidated repro BERT state dict (or a multiple-choice model's,
    encoder under ``bert.``, head under ``head.``) -> the state dict of :func:`bert_architecture`'s model, in
    float32, vocabulary rows beyond ``config.vocab_size`` (the tensor-parallel padding) dropped."""
    multiple_choice = "head.weight" in state
    enc = {k.removeprefix("bert."): v for k, v in state.items()} if multiple_choice else dict(state)
    out = {theirs: enc[ours] for ours, theirs in _renamed(config)}
    vocab = config.vocab_size
    out["bert.embeddings.word_embeddings.weight"] = out["bert.embeddings.word_embeddings.weight"][:vocab]
    for i in range(config.num_layers):
        p = f"bert.encoder.layer.{i}.attention.self."
        for part in ("weight", "bias"):
            split = _split_heads(enc[f"layers.{i}.attention.qkv.{part}"], config.num_attention_heads)
            out.update({f"{p}{name}.{part}": tensor for name, tensor in zip(("query", "key", "value"), split)})
    architecture = bert_architecture(state, config)
    for ours, theirs in _HEADS:
        if ours in enc and (theirs.startswith("bert.") or architecture.endswith("ForPreTraining")):
            out[theirs] = enc[ours]
    if architecture.endswith("ForPreTraining"):
        # the decoder's weight and bias are not stored: Hugging Face ties them to the word embeddings and to
        # cls.predictions.bias (tie_word_embeddings), so each tensor is written once
        out["cls.predictions.bias"] = enc["lm_head.bias"][:vocab]
    if multiple_choice:
        out["classifier.weight"], out["classifier.bias"] = state["head.weight"], state["head.bias"]
    if architecture.endswith("Model"):  # the bare encoder: Hugging Face names it without the prefix
        out = {k.removeprefix("bert."): v for k, v in out.items()}
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def bert_architecture(state: Mapping[str, torch.Tensor], config: BertConfig) -> str:
    """The Hugging Face class a repro BERT state dict exports as: ``*ForMultipleChoice`` (RACE's finetuned model),
    ``*ForPreTraining`` (the masked-LM and next-sentence heads are there), else ``*Model``."""
    prefix = "MegatronBert" if config.layernorm_placement == "megatron" else "Bert"
    if "head.weight" in state:
        return f"{prefix}ForMultipleChoice"
    if "lm_head.dense.weight" in state and "binary_head.weight" in state:
        return f"{prefix}ForPreTraining"
    return f"{prefix}Model"


def bert_config_json(config: BertConfig, architecture: str) -> dict:
    """``config.json`` of ``architecture`` with ``config``'s shape (no dropout: an exported model evaluates)."""
    return {
        "model_type": MODEL_TYPES[config.layernorm_placement], "architectures": [architecture],
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.ffn_size,
        "hidden_act": "gelu" if config.gelu_approximate == "none" else "gelu_pytorch_tanh",
        "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.num_tokentypes,
        "layer_norm_eps": config.layernorm_epsilon, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "position_embedding_type": "absolute", "tie_word_embeddings": True,
        "pad_token_id": 0, "torch_dtype": "float32",
    }
