"""Tokenizers built with the ``tokenizers`` library from the pinned vocabulary files (never hand-written).

* GPT-2 byte-level BPE from ``gpt2-vocab.json`` + ``gpt2-merges.txt`` (Radford et al. 2019, sec. 2.2): no prefix
  space, no special-token post-processing, ``<|endoftext|>`` (id 50256) as the end-of-document token that Megatron
  uses as padding and lm-eval as the prefix of a first window.
* BERT uncased WordPiece from ``bert-large-uncased-vocab.txt`` (Devlin et al. 2019): lower-casing, accent
  stripping and Chinese-character splitting as in BERT's BasicTokenizer; ``[CLS]``/``[SEP]``/``[PAD]`` are looked up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from repro.text.data_files import BERT_VOCAB, data_path, gpt2_tokenizer_files
from repro.optional import require

if TYPE_CHECKING:  # the library itself is imported by the two builders only (it is optional)
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class TextTokenizer:
    """A tokenizer plus the ids an evaluation needs. ``encode`` never adds special tokens."""

    name: str
    backend: Tokenizer
    eod_id: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    pad_id: int | None = None
    mask_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [enc.ids for enc in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)


def gpt2_tokenizer(data_dir: str | os.PathLike | None = None) -> TextTokenizer:
    """GPT-2 byte-level BPE (50,257 tokens) from the verified vocab and merges files (the data directory's, else
    an installed wheel's copies)."""
    vocab, merges = gpt2_tokenizer_files(data_dir)
    tk = require("tokenizers", "the GPT-2 tokenizer")
    backend = tk.Tokenizer(tk.models.BPE.from_file(str(vocab), str(merges)))
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = tk.decoders.ByteLevel()
    eod = backend.token_to_id("<|endoftext|>")
    if eod is None:
        raise ValueError(f"GPT-2 vocabulary {str(vocab)!r} has no '<|endoftext|>' token")
    return TextTokenizer(name="gpt2-bpe", backend=backend, eod_id=eod, pad_id=eod)


def bert_tokenizer(data_dir: str | os.PathLike | None = None) -> TextTokenizer:
    """BERT uncased WordPiece (30,522 tokens) from the verified vocabulary file."""
    vocab = data_path(BERT_VOCAB, data_dir)
    tk = require("tokenizers", "the BERT tokenizer")
    backend = tk.Tokenizer(tk.models.WordPiece.from_file(str(vocab), unk_token="[UNK]", max_input_chars_per_word=100))
    backend.normalizer = tk.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    backend.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    backend.decoder = tk.decoders.WordPiece(prefix="##")
    ids = {name: backend.token_to_id(name) for name in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    missing = [name for name, idx in ids.items() if idx is None]
    if missing:
        raise ValueError(f"BERT vocabulary {str(vocab)!r} lacks the special tokens {missing}")
    return TextTokenizer(
        name="bert-uncased-wordpiece", backend=backend, cls_id=ids["[CLS]"], sep_id=ids["[SEP]"],
        pad_id=ids["[PAD]"], mask_id=ids["[MASK]"],
    )


#: the most a model's vocabulary may exceed its tokenizer's, as a share of the tokenizer's (padding is a few rows)
MAX_PADDING_SHARE = 0.125


def check_vocab_compatible(tokenizer: TextTokenizer, model_vocab_size: int) -> None:
    """A model must have a row for every token id the tokenizer can emit: a tokenizer larger than the model's
    vocabulary is refused (its ids above the model's rows have no logit).

    A vocabulary larger than the tokenizer's is accepted: Megatron-LM pads GPT-2's 50,257 to a multiple of
    ``make-vocab-size-divisible-by`` x tp and nanoGPT trains 50,304 rows; the ids above the tokenizer's are never
    produced as targets. Such a model is scored as lm-eval and Megatron score it: the log-softmax and the greedy
    argmax run over all of the model's ``model_vocab_size`` logits (lm-eval's ``HFLM`` takes ``log_softmax`` of every
    logit the model returns; Megatron's evaluation runs its vocab-parallel cross-entropy and argmax over the padded
    vocabulary), so a padded row the model gives weight to lowers the scores, as it does there. (Repro's own
    tensor-parallel padding, beyond ``model_vocab_size``, is masked out: it is not part of the model's vocabulary.)
    Padding adds a few rows (under 128 x tp for Megatron, 47 for nanoGPT); a model more than
    :data:`MAX_PADDING_SHARE` larger than the tokenizer was built for another one (BERT's 30,522 WordPiece tokens
    on GPT-2's 50,257 rows) and is refused too.
    """
    if model_vocab_size - tokenizer.vocab_size > tokenizer.vocab_size * MAX_PADDING_SHARE:
        raise ValueError(
            f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model_vocab_size}, {model_vocab_size - tokenizer.vocab_size} more: padding (Megatron's "
            "make-vocab-size-divisible-by x tp, nanoGPT's 50304) adds at most "
            f"{MAX_PADDING_SHARE:.1%} of the tokenizer's; was the model trained with another tokenizer?"
        )
    if tokenizer.vocab_size > model_vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model_vocab_size}: ids {model_vocab_size}..{tokenizer.vocab_size - 1} would have no logit; the model's "
            "vocabulary must hold the tokenizer's (it may be padded above it), was it trained with another tokenizer?"
        )
