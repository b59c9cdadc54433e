"""A tokenized text corpus for training, laid out like Megatron-LM's indexed datasets (``<prefix>.bin`` + index).

``tokenize_corpus`` reads local text files through Hugging Face ``datasets`` (nothing is downloaded), encodes each
document with GPT-2's byte-level BPE (:func:`repro.text.tokenization.gpt2_tokenizer`, built from the pinned vocabulary
files) and appends the end-of-document token ``<|endoftext|>`` (id 50256) after every document, as Megatron's
``preprocess_data.py --append-eod`` does. It writes

* ``<prefix>.bin``: the flat token stream, little-endian uint16 (GPT-2's 50,257 ids fit below 65,536);
* ``<prefix>.idx.json``: dtype, token and document counts, the largest token id (``max_token_id``, so a trainer
  checks its vocabulary without reading the .bin), document start offsets, the sha256 of the .bin, of every source
  file and of the tokenizer files, and the format version.

Both are written to temporary names and renamed, so a reader never sees half a file. :class:`TokenCorpus` maps the
.bin read-only; :meth:`TokenCorpus.samples` cuts it into training samples (:mod:`repro.training.corpus_samples`).

Documents: ``file`` (each file is one document), ``line`` (each non-blank line), ``wikitext`` (each WikiText
article, starting at a level-1 heading ``" = Title = "``, :func:`repro.text.wikitext_articles.split_articles`). WikiText is
word-tokenized; ``detokenize="wikitext"`` undoes that first (:func:`repro.text.detokenize.wikitext_detokenize`), as the
zero-shot evaluation does, so training and evaluation see the same kind of text.

Worked example (WikiText-103 valid as the training split; test stays held out for ``python -m evals wikitext``):

    python -m repro.training.corpus --wikitext103 valid --output-prefix data/wikitext103-valid

Any local files:

    python -m repro.training.corpus --input a.txt --input b.txt --documents line --output-prefix data/mine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NoReturn, Sequence

import numpy as np
from tqdm import tqdm

from repro.text.data_files import (
    ALL_FILES, DEFAULT_DATA_DIR_TEXT, GPT2_MERGES, GPT2_VOCAB, WIKITEXT_TEST, WIKITEXT_VALID, DataError, data_path,
    gpt2_tokenizer_files, resolve_data_dir, sha256_file, verify_sha256,
)
from repro.text.detokenize import wikitext_detokenize
from repro.text.tokenization import TextTokenizer, gpt2_tokenizer
from repro.text.wikitext_articles import split_articles
from repro.atomic_files import atomic_write
from repro.input_files import check_regular_file, open_regular
from repro.optional import MissingPackage, require

if TYPE_CHECKING:  # imported where samples are drawn: tokenizing text (repro corpus) needs no torch
    from repro.training.corpus_samples import CorpusSamples

FORMAT = "repro-token-corpus"
FORMAT_VERSION = 1
TOKEN_DTYPE = np.dtype("<u2")
DOCUMENT_MODES = ("file", "line", "wikitext")
DETOKENIZERS = ("none", "wikitext")
WIKITEXT103_SPLITS = {"valid": WIKITEXT_VALID, "test": WIKITEXT_TEST}
GPT2_VOCAB_SIZE = 50257  # GPT-2's byte-level BPE: ids 0 .. 50256 (<|endoftext|>)
WIKITEXT103_EXAMPLE = "python -m repro.training.corpus --wikitext103 valid --output-prefix data/wikitext103-valid"
_ENCODE_CHUNK = 256  # documents per encode_batch call (the tokenizers library encodes a batch on all cores)


class CorpusError(ValueError):
    """A corpus input or output is missing, unreadable, or does not match its recorded checksum or size."""


def default_vocab_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder of GPT-2's tokenizer files: ``<data dir>/tokenizers`` (the data dir is ``data_dir``, else
    :func:`repro.text.data_files.default_data_dir`), else the copies an installed wheel carries."""
    return gpt2_tokenizer_files(data_dir)[0].parent


