"""Where the evaluation data lives and how it is verified before use.

The data is never downloaded at run time: it is read from a data directory, which one function decides for every
reader (the evaluations, the corpus tool, the experiments, ``repro export-hf``) and for ``repro data fetch``, the
one writer: :func:`default_data_dir` (``$REPRO_DATA``, else ``../shared/data`` beside a checkout, else the per-user
data directory of an installed wheel), unless a command's ``--data-dir`` names another. Every file is checked
against the sha256 recorded in its folder's SOURCE.md before it is read, so a number can always be traced to the
exact bytes it was computed on.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from repro.checkout import REPO_ROOT, in_checkout, user_data_dir
from repro.input_files import check_regular_file, directory_problem, inside, open_regular

ENV_VAR = "REPRO_DATA"
#: the default data directory in words, for every --data-dir's help (:func:`default_data_dir`)
DEFAULT_DATA_DIR_TEXT = ("$REPRO_DATA, else ../shared/data beside a checkout, else the per-user data directory "
                         "($XDG_DATA_HOME/repro or ~/.local/share/repro)")


@dataclass(frozen=True)
class DataFile:
    """One file of the data directory: its path relative to the data directory and its pinned sha256."""

    relpath: str
    sha256: str
    description: str


# Pinned checksums, copied from each folder's SOURCE.md (see those files for the provenance of every byte).
WIKITEXT_TEST = DataFile(
    "wikitext103/wiki.test.tokens",
    "56db52eb157b1ab5c89646eef70510c1eca6e12a3bfdb99f0d6b05b4eacb75b9",
    "WikiText-103 v1 test split, word-level tokenized",
)
WIKITEXT_VALID = DataFile(
    "wikitext103/wiki.valid.tokens",
    "9aee9f52d6e77de6c7751fc5e7c44287db3ec0eaf15477098acc6b93c1c4250b",
    "WikiText-103 v1 validation split, word-level tokenized",
)
LAMBADA_TEST = DataFile(
    "lambada/lambada_test.jsonl",
    "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
    "LAMBADA test, OpenAI's detokenized version (5,153 passages)",
)
RACE_MANIFEST = DataFile(
    "race/SHA256SUMS",
    "88b9d0eaf695b7bc43bea3d72fe20922da7b33b02b4cbf4ff44735e0dae364a3",
    "sha256 manifest of every RACE test/dev file",
)
RACE_TRAIN = {
    "high": DataFile(
        "race/train-high.jsonl.gz",
        "3b00a249b84c36e0ce98b40416f478707e39313e34999a82a878c9ec1488b828",
        "RACE train/high, one passage per line",
    ),
    "middle": DataFile(
        "race/train-middle.jsonl.gz",
        "f363375db5df34bdfe77df50f5d2426589518466fe424a688774239a04575a81",
        "RACE train/middle, one passage per line",
    ),
}
GPT2_VOCAB = DataFile(
    "tokenizers/gpt2-vocab.json",
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "GPT-2 BPE vocabulary (OpenAI encoder.json)",
)
GPT2_MERGES = DataFile(
    "tokenizers/gpt2-merges.txt",
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "GPT-2 BPE merges (OpenAI vocab.bpe)",
)
BERT_VOCAB = DataFile(
    "tokenizers/bert-large-uncased-vocab.txt",
    "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "BERT uncased WordPiece vocabulary",
)

ALL_FILES = (WIKITEXT_TEST, WIKITEXT_VALID, LAMBADA_TEST, RACE_MANIFEST, *RACE_TRAIN.values(),
             GPT2_VOCAB, GPT2_MERGES, BERT_VOCAB)

#: the data sets by the name ``repro data fetch --only`` takes, and the files each one puts in the data directory
#: (RACE's test and dev files besides, pinned by race/SHA256SUMS)
DATASETS: dict[str, tuple[DataFile, ...]] = {
    "tokenizers": (GPT2_VOCAB, GPT2_MERGES, BERT_VOCAB),
    "lambada": (LAMBADA_TEST,),
    "wikitext103": (WIKITEXT_TEST, WIKITEXT_VALID),
    "race": (RACE_MANIFEST, *RACE_TRAIN.values()),
}


class DataError(ValueError):
    """The data directory is missing, incomplete or holds bytes other than the pinned ones."""


def default_data_dir() -> tuple[Path, str]:
    """(the data directory when no ``--data-dir`` names one, where that choice came from): ``$REPRO_DATA``; else
    ``<checkout>/../shared/data`` when repro runs from a checkout; else, for an installed wheel, the per-user data
    directory (:func:`repro.checkout.user_data_dir`: ``$XDG_DATA_HOME/repro`` or ``~/.local/share/repro`` on
    Linux), never a folder inside the installation. ``repro data fetch`` writes there and every reader reads there,
    so a fetch without options is what the rest finds."""
    if os.environ.get(ENV_VAR, "").strip():
        return Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    if in_checkout():
        return REPO_ROOT.parent / "shared" / "data", "the checkout's default ../shared/data"
    return user_data_dir(), "the per-user default"


def fetch_command(data_dir: str | os.PathLike | None = None, names: tuple[str, ...] | list[str] = ()) -> str:
    """The ``repro data fetch`` command line that fills ``data_dir`` (None: the default one) with ``names``."""
    only = "".join(f" --only {name}" for name in names)
    return f"repro data fetch{only}" + (f" --data-dir {data_dir}" if data_dir is not None else "")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data directory: the argument, else :func:`default_data_dir`.

    Raises :class:`DataError` (one line: where the path came from and the ``repro data fetch`` that fills it) when
    the directory does not exist.
    """
    if data_dir is not None:
        path, origin = Path(data_dir), "--data-dir"
        if not os.fspath(data_dir).strip():
            raise DataError(f"data directory {os.fspath(data_dir)!r} (from --data-dir) is empty: give a path (or "
                            f"leave the option out for the default, {DEFAULT_DATA_DIR_TEXT})")
    else:
        path, origin = default_data_dir()
    kind = directory_problem(path, missing_ok=True)  # a regular file, a FIFO, a symlink loop or dangling link
    if kind is not None and kind != "does not exist" and "missing" not in kind:
        kind = kind.replace("is a regular file, not", "is a file, not")
        raise DataError(f"data directory {str(path)!r} (from {origin}) {kind}; pass the folder that holds "
                        f"tokenizers/, lambada/, race/ and wikitext103/")
    if not path.is_dir():
        raise DataError(f"data directory {str(path)!r} (from {origin}) does not exist; download the data into it "
                        f"with: {fetch_command(path if data_dir is not None else None)} (or pass --data-dir, or set "
                        f"{ENV_VAR}, to read it from elsewhere)")
    return path.resolve()


