"""The tokenized training corpus (repro.training.corpus) and its samples (repro.training.corpus_samples)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.text.data_files import DataError, resolve_data_dir
from repro.testing import needs
from repro.training.corpus import CorpusError, TokenCorpus, main, tokenize_corpus, wikitext103_file
from repro.training.corpus_samples import CorpusSamples, epoch_permutation

REPO_ROOT = Path(__file__).resolve().parents[2]
TEXT = "Hello world, this is a corpus.\n\nSecond paragraph: caf\u00e9 \u2014 100% UTF-8!\nlast line"


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    try:
        return resolve_data_dir() / "tokenizers"
    except DataError as err:  # the pinned data files are not part of the repository
        pytest.skip(f"data directory not available: {err}")


@pytest.fixture(scope="module")
def gpt2(vocab_dir):
    from repro.text.tokenization import gpt2_tokenizer

    return gpt2_tokenizer(vocab_dir.parent)


def _documents(corpus: TokenCorpus) -> list[list[int]]:
    offsets = json.loads(corpus.index_path.read_text())["document_offsets"]
    return [corpus.tokens[a:b].tolist() for a, b in zip(offsets, offsets[1:])]


def test_tiny_files_round_trip(tmp_path, vocab_dir, gpt2):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(TEXT, encoding="utf-8")
    second.write_text("another file\n", encoding="utf-8")
    prefix = tokenize_corpus([first, second], tmp_path / "out" / "tiny", vocab_dir=vocab_dir, progress=False)
    corpus = TokenCorpus(prefix)
    docs = _documents(corpus)
    assert corpus.vocab_size == 50257 and corpus.eod_id == 50256 and corpus.num_documents == 2
    assert all(doc[-1] == 50256 and 50256 not in doc[:-1] for doc in docs)  # one EOD closes every document
    assert [gpt2.decode(doc[:-1]) for doc in docs] == [TEXT, "another file\n"]
    assert docs[0][:-1] == gpt2.encode(TEXT)
    index = json.loads(corpus.index_path.read_text())
    assert index["num_tokens"] == corpus.num_tokens == sum(map(len, docs))
    assert index["bin_sha256"] == hashlib.sha256(corpus.bin_path.read_bytes()).hexdigest()
    assert [s["sha256"] for s in index["sources"]] == [hashlib.sha256(p.read_bytes()).hexdigest()
                                                       for p in (first, second)]
    assert set(index["tokenizer"]["files"]) == {"gpt2-vocab.json", "gpt2-merges.txt"}
    assert not [p.name for p in corpus.prefix.parent.iterdir() if p.suffix == ".tmp"]  # renamed into place
    again = tokenize_corpus([first, second], tmp_path / "again", vocab_dir=vocab_dir, progress=False)
    assert Path(f"{again}.bin").read_bytes() == corpus.bin_path.read_bytes()  # deterministic


def test_line_documents_skip_blank_lines(tmp_path, vocab_dir, gpt2):
    path = tmp_path / "lines.txt"
    path.write_text(TEXT, encoding="utf-8")
    corpus = TokenCorpus(tokenize_corpus([path], tmp_path / "lines", vocab_dir=vocab_dir, documents="line",
                                         progress=False))
    lines = [line for line in TEXT.splitlines(keepends=True) if line.strip()]
    assert [gpt2.decode(doc[:-1]) for doc in _documents(corpus)] == lines


@needs("datasets", "tokenizers")  # through the CLI, which answers one line without them
def test_wikitext103_valid_articles(tmp_path, vocab_dir, gpt2):
    from repro.text.detokenize import wikitext_detokenize
    from repro.text.wikitext_articles import split_articles

    path = wikitext103_file("valid")
    assert main(["--wikitext103", "valid", "--output-prefix", str(tmp_path / "wt"), "--no-progress"]) == 0
    corpus = TokenCorpus(tmp_path / "wt")
    assert (corpus.index["documents"], corpus.index["detokenize"]) == ("wikitext", "wikitext")
    articles = [wikitext_detokenize(a) for a in split_articles(path.read_text(encoding="utf-8"))]
    docs = _documents(corpus)
    assert corpus.num_documents == len(articles) == 60
    assert corpus.num_tokens == 236_990  # 236,930 BPE tokens + 60 end-of-document tokens
    assert [gpt2.decode(doc[:-1]) for doc in docs] == articles
    # each article is detokenized on its own, as the evaluation does: it opens with its title line
    assert gpt2.decode(docs[0][:8]).startswith("\n= Homarus gammarus =")  # the file opens with a blank line
    assert all(gpt2.decode(doc[:2]).startswith(" = ") for doc in docs[1:])


def test_bad_files_name_the_file(tmp_path, vocab_dir):
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")
    prefix = tokenize_corpus([path], tmp_path / "c", vocab_dir=vocab_dir, progress=False)
    bin_path = Path(f"{prefix}.bin")
    data = bin_path.read_bytes()
    bin_path.write_bytes(data[:-2])
    with pytest.raises(CorpusError, match=r"c\.bin.* bytes but its index records .*truncated"):
        TokenCorpus(prefix)
    bin_path.write_bytes(data[:-2] + b"\x00\x00")  # right size, wrong bytes
    with pytest.raises(CorpusError, match=r"checksum mismatch for .*c\.bin"):
        TokenCorpus(prefix)
    assert TokenCorpus(prefix, verify=False).num_tokens == len(data) // 2
    with pytest.raises(CorpusError, match=r"missing\.idx\.json.* does not exist"):
        TokenCorpus(tmp_path / "missing")
    with pytest.raises(DataError, match="checksum mismatch"):
        tokenize_corpus([path], tmp_path / "d", vocab_dir=vocab_dir, sha256=["0" * 64], progress=False)
    with pytest.raises(CorpusError, match="not readable as UTF-8"):
        (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
        tokenize_corpus([tmp_path / "bin.txt"], tmp_path / "e", vocab_dir=vocab_dir, progress=False)


def _samples(seed: int = 3, num_tokens: int = 103, seq_len: int = 10) -> CorpusSamples:
    return CorpusSamples(np.arange(num_tokens, dtype=np.uint16), seq_len=seq_len, seed=seed)


def test_samples_are_contiguous_windows_and_depend_only_on_index():
    samples = _samples()
    assert len(samples) == 10  # (103 - 1) // 10
    for index in range(25):
        tokens = samples.sample(index)
        assert tokens.dtype == torch.long and tokens.shape == (11,)
        start = int(tokens[0])
        assert start % 10 == 0 and torch.equal(tokens, torch.arange(start, start + 11))
    used = _samples()
    used.batch(0, 37)  # a run that has already read many samples
    fresh = _samples()
    for index in (0, 5, 9, 10, 19, 31, 1000):
        assert torch.equal(used.sample(index), fresh.sample(index))
    assert torch.equal(fresh.batch(7, 9), torch.stack([fresh.sample(i) for i in range(7, 16)]))
    assert fresh.batch(4, 0).shape == (0, 11)
    with pytest.raises(IndexError, match="negative"):
        fresh.sample(-1)


def test_every_epoch_is_a_seeded_permutation():
    samples = _samples()
    epochs = [[int(samples.sample(e * 10 + i)[0]) // 10 for i in range(10)] for e in range(3)]
    assert all(sorted(order) == list(range(10)) for order in epochs)  # each window once per epoch
    assert epochs[0] != list(range(10))  # epoch 0 is shuffled too
    assert len({tuple(order) for order in epochs}) == 3
    assert [int(_samples(seed=4).sample(i)[0]) // 10 for i in range(10)] != epochs[0]
    # the order is arithmetic (SplitMix64 keys), the same on every numpy/torch version
    assert epoch_permutation(10, seed=0, epoch=0).tolist() == [0, 9, 1, 6, 3, 5, 4, 2, 8, 7]
    with pytest.raises(ValueError, match="seq_len \\+ 1 = 11"):
        CorpusSamples(np.arange(10, dtype=np.uint16), seq_len=10)


def test_corpus_samples_view(tmp_path, vocab_dir):
    path = tmp_path / "a.txt"
    path.write_text(TEXT * 20, encoding="utf-8")
    corpus = TokenCorpus(tokenize_corpus([path], tmp_path / "s", vocab_dir=vocab_dir, progress=False))
    samples = corpus.samples(16, seed=1)
    assert len(samples) == (corpus.num_tokens - 1) // 16 and samples.vocab_size == 50257
    window = int(samples.windows(np.array([0]))[0])
    assert samples.sample(0).tolist() == corpus.tokens[window * 16: window * 16 + 17].tolist()


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "repro.training.corpus", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@needs("datasets", "tokenizers")
def test_cli_subprocess_offline(tmp_path, vocab_dir):
    missing = tmp_path / "nope.txt"
    done = _run_cli("--input", str(missing), "--output-prefix", str(tmp_path / "x"), "--vocab-dir", str(vocab_dir))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("repro corpus: error: ")
    assert str(missing) in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    done = _run_cli("--input", str(tmp_path / "a.txt"), "--output-prefix", str(tmp_path / "ok"), "--no-progress",
                    "--vocab-dir", str(vocab_dir))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert TokenCorpus(tmp_path / "ok").num_documents == 1


@needs("datasets", "tokenizers")
def test_cli_in_process(tmp_path, vocab_dir, capsys):
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")
    base = ["--input", str(path), "--vocab-dir", str(vocab_dir), "--no-progress"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = {  # bad value -> the text the one error line must contain
        "cannot be created": base + ["--output-prefix", str(blocker / "out")],
        "checksum mismatch": base + ["--sha256", "0" * 64, "--output-prefix", str(tmp_path / "o")],
        "2 sha256 values for 1 input": base + ["--sha256", "0" * 64, "--sha256", "1" * 64,
                                               "--output-prefix", str(tmp_path / "o")],
        "gpt2-vocab.json": ["--input", str(path), "--vocab-dir", str(tmp_path), "--output-prefix", str(tmp_path / "o")],
        "--output-prefix": ["--input", str(path)],
        "invalid choice: 'train'": ["--wikitext103", "train", "--output-prefix", str(tmp_path / "o")],
    }
    for needle, argv in cases.items():
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("repro corpus: error: "), (argv, err)
        assert needle in err, (needle, err)
    assert main(base + ["--output-prefix", str(tmp_path / "ok" / "p")]) == 0
    assert "tokens, 1 documents" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    for option in ("--input", "--wikitext103", "--output-prefix", "--data-dir", "--vocab-dir", "--documents",
                   "--detokenize", "--sha256", "--no-progress", "--wikitext103 valid --output-prefix"):
        assert option in help_text