def wikitext103_file(split: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The checked local WikiText-103 ``split`` file (``valid`` or ``test``; the train split is not shipped)."""
    if split not in WIKITEXT103_SPLITS:
        raise CorpusError(f"WikiText-103 split {split!r} is not one of {sorted(WIKITEXT103_SPLITS)}")
    return data_path(WIKITEXT103_SPLITS[split], data_dir)


def load_gpt2(vocab_dir: str | os.PathLike) -> TextTokenizer:
    """GPT-2 BPE from ``vocab_dir``/gpt2-vocab.json and gpt2-merges.txt, both checked against their pinned sha256.

    The tokenizer is :func:`repro.text.tokenization.gpt2_tokenizer` (one definition for training and evaluation); it reads
    ``<data dir>/tokenizers/``, so a folder with another name is presented to it through a symlink.
    """
    if Path(vocab_dir).exists() and not Path(vocab_dir).is_dir():
        raise CorpusError(f"vocabulary folder {str(vocab_dir)!r} is a file; it must be the folder holding "
                          "gpt2-vocab.json and gpt2-merges.txt")
    folder = Path(vocab_dir).resolve()
    for pinned in (GPT2_VOCAB, GPT2_MERGES):
        verify_sha256(folder / Path(pinned.relpath).name, pinned.sha256, pinned.description)
    if folder.name == Path(GPT2_VOCAB.relpath).parent.name:
        return gpt2_tokenizer(folder.parent)
    with tempfile.TemporaryDirectory() as shim:
        (Path(shim) / Path(GPT2_VOCAB.relpath).parent).symlink_to(folder, target_is_directory=True)
        return gpt2_tokenizer(shim)  # the files are read while building, the symlink may go afterwards


def _pinned_sha256(path: Path) -> str | None:
    """The pinned sha256 when ``path`` is one of the data directory's known files, else None."""
    try:
        root = resolve_data_dir()
    except DataError:
        return None
    return next((f.sha256 for f in ALL_FILES if (root / f.relpath).resolve() == path.resolve()), None)


def _read_documents(path: Path, mode: str, cache_dir: str) -> list[str]:
    """The documents of one local text file, read with ``datasets`` (line endings normalised to ``\\n``)."""
    datasets = require("datasets", "tokenizing a corpus")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        table = datasets.load_dataset("text", data_files=[str(path)], split="train", keep_linebreaks=True,
                                      cache_dir=cache_dir)
    except datasets.exceptions.DatasetGenerationError as err:
        cause = err.__cause__ or err
        raise CorpusError(f"input file {str(path)!r} is not readable as UTF-8 text ({cause})") from None
    lines: list[str] = table["text"][:]
    if mode == "line":
        return [line for line in lines if line.strip()]
    text = "".join(lines)
    return split_articles(text) if mode == "wikitext" else [text]


def _check_output(prefix: Path) -> None:
    from repro.paths import name_problem

    problem = name_problem(f"{prefix}.idx.json")  # the longer of the two names it writes
    if problem is not None:
        raise CorpusError(f"output prefix {str(prefix)!r} + '.idx.json' {problem}")
    parent = prefix.parent
    blocking = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise CorpusError(f"output directory {str(parent)!r} cannot be created: {str(blocking)!r} is a file, not a "
                          "directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CorpusError(f"output directory {str(parent)!r} cannot be created ({err.strerror})") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CorpusError(f"output directory {str(parent)!r} is not writable (the output prefix must be writable)")
    for taken in (Path(f"{prefix}.bin"), Path(f"{prefix}.idx.json")):
        if taken.is_dir():
            raise CorpusError(f"output {str(taken)!r} is a directory; the output prefix must name two files")


def tokenize_corpus(
    text_files: Sequence[str | os.PathLike], output_prefix: str | os.PathLike, *,
    vocab_dir: str | os.PathLike | None = None, documents: str = "file", detokenize: str = "none",
    sha256: Sequence[str | None] | None = None, progress: bool = True,
) -> Path:
    """Tokenize ``text_files`` into ``<output_prefix>.bin`` and ``<output_prefix>.idx.json``; return the prefix.

    ``vocab_dir`` holds gpt2-vocab.json and gpt2-merges.txt (default :func:`default_vocab_dir`). ``sha256`` pins the
    input files in order (None: not pinned); a file of the data directory with a SOURCE.md checksum is always
    checked against it. Raises :class:`CorpusError` (or :class:`repro.text.data_files.DataError`) naming the bad value.
    """
    if documents not in DOCUMENT_MODES:
        raise CorpusError(f"documents={documents!r} is not one of {DOCUMENT_MODES}")
    if detokenize not in DETOKENIZERS:
        raise CorpusError(f"detokenize={detokenize!r} is not one of {DETOKENIZERS}")
    paths = [Path(p) for p in text_files]
    pins = list(sha256) if sha256 is not None else [None] * len(paths)
    if not paths:
        raise CorpusError("no input files: give at least one text file")
    if len(pins) != len(paths):
        raise CorpusError(f"{len(pins)} sha256 values for {len(paths)} input files; give one per input, in order")
    sources = []
    for path, pin in zip(paths, pins):
        if not os.path.lexists(path):
            raise CorpusError(f"input file {str(path)!r} does not exist")
        check_regular_file(path, what="input file", error=CorpusError)
        if path.stat().st_size == 0:
            raise CorpusError(f"input file {str(path)!r} is empty: it holds no text to tokenize")
        expected = pin or _pinned_sha256(path)
        if expected:
            verify_sha256(path, expected, "an input file")
        actual = expected or sha256_file(path)
        sources.append({"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": actual})
    prefix = Path(output_prefix)
    _check_output(prefix)
    folder = Path(vocab_dir) if vocab_dir is not None else default_vocab_dir()
    tokenizer = load_gpt2(folder)
    eod = np.array([tokenizer.eod_id], dtype=TOKEN_DTYPE).tobytes()
    offsets = [0]
    max_token_id = [tokenizer.eod_id]  # every document ends with the EOD token

    def token_chunks() -> Iterator[bytes]:
        with tempfile.TemporaryDirectory(prefix="repro-corpus-") as cache_dir:
            for path in paths:
                docs = _read_documents(path, documents, cache_dir)
                if not docs:
                    raise CorpusError(f"input file {str(path)!r} holds no documents (--documents {documents})")
                if detokenize == "wikitext":
                    docs = [wikitext_detokenize(doc) for doc in docs]
                bar = tqdm(total=len(docs), desc=f"tokenize {path.name}", unit="doc", file=sys.stderr,
                           disable=not progress)
                for start in range(0, len(docs), _ENCODE_CHUNK):
                    batch = docs[start: start + _ENCODE_CHUNK]
                    for ids in tokenizer.encode_batch(batch):
                        offsets.append(offsets[-1] + len(ids) + 1)
                        max_token_id[0] = max(max_token_id[0], max(ids, default=0))
                        yield np.asarray(ids, dtype=TOKEN_DTYPE).tobytes() + eod
                    bar.update(len(batch))
                bar.close()

    bin_path = Path(f"{prefix}.bin")
    bin_sha256 = atomic_write(bin_path, token_chunks())
    index = {
        "format": FORMAT, "version": FORMAT_VERSION, "dtype": TOKEN_DTYPE.str,
        "num_tokens": offsets[-1], "num_documents": len(offsets) - 1,
        "eod_id": tokenizer.eod_id, "vocab_size": tokenizer.vocab_size, "max_token_id": max_token_id[0],
        "bin_bytes": offsets[-1] * TOKEN_DTYPE.itemsize, "bin_sha256": bin_sha256,
        "documents": documents, "detokenize": detokenize, "sources": sources,
        "tokenizer": {"name": tokenizer.name, "files": {Path(f.relpath).name: f.sha256
                                                        for f in (GPT2_VOCAB, GPT2_MERGES)}},
    }
    # readable metadata first, then the (possibly long) offsets on one line
    text = json.dumps(index, indent=1)[:-2] + ',\n "document_offsets": ' + json.dumps(offsets, separators=(",", ":"))
    atomic_write(Path(f"{prefix}.idx.json"), iter([(text + "\n}\n").encode()]))
    return prefix


#: the integers a well-formed index holds: key -> lowest allowed value. ``max_token_id`` is optional (indexes
#: written before it was recorded lack it; see :func:`max_token_id`).
_INDEX_FIELDS = {"num_tokens": 0, "num_documents": 0, "vocab_size": 1, "eod_id": 0}


def read_index(prefix: str | os.PathLike) -> dict:
    """The parsed ``<prefix>.idx.json``, checked to be well formed (a :class:`CorpusError` names the file, the key
    and the rule): a JSON object of this format and version whose counts are whole numbers in range."""
    index_path = Path(f"{prefix}.idx.json")
    hint = f"tokenize it first, e.g. {WIKITEXT103_EXAMPLE}"
    if not os.path.lexists(index_path):
        raise CorpusError(f"corpus index {str(index_path)!r} does not exist; {hint}")
    try:
        with open_regular(index_path, what="corpus index", error=CorpusError) as handle:
            index = json.loads(handle.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CorpusError(f"corpus index {str(index_path)!r} is not valid JSON ({err})") from None
    except OSError as err:
        raise CorpusError(f"corpus index {str(index_path)!r} cannot be read ({err.strerror})") from None
    if not isinstance(index, dict):
        raise CorpusError(f"corpus index {str(index_path)!r} holds a JSON {type(index).__name__}, not an object; "
                          f"{hint}")
    header = tuple(index.get(key) for key in ("format", "version", "dtype"))
    if header != (FORMAT, FORMAT_VERSION, TOKEN_DTYPE.str):
        raise CorpusError(f"{str(index_path)!r} has (format, version, dtype) = {header}, expected "
                          f"{(FORMAT, FORMAT_VERSION, TOKEN_DTYPE.str)}; {hint}")
    fields = dict(_INDEX_FIELDS, **({"max_token_id": 0} if "max_token_id" in index else {}))
    for key, lowest in fields.items():
        value = index.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            what = f"lacks {key} (" if key not in index else f"has {key}={value!r} ("
            raise CorpusError(f"corpus index {str(index_path)!r} {what}it must be an integer >= {lowest}); {hint}")
    if not isinstance(index.get("bin_sha256"), str):
        raise CorpusError(f"corpus index {str(index_path)!r} lacks bin_sha256 (a hex string); {hint}")
    return index


def max_token_id(index: dict) -> int | None:
    """The largest token id of the corpus an index (:func:`read_index`) describes, without reading its .bin.

    Recorded as ``max_token_id`` since it was added. An older index lacks it; if its tokenizer files are the pinned
    GPT-2 ones, its ids came from GPT-2's BPE, all below GPT-2's 50,257 (and the .bin is checked against the
    index's sha256 when opened, so the ids are the tokenizer's): the bound is 50,256. Otherwise None (unknown:
    re-tokenize the corpus to record it)."""
    if "max_token_id" in index:
        return int(index["max_token_id"])
    files = (index.get("tokenizer") or {}).get("files") if isinstance(index.get("tokenizer"), dict) else None
    pinned = {Path(f.relpath).name: f.sha256 for f in (GPT2_VOCAB, GPT2_MERGES)}
    return GPT2_VOCAB_SIZE - 1 if files == pinned else None


class TokenCorpus:
    """A tokenized corpus ``<prefix>.bin`` mapped read-only, checked against ``<prefix>.idx.json`` when opened.

    ``verify=True`` also hashes the .bin once: ~0.6 s per GB (WikiText-103 valid: 0.5 MB; train would be ~0.25 GB).
    """

    def __init__(self, prefix: str | os.PathLike, *, verify: bool = True) -> None:
        self.prefix = Path(prefix)
        self.index_path, self.bin_path = Path(f"{prefix}.idx.json"), Path(f"{prefix}.bin")
        hint = f"tokenize it first, e.g. {WIKITEXT103_EXAMPLE}"
        self.index = read_index(prefix)
        if not os.path.lexists(self.bin_path):
            raise CorpusError(f"corpus data {str(self.bin_path)!r} does not exist; {hint}")
        check_regular_file(self.bin_path, what="corpus data", error=CorpusError)
        size, expected = self.bin_path.stat().st_size, self.num_tokens * TOKEN_DTYPE.itemsize
        if size != expected:
            raise CorpusError(
                f"corpus data {str(self.bin_path)!r} has {size} bytes but its index records {self.num_tokens} "
                f"uint16 tokens = {expected} bytes; the file is truncated or from another run, {hint}")
        if verify and (actual := sha256_file(self.bin_path)) != self.index["bin_sha256"]:
            raise CorpusError(f"checksum mismatch for {str(self.bin_path)!r}: sha256 is {actual}, its index records "
                              f"{self.index['bin_sha256']}; the file was changed after tokenizing, {hint}")
        self.tokens: np.ndarray = (np.memmap(self.bin_path, dtype=TOKEN_DTYPE, mode="r", shape=(self.num_tokens,))
                                   if self.num_tokens else np.zeros(0, dtype=TOKEN_DTYPE))

    @property
    def num_tokens(self) -> int:
        return int(self.index["num_tokens"])

    @property
    def num_documents(self) -> int:
        return int(self.index["num_documents"])

    @property
    def vocab_size(self) -> int:
        return int(self.index["vocab_size"])

    @property
    def eod_id(self) -> int:
        return int(self.index["eod_id"])

    def samples(self, seq_len: int, *, seed: int = 0) -> CorpusSamples:
        """Non-overlapping windows of ``seq_len + 1`` tokens, shuffled per epoch by ``seed``."""
        from repro.training.corpus_samples import CorpusSamples  # torch, needed only here

        return CorpusSamples(self.tokens, seq_len=seq_len, seed=seed, vocab_size=self.vocab_size,
                             name=str(self.bin_path))

    def __repr__(self) -> str:
        return f"TokenCorpus({str(self.prefix)!r}, num_tokens={self.num_tokens}, documents={self.num_documents})"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def _sha256_hex(text: str) -> str:
    """--sha256: 64 hexadecimal digits."""
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sha256: it must be 64 hexadecimal digits")
    return text.lower()


def _output_prefix(text: str) -> Path:
    """--output-prefix: a file name prefix (PREFIX.bin, PREFIX.idx.json), not empty and not a directory name."""
    if not text or text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} must be a file name prefix such as data/mine (it writes "
                                         "PREFIX.bin and PREFIX.idx.json), not a directory")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="repro corpus", description=__doc__.split("\n\n")[0] + " (repro corpus = python -m "
                     "repro.training.corpus)",
                     epilog=f"worked example:\n  {WIKITEXT103_EXAMPLE}",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", action="append", metavar="FILE", type=Path,
                        help="a local UTF-8 text file; repeat for several files, tokenized in the given order")
    source.add_argument("--wikitext103", choices=sorted(WIKITEXT103_SPLITS),
                        help="the checked WikiText-103 file of this split from the data directory; implies "
                             "--documents wikitext --detokenize wikitext")
    parser.add_argument("--output-prefix", required=True, type=_output_prefix, metavar="PREFIX",
                        help="writes PREFIX.bin and PREFIX.idx.json (directories are created)")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help=f"data directory (default: {DEFAULT_DATA_DIR_TEXT})")
    parser.add_argument("--vocab-dir", type=Path, default=None, metavar="DIR",
                        help="folder with gpt2-vocab.json and gpt2-merges.txt (default: <data dir>/tokenizers)")
    parser.add_argument("--documents", choices=DOCUMENT_MODES, default=None,
                        help="what one document is, each followed by <|endoftext|>: a whole file, a non-blank "
                             "line, or a WikiText article (default: file; wikitext with --wikitext103)")
    parser.add_argument("--detokenize", choices=DETOKENIZERS, default=None,
                        help="undo WikiText's word tokenization before BPE (default: none; wikitext with "
                             "--wikitext103)")
    parser.add_argument("--sha256", action="append", metavar="HEX", type=_sha256_hex,
                        help="expected sha256 of the i-th --input (repeat once per input; default: unchecked, "
                             "except files of the data directory, always checked against SOURCE.md)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (default: shown)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        wiki = args.wikitext103 is not None
        inputs = [wikitext103_file(args.wikitext103, args.data_dir)] if wiki else args.input
        prefix = tokenize_corpus(
            inputs, args.output_prefix, vocab_dir=args.vocab_dir or default_vocab_dir(args.data_dir),
            documents=args.documents or ("wikitext" if wiki else "file"),
            detokenize=args.detokenize or ("wikitext" if wiki else "none"), sha256=args.sha256,
            progress=not args.no_progress)
        corpus = TokenCorpus(prefix, verify=False)
    except (CorpusError, DataError, MissingPackage) as err:
        print(f"repro corpus: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {corpus.bin_path} and {corpus.index_path}: {corpus.num_tokens} tokens, "
          f"{corpus.num_documents} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