def missing_datasets(names: tuple[str, ...] | list[str], data_dir: str | os.PathLike | None = None) -> list[str]:
    """Those of the data sets ``names`` (keys of :data:`DATASETS`) whose files are not all in the data directory
    (by name only: a reader still checks every file's sha256 before use). A missing directory misses them all."""
    try:
        root = resolve_data_dir(data_dir)
    except DataError:
        return list(names)
    return [name for name in names if not all((root / f.relpath).is_file() for f in DATASETS[name])]


def _data_root_of(path: Path) -> Path:
    """The data directory holding ``path`` (the parent of its top folder: tokenizers/, lambada/, race/, ...)."""
    for parent in path.parents:
        if parent.name in ("tokenizers", "lambada", "race", "wikitext103"):
            return parent.parent
    return path.parent


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """The sha256 of a regular file (a FIFO or a device is refused, :class:`DataError`: it would never end)."""
    digest = hashlib.sha256()
    with open_regular(path, what="data file", error=DataError) as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


# Verified (path, size, mtime_ns) -> sha256, so a file is hashed once per process.
_VERIFIED: dict[tuple[str, int, int], str] = {}


def verify_sha256(path: Path, expected: str, what: str = "") -> Path:
    """Check ``path`` exists and its sha256 equals ``expected``; return the path. Raises :class:`DataError`."""
    if not os.path.lexists(path):
        root = _data_root_of(path)
        names = [name for name, files in DATASETS.items() if any(root / f.relpath == path for f in files)]
        if not names and path.parent.name in ("tokenizers", "lambada", "race", "wikitext103"):
            names = [path.parent.name]
        elif not names and "RACE" in path.parts:
            names = ["race"]
        default = default_data_dir()[0]
        where = None if default.exists() and default.resolve() == root.resolve() else root
        raise DataError(f"expected data file {str(path)!r} ({what or 'see SOURCE.md'}) is missing; download it with: "
                        f"{fetch_command(where, names)}")
    check_regular_file(path, what=f"data file ({what or 'see SOURCE.md'})", error=DataError)
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    actual = _VERIFIED.get(key) or sha256_file(path)
    if actual != expected:
        raise DataError(
            f"checksum mismatch for {str(path)!r}: sha256 is {actual}, expected {expected} "
            "(the file is not the pinned version; see the folder's SOURCE.md)"
        )
    _VERIFIED[key] = actual
    return path


