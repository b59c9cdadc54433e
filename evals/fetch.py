"""``repro data fetch``: every file the suite reads, downloaded from its public source and checked before use.

    repro data fetch                                  # everything, into the default data directory (--help)
    repro data fetch --only tokenizers --only lambada --data-dir ~/repro-data
    repro data fetch --mirror http://mirror.internal/repro-data   # the same files, served from your own mirror

A mirror is either a data directory as this command writes it (``MIRROR/tokenizers/gpt2-vocab.json``,
``MIRROR/race/SHA256SUMS`` and every ``MIRROR/race/RACE/...`` file it lists; a site fetches once and serves that
folder), or the sources' own file names (``MIRROR/encoder.json``, ``MIRROR/RACE.tar.gz``, ...); each data set is looked
for in the first layout, then the second. Sources and pinned sha256 are in :mod:`evals.data_sources` and
:mod:`repro.text.data_files`; RACE's per-passage files are checked against the pinned ``race/SHA256SUMS``. A download
goes to ``DIR/.fetch/<file>.part`` first and continues from there when run again (HTTP ``Range``, where the server
offers it); a file enters the data directory only after its sha256 matched (written to a temporary name, fsynced,
renamed), so an interrupted or corrupted download never leaves a file that passes as complete. Files already present
with the right sha256 are kept. Without network, one line says what to download from where by hand.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from repro.atomic_files import atomic_write
from repro.cliargs import OneLineParser
from repro.input_files import check_regular_file
from repro.text.data_files import DEFAULT_DATA_DIR_TEXT, DataFile, default_data_dir, sha256_file
from evals.data_sources import NAMES, SOURCES, Source

MIRROR_ENV = "REPRO_DATA_MIRROR"
CHUNK = 1 << 20


class FetchError(ValueError):
    """A download that could not be made or checked: one line, naming the file and what to do."""


class NotOnMirror(FetchError):
    """The server answered that it has no such file (HTTP 404 or 410; a file:// path that does not exist)."""


def _not_found(err: BaseException) -> bool:
    if isinstance(err, urllib.error.HTTPError):
        return err.code in (404, 410)
    reason = getattr(err, "reason", err)
    return isinstance(reason, FileNotFoundError) or isinstance(err, FileNotFoundError)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(url: str, part: Path, *, say: Callable[[str], None], timeout_s: float = 60) -> Path:
    """``url`` into ``part``, continuing a partial ``part`` where the server honours ``Range``; a body shorter
    than its Content-Length is an error that keeps what arrived, so the next run resumes."""
    have = part.stat().st_size if part.exists() else 0
    if url.lower().startswith("file:"):  # a local mirror's file: a FIFO would block the download, a device never end
        local = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        check_regular_file(local, what=f"{url}: the mirror's file", error=FetchError, missing_ok=True)
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310 - http(s) URLs of SOURCES
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # nothing left to send: the part is whole
            return part
        raise (NotOnMirror if _not_found(err) else FetchError)(f"{url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        if _not_found(err):
            raise NotOnMirror(f"{url}: no such file") from None
        reason = getattr(err, "reason", err)
        raise FetchError(f"cannot reach {url} ({reason})") from None
    with response:
        resumed = response.status == 206
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        received = 0
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "ab" if resumed else "wb") as handle:
            try:
                while chunk := response.read(CHUNK):
                    handle.write(chunk)
                    received += len(chunk)
            except (OSError, http.client.HTTPException) as err:
                raise FetchError(f"{url}: the download stopped after {have * resumed + received:,} bytes "
                                 f"({type(err).__name__}); run the same command again to resume") from None
        if expected is not None and received < expected:
            raise FetchError(f"{url}: the download stopped after {have * resumed + received:,} of "
                             f"{have * resumed + expected:,} bytes; run the same command again to resume")
    say(f"  downloaded {url} ({part.stat().st_size:,} bytes{', resumed' if resumed else ''})")
    return part


def install(data: bytes, target: DataFile, root: Path, origin: str) -> None:
    """Check ``data`` against the target's pinned sha256, then write it atomically into ``root``."""
    actual = _sha(data)
    if actual != target.sha256:
        raise FetchError(f"{target.relpath} from {origin} has sha256 {actual}, expected {target.sha256} (not the "
                         "pinned bytes: a corrupted download or another version); nothing was installed")
    path = root / target.relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, [data])


def _present(target: DataFile, root: Path) -> bool:
    path = root / target.relpath
    return path.is_file() and sha256_file(path) == target.sha256


def _race_whole(root: Path) -> bool:
    """Whether every RACE test/dev file the data directory's manifest lists is there (by name; readers check)."""
    manifest = root / "race" / "SHA256SUMS"
    lines = manifest.read_text().splitlines() if manifest.is_file() else []
    return all((root / "race" / line.split(maxsplit=1)[1]).is_file() for line in lines if line.strip())


