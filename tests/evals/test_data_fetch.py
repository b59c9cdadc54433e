"""``repro data fetch`` against a local mirror standing in for the internet (issue 34): every file lands in the
layout the suite reads and passes its pinned sha256; a corrupted file is refused and never installed; a truncated
download keeps its part and resumes (HTTP Range); without network one line says what to fetch from where by hand.

The mirror is built from the verified data directory: the tokenizer and LAMBADA files as their sources publish
them, WikiText-103 as the v1 zip, RACE as its tar.gz (test and dev as they are, train rebuilt one file per passage
from train-*.jsonl.gz), so ``fetch`` must also rebuild race/SHA256SUMS and the train files byte for byte."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from repro.text.data_files import ALL_FILES, data_path, race_split_files
from repro.dist.spawn import free_port

pytestmark = pytest.mark.datasets_free  # fetching reads no data through datasets (tests/evals/conftest.py)

FAULTS: dict[str, str] = {}  # file name -> "corrupt" | "truncate-once"


class MirrorHandler(SimpleHTTPRequestHandler):
    """Static files with ``Range`` (206) and the faults of :data:`FAULTS`."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = Path(self.directory) / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        fault = FAULTS.get(path.name)
        if fault == "corrupt":
            data = data[:-10] + b"x" * 10
        start = 0
        if self.headers.get("Range", "").startswith("bytes="):
            start = int(self.headers["Range"][6:].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if fault == "truncate-once":
            FAULTS.pop(path.name)
            body = body[: len(body) // 2]
        self.wfile.write(body)


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def mirror(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    for name, rel in (("encoder.json", "tokenizers/gpt2-vocab.json"), ("vocab.bpe", "tokenizers/gpt2-merges.txt"),
                      ("vocab.txt", "tokenizers/bert-large-uncased-vocab.txt"),
                      ("lambada_test.jsonl", "lambada/lambada_test.jsonl")):
        shutil.copyfile(data_dir / rel, root / name)
    with zipfile.ZipFile(root / "wikitext-103-v1.zip", "w") as archive:
        for split in ("test", "valid"):
            archive.write(data_dir / "wikitext103" / f"wiki.{split}.tokens", f"wikitext-103/wiki.{split}.tokens")
    with tarfile.open(root / "RACE.tar.gz", "w:gz", compresslevel=1) as tar:  # fast: its bytes are not pinned
        for path in sorted((data_dir / "race" / "RACE").rglob("*.txt")):
            _tar_add(tar, str(path.relative_to(data_dir / "race")), path.read_bytes())
        for level in ("high", "middle"):
            for line in gzip.decompress((data_dir / "race" / f"train-{level}.jsonl.gz").read_bytes()).splitlines():
                record = json.loads(line)
                source = record.pop("source")
                _tar_add(tar, f"RACE/{source}", json.dumps(record).encode())
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), partial(MirrorHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()


def _fetch(target: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro", "data", "fetch", "--data-dir", str(target), *args],
                          capture_output=True, text=True, timeout=600)


def test_fetch_builds_a_data_directory_the_suite_verifies(mirror, tmp_path):
    target = tmp_path / "data"
    done = _fetch(target, "--mirror", mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    for data_file in ALL_FILES:
        data_path(data_file, target)  # DataError unless the pinned bytes
    for split in ("test", "dev"):
        for level in ("middle", "high"):
            assert race_split_files(split, level, target)
    assert not (target / ".fetch").exists()
    again = _fetch(target, "--mirror", mirror)
    assert again.returncode == 0 and again.stdout.count("already there") == 6 and "downloaded" not in again.stdout


def test_a_corrupted_file_is_refused_and_not_installed(mirror, tmp_path):
    FAULTS["lambada_test.jsonl"] = "corrupt"
    try:
        done = _fetch(tmp_path, "--only", "lambada", "--mirror", mirror)
    finally:
        FAULTS.clear()
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "lambada/lambada_test.jsonl" in done.stderr and "expected 4aa8d02c" in done.stderr
    assert not (tmp_path / "lambada" / "lambada_test.jsonl").exists()
    assert not list(tmp_path.glob(".fetch/*.part"))


def test_a_truncated_download_resumes(mirror, tmp_path):
    FAULTS["lambada_test.jsonl"] = "truncate-once"
    done = _fetch(tmp_path, "--only", "lambada", "--mirror", mirror)
    assert done.returncode == 2 and "run the same command again to resume" in done.stderr, done.stderr
    assert not (tmp_path / "lambada" / "lambada_test.jsonl").exists()
    assert (tmp_path / ".fetch" / "lambada_test.jsonl.part").stat().st_size > 0
    again = _fetch(tmp_path, "--only", "lambada", "--mirror", mirror)
    assert again.returncode == 0 and "resumed" in again.stdout, again.stdout + again.stderr


def test_offline_says_what_to_download_by_hand(tmp_path):
    done = _fetch(tmp_path, "--only", "lambada", "--mirror", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot reach" in done.stderr
    assert "by hand: download https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl" in done.stderr
    assert f"lambada/lambada_test.jsonl under {tmp_path}" in done.stderr


def test_the_missing_data_error_names_the_fetch_command(tmp_path):
    import os

    done = subprocess.run([sys.executable, "-m", "evals", "count"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "REPRO_DATA": str(tmp_path)})
    # $REPRO_DATA names the directory, and `repro data fetch` fills the same one: no --data-dir to add
    assert done.returncode == 2 and "download it with: repro data fetch --only tokenizers" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_file_mirror_laid_out_as_a_data_directory(data_dir, tmp_path):
    """What `repro data fetch` writes is itself a mirror (a site fetches once and serves it): every data set, RACE's
    2,796 test/dev files too, comes from file://DATA_DIR and passes its pinned sha256 (or the pinned manifest)."""
    target = tmp_path / "data"
    done = _fetch(target, "--mirror", data_dir.as_uri())
    assert done.returncode == 0, done.stdout + done.stderr
    for data_file in ALL_FILES:
        data_path(data_file, target)
    assert sum(len(race_split_files(s, level, target)) for s in ("test", "dev") for level in ("middle", "high")) \
        == len((data_dir / "race" / "SHA256SUMS").read_text().splitlines())
    assert f"downloaded {data_dir.as_uri()}/tokenizers/gpt2-vocab.json" in done.stdout
    assert not (target / ".fetch").exists()


def test_a_data_directory_mirror_is_checked_file_by_file(data_dir, tmp_path):
    """A data-directory mirror with a changed RACE test file: refused against the pinned manifest, in one line; a
    mirror with neither layout names both places it looked."""
    mirror = tmp_path / "mirror"
    shutil.copytree(data_dir / "race", mirror / "race")
    first = (mirror / "race" / "SHA256SUMS").read_text().split()[1]
    (mirror / "race" / first).chmod(0o644)
    (mirror / "race" / first).write_text("not the pinned passage")
    done = _fetch(tmp_path / "data", "--only", "race", "--mirror", str(mirror))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"race/{first} from" in done.stderr and "the pinned race/SHA256SUMS" in done.stderr
    assert not (tmp_path / "data" / "race" / first).exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _fetch(tmp_path / "data", "--only", "lambada", "--mirror", str(empty))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "neither a data directory's file" in done.stderr and "lambada/lambada_test.jsonl" in done.stderr
    assert "lambada_test.jsonl: no such file" in done.stderr