def data_path(data_file: DataFile, data_dir: str | os.PathLike | None = None) -> Path:
    """Absolute path of a pinned file, verified against its sha256."""
    root = resolve_data_dir(data_dir)
    return verify_sha256(root / data_file.relpath, data_file.sha256, data_file.description)


def race_split_files(split: str, level: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The verified per-passage files of RACE ``split`` (test or dev) and ``level`` (middle or high).

    Files are ordered by their numeric name; each is checked against the pinned manifest race/SHA256SUMS.
    """
    if split not in ("test", "dev"):
        raise ValueError(f"RACE split {split!r} is not one of 'test', 'dev' (train is read from train-*.jsonl.gz)")
    if level not in ("middle", "high"):
        raise ValueError(f"RACE level {level!r} is not one of 'middle', 'high'")
    root = resolve_data_dir(data_dir)
    manifest = data_path(RACE_MANIFEST, root)
    prefix = f"RACE/{split}/{level}/"
    pinned = {}
    for line in manifest.read_text().splitlines():  # verified against its pinned sha256 just above
        digest, rel = line.split(maxsplit=1)
        if rel.startswith(prefix):
            pinned[rel] = digest
    if not pinned:
        raise DataError(f"manifest {str(manifest)!r} lists no files under {prefix}")
    rels = sorted(pinned, key=lambda rel: int(Path(rel).stem))
    return [verify_sha256(inside(root / "race", rel, what=f"manifest {str(manifest)!r}", error=DataError,
                                 missing_ok=True), pinned[rel], f"RACE {split}/{level}") for rel in rels]


#: where an installed wheel carries GPT-2's tokenizer files: its build copies them from the data directory, checked
#: against their pinned sha256 (setup.py), with their license (openai/gpt-2's Modified MIT License, which allows it:
#: GPT2_TOKENIZER_LICENSE beside this file); a checkout has no such folder and reads the data directory
SHIPPED_GPT2_DIR = Path(__file__).resolve().parent / "gpt2_tokenizer"


def gpt2_tokenizer_files(data_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(vocabulary, merges) of GPT-2's BPE, each checked against its pinned sha256: the data directory's, else the
    copies an installed wheel carries (:data:`SHIPPED_GPT2_DIR`; the same pinned bytes); the data directory's
    :class:`DataError` (naming the fetch) when neither has them."""
    try:
        return data_path(GPT2_VOCAB, data_dir), data_path(GPT2_MERGES, data_dir)
    except DataError:
        shipped = [(SHIPPED_GPT2_DIR / Path(f.relpath).name, f) for f in (GPT2_VOCAB, GPT2_MERGES)]
        if not all(path.is_file() for path, _ in shipped):
            raise
    vocab, merges = (verify_sha256(path, pinned.sha256, pinned.description) for path, pinned in shipped)
    return vocab, merges


def checksum_of(paths: list[Path]) -> str:
    """One sha256 over several verified files (their digests in order): the data id recorded in result rows."""
    digest = hashlib.sha256()
    for path in paths:
        stat = path.stat()
        digest.update((_VERIFIED.get((str(path), stat.st_size, stat.st_mtime_ns)) or sha256_file(path)).encode())
    return digest.hexdigest()