def _race(archive: Path, source: Source, root: Path, origin: str) -> None:
    """RACE's test and dev files, their manifest and the two train files, rebuilt and checked (module docstring
    of :mod:`evals.data_sources`). Only regular files under ``RACE/`` are read from the archive."""
    texts: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for info in tar:
                name = info.name.lstrip("./")
                if not info.isfile() or not name.startswith("RACE/") or ".." in Path(name).parts:
                    continue
                handle = tar.extractfile(info)
                if handle is not None:
                    texts[name] = handle.read()
    except (tarfile.TarError, EOFError, OSError) as err:
        raise FetchError(f"{origin} is not a readable tar archive ({_first_line(err)})") from None
    train = [n for n in texts if n.startswith(("RACE/train/high/", "RACE/train/middle/"))]
    unnumbered = next((n for n in train if not Path(n).stem.isdigit() or Path(n).suffix != ".txt"), None)
    if unnumbered is not None:  # before anything is installed
        raise FetchError(f"{origin}: member {unnumbered!r} is not a numbered RACE train file "
                         f"({str(Path(unnumbered).parent)}/N.txt)")
    evaluation = sorted(n for n in texts if n.split("/")[1] in ("test", "dev"))
    manifest = "".join(f"{_sha(texts[n])}  {n}\n" for n in evaluation).encode()
    targets = {m.member: m.target for m in source.members}
    install(manifest, targets["RACE/"], root, origin)  # the manifest pins every test/dev file at once
    for name in evaluation:
        path = root / "race" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, [texts[name]])
    for prefix in ("RACE/train/high/", "RACE/train/middle/"):
        names = [n for n in texts if n.startswith(prefix)]
        lines = []
        for name in sorted(names, key=lambda n: int(Path(n).stem)):
            record = _race_record(texts[name], name, origin)
            record["source"] = name.removeprefix("RACE/")
            lines.append(json.dumps(record) + "\n")
        target = targets[prefix]
        buffer = io.BytesIO()
        with gzip.GzipFile(filename=Path(target.relpath).name.removesuffix(".gz"), mode="wb", compresslevel=9,
                           mtime=0, fileobj=buffer) as packed:
            packed.write("".join(lines).encode())
        install(buffer.getvalue(), target, root, origin)


def _first_line(err: BaseException) -> str:
    """An exception's message on one line (tarfile's lists each method it tried on a line of its own)."""
    lines = [line.strip(" -") for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0].rstrip(':')}" if lines else type(err).__name__


def _race_record(data: bytes, name: str, origin: str) -> dict:
    """One RACE train file's JSON object; a FetchError naming the member otherwise."""
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError alike
        raise FetchError(f"{origin}: member {name!r} is not a JSON object in UTF-8 ({_first_line(err)})") from None
    if not isinstance(record, dict):
        raise FetchError(f"{origin}: member {name!r} holds a JSON {type(record).__name__}, not an object")
    return record


def mirror_url(text: str | None) -> str | None:
    """A ``--mirror`` as a URL: an http(s), ftp or file URL as given, an existing local folder as its file:// URL;
    ValueError naming the value otherwise."""
    if text is None:
        return None
    scheme = text.split(":", 1)[0].lower() if "://" in text else ""
    if scheme in ("http", "https", "ftp", "file"):
        return text
    if text.strip() and Path(text).is_dir():
        return Path(text).resolve().as_uri()
    raise ValueError(f"{text!r} is neither a URL (http://, https://, ftp://, file://) nor an existing folder")


def _part_of(relpath: str, root: Path) -> Path:
    return root / ".fetch" / f"{relpath.replace('/', '--')}.part"


def _from_data_directory(source: Source, root: Path, mirror: str, say: Callable[[str], None]) -> None:
    """``source``'s files from a mirror laid out as a data directory: each at its own path under ``mirror``,
    checked against its pinned sha256; for RACE, also every test/dev file the pinned manifest lists, checked
    against it. :class:`NotOnMirror` when the first file asked for is not there (the mirror has the other layout)."""
    asked = 0
    for member in source.members:
        if _present(member.target, root):
            continue
        url = f"{mirror}/{member.target.relpath}"
        part = _part_of(member.target.relpath, root)
        try:
            download(url, part, say=say)
        except NotOnMirror:
            if asked == 0:
                raise
            raise FetchError(f"{url}: no such file, though the mirror has other files of {source.name} in a data "
                             "directory's layout (an incomplete mirror)") from None
        asked += 1
        try:
            install(part.read_bytes(), member.target, root, url)
        finally:  # a whole download that failed its check is not a part to resume
            part.unlink(missing_ok=True)
    if source.name != "race":
        return
    manifest = next(m.target for m in source.members if m.member == "RACE/")
    lines = (root / manifest.relpath).read_text().splitlines()
    fetched = 0
    for digest, rel in (line.split(maxsplit=1) for line in lines if line.strip()):
        path = root / "race" / rel
        if path.is_file() and sha256_file(path) == digest:
            continue
        url = f"{mirror}/race/{rel}"
        part = _part_of(f"race/{rel}", root)
        download(url, part, say=lambda message: None)  # ~2,800 small files: one line for all of them below
        data = part.read_bytes()
        part.unlink(missing_ok=True)
        if _sha(data) != digest:
            raise FetchError(f"race/{rel} from {url} has sha256 {_sha(data)}, expected {digest} (the pinned "
                             "race/SHA256SUMS); nothing more was installed")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, [data])
        fetched += 1
    say(f"  {fetched} RACE test/dev file(s) from {mirror}/race/RACE/, each checked against race/SHA256SUMS")


