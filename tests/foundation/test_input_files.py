"""The one rule every reader goes through (repro/input_files.py): a file is a regular file, a small file is small, a
directory's names stay inside it. Each refused kind beside its accepted neighbour, in this process; nothing may
block (a FIFO without a writer would hang an ``open``: the alarm turns a hang into a failure)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from repro.input_files import (
    POINTER_MAX_BYTES, InputFileError, check_regular_file, directory_problem, inside, open_regular, read_capped,
    read_pointer, regular_file_problem,
)


@pytest.fixture(autouse=True)
def no_hang():
    """Fail, instead of hanging, if any check blocks for 20 s."""
    def alarm(signum, frame):
        raise TimeoutError("an input check blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _fifo(root: Path) -> Path:
    os.mkfifo(root / "pipe")
    return root / "pipe"


def _loop(root: Path) -> Path:
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    return root / "a"


def _socket(root: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))  # the socket's file stays when the socket is closed
    return root / "sock"


def _dangling(root: Path) -> Path:
    (root / "gone").symlink_to(root / "nowhere")
    return root / "gone"


def _regular(root: Path) -> Path:
    (root / "file").write_text("12\n")
    return root / "file"


def _link_to_regular(root: Path) -> Path:
    _regular(root)
    (root / "link").symlink_to(root / "file")
    return root / "link"


#: name -> (make the path, words of the refusal, or None: accepted)
KINDS = {
    "fifo": (_fifo, "is a FIFO (named pipe), not a regular file"),
    "symlink_loop": (_loop, "is a symlink loop"),
    "character_device": (lambda root: Path("/dev/zero"), "is a character device, not a regular file"),
    "null_device": (lambda root: Path("/dev/null"), "is a character device, not a regular file"),
    "socket": (_socket, "is a socket, not a regular file"),
    "directory": (lambda root: root, "is a directory, not a regular file"),
    "dangling_symlink": (_dangling, "is a symlink to a missing file"),
    "missing": (lambda root: root / "absent", "does not exist"),
    "regular": (_regular, None),
    "symlink_to_regular": (_link_to_regular, None),
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_only_a_regular_file_is_read(name, tmp_path):
    make, words = KINDS[name]
    path = make(tmp_path)
    if words is None:
        assert regular_file_problem(path) is None and read_pointer(path) == b"12\n"
        with open_regular(path) as handle:
            assert handle.read() == b"12\n"
        return
    assert words in regular_file_problem(path)
    for reader in (read_pointer, open_regular, check_regular_file):
        with pytest.raises(InputFileError) as refused:
            reader(path, what="the pointer")
        line = str(refused.value)
        assert "\n" not in line and line.startswith(f"the pointer {str(path)!r} ") and words in line, line


def test_a_directory_check_names_what_is_there_instead(tmp_path):
    assert directory_problem(tmp_path) is None
    assert directory_problem(tmp_path / "absent", missing_ok=True) is None
    assert "is a FIFO" in directory_problem(_fifo(tmp_path))
    assert "symlink loop" in directory_problem(_loop(tmp_path))
    assert "is a regular file, not a directory" in directory_problem(_regular(tmp_path))


def test_small_files_have_a_cap(tmp_path):
    at_cap, over = tmp_path / "at", tmp_path / "over"
    at_cap.write_bytes(b"7" * POINTER_MAX_BYTES)
    over.write_bytes(b"7" * (POINTER_MAX_BYTES + 1))
    assert read_pointer(at_cap) == b"7" * POINTER_MAX_BYTES
    with pytest.raises(InputFileError, match=f"holds {POINTER_MAX_BYTES + 1:,} bytes; a file of this kind holds at "
                                             f"most {POINTER_MAX_BYTES:,}"):
        read_pointer(over)
    with pytest.raises(ValueError, match="at most 10"):  # any cap, with the caller's error class
        read_capped(over, 10, error=ValueError)


def _tree(root: Path) -> Path:
    """root/dir (the directory given) with a file, a subfolder, a symlink inside and symlinks out."""
    given = root / "dir"
    (given / "sub").mkdir(parents=True)
    (given / "w.pt").write_text("w")
    (given / "sub" / "x.pt").write_text("x")
    (root / "secret").write_text("s")
    (given / "inner").symlink_to(given / "sub" / "x.pt")
    (given / "out").symlink_to(root / "secret")
    (given / "outdir").symlink_to(root, target_is_directory=True)
    (given / "abs").symlink_to("/etc/hostname")
    return given


#: entry name (as a manifest or index map gives it) -> words of the refusal, or None: accepted
ENTRIES = {
    "w.pt": None,
    "sub/x.pt": None,
    "./sub/x.pt": None,
    "inner": None,  # a symlink that stays inside
    "../secret": "whose '..' leaves the directory",
    "sub/../../secret": "whose '..' leaves the directory",
    "/etc/hostname": "an absolute path, which leaves the directory",
    "C:\\weights.pt": "an absolute path",
    "out": "is a symlink (or lies under one) to",
    "outdir/secret": "is a symlink (or lies under one) to",
    "abs": "is a symlink (or lies under one) to",
    "": "not a file name",
    "sub": "is a directory, not a regular file",
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_name_stays_inside_its_directory(entry, tmp_path):
    given, words = _tree(tmp_path), ENTRIES[entry]
    if words is None:
        assert inside(given, entry).read_text() in ("w", "x")
        return
    with pytest.raises(InputFileError) as refused:
        inside(given, entry, what="manifest.json")
    line = str(refused.value)
    assert "\n" not in line and line.startswith("manifest.json: ") and words in line, line


def test_a_bound_above_the_directory_allows_a_hub_snapshot(tmp_path):
    """A Hugging Face hub snapshot's files are symlinks into the model folder's blobs/: inside ``within``."""
    model = tmp_path / "models--org--name"
    (model / "blobs").mkdir(parents=True)
    (model / "blobs" / "abc").write_text("{}")
    snapshot = model / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(Path("..") / ".." / "blobs" / "abc")
    assert inside(snapshot, "config.json", within=model).read_text() == "{}"
    with pytest.raises(InputFileError, match="leaves the directory"):
        inside(snapshot, "config.json")