def fetch_source(source: Source, root: Path, *, mirror: str | None, say: Callable[[str], None]) -> str:
    """Make ``source``'s files present and verified under ``root``; returns what was done. From a mirror, its
    data-directory layout is tried first, then the sources' file names."""
    if all(_present(m.target, root) for m in source.members) and (source.name != "race" or _race_whole(root)):
        return "already there"
    if mirror:
        try:
            _from_data_directory(source, root, mirror.rstrip("/"), say)
            return "installed"
        except NotOnMirror as err:
            layout = str(err)
        url = f"{mirror.rstrip('/')}/{source.filename}"
        try:
            part = download(url, root / ".fetch" / f"{source.filename}.part", say=say)
        except NotOnMirror:
            raise FetchError(f"the mirror has neither a data directory's file ({layout}) nor the source's file "
                             f"name ({url}: no such file)") from None
    else:
        url = source.url
        part = download(url, root / ".fetch" / f"{source.filename}.part", say=say)
    if source.name == "race":
        _race(part, source, root, url)
    elif source.is_archive:
        try:
            with zipfile.ZipFile(part) as archive:
                for member in source.members:
                    try:
                        data = archive.read(member.member)
                    except KeyError:
                        raise FetchError(f"{url} has no member {member.member}") from None
                    install(data, member.target, root, url)
        except (zipfile.BadZipFile, EOFError, OSError) as err:
            raise FetchError(f"{url} is not a readable zip archive ({_first_line(err)})") from None
    else:
        install(part.read_bytes(), source.members[0].target, root, url)
    part.unlink(missing_ok=True)
    return "installed"


def fetch(names: Sequence[str] | None, root: Path, *, mirror: str | None = None,
          say: Callable[[str], None] = print) -> None:
    for source in SOURCES:
        if names and source.name not in names:
            continue
        files = ", ".join(m.target.relpath if m.member != "RACE/" else "race/RACE/{test,dev}, race/SHA256SUMS"
                          for m in source.members)
        say(f"{source.name}: {files}")
        try:
            done = fetch_source(source, root, mirror=mirror, say=say)
        except (FetchError, zipfile.BadZipFile, tarfile.TarError, json.JSONDecodeError, EOFError,
                gzip.BadGzipFile) as err:
            if not (isinstance(err, FetchError) and "resume" in str(err)):  # keep only a part that can resume
                (root / ".fetch" / f"{source.filename}.part").unlink(missing_ok=True)
            hand = (f"; by hand: download {source.url} (license: {source.license}) and put "
                    f"{files} under {root}" if "cannot reach" in str(err) else "")
            raise FetchError(f"{source.name}: {' '.join(str(err).split())}{hand}") from None
        say(f"  {done}")
    if not any((root / ".fetch").glob("*.part")):
        shutil.rmtree(root / ".fetch", ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="repro data fetch", description=__doc__.split("\n")[0].split(": ", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="\n".join(__doc__.split("\n")[2:6]))
    parser.add_argument("--only", action="append", choices=NAMES, metavar="NAME",
                        help=f"only these sources (repeatable: {', '.join(NAMES)}; default: all)")
    parser.add_argument("--data-dir", default=None, help=f"where to put them (default: {DEFAULT_DATA_DIR_TEXT}); "
                        "created when missing")
    parser.add_argument("--mirror", default=None, metavar="URL",
                        help="fetch every file from URL instead of its source: a data directory as this command "
                             "writes it (URL/tokenizers/gpt2-vocab.json, URL/race/SHA256SUMS, ...), else the sources' "
                             "file names (URL/encoder.json, URL/RACE.tar.gz, ...); URL is http(s)://, ftp:// or "
                             f"file://, or a local folder (default: ${MIRROR_ENV}, else the sources)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from repro.paths import writable_dir_problem

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(build_parser().format_help(), end="")
        return 0
    if argv[:1] != ["fetch"]:
        print(f"repro data: error: {' '.join(argv[:1]) or 'no command'}: the one command is 'fetch' (repro data "
              "fetch --help)", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv[1:])
    origin = "--mirror" if args.mirror is not None else f"${MIRROR_ENV}"
    try:
        mirror = mirror_url(args.mirror if args.mirror is not None else os.environ.get(MIRROR_ENV) or None)
    except ValueError as err:
        print(f"repro data fetch: error: {origin} {err}", file=sys.stderr)
        return 2
    root = Path(args.data_dir) if args.data_dir is not None else default_data_dir()[0]
    problem = writable_dir_problem(root)
    if problem is not None:
        print(f"repro data fetch: error: {root} {problem}", file=sys.stderr)
        return 2
    try:
        fetch(args.only, root, mirror=mirror)
    except FetchError as err:
        print(f"repro data fetch: error: {err}", file=sys.stderr)
        return 2
    print(f"data directory {root}: every file checked against its pinned sha256")
    return 0
