"""One rule decides the data directory for every reader and for ``repro data fetch``
(:func:`repro.text.data_files.default_data_dir`): ``$REPRO_DATA``; else ``../shared/data`` beside a checkout; else,
for an installed wheel, the per-user data directory (``$XDG_DATA_HOME/repro``, ``~/.local/share/repro``), never a
folder inside the installation. (The wheel itself is tested in tests/foundation/test_packaging.py.)"""

from __future__ import annotations

import sys

import pytest

from repro import checkout
from repro.text import data_files as D


@pytest.fixture
def installed(monkeypatch):
    """As if repro ran from a wheel: not a checkout."""
    monkeypatch.setattr(D, "in_checkout", lambda: False)
    monkeypatch.delenv("REPRO_DATA", raising=False)


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG rule is the Linux/Unix one")
@pytest.mark.parametrize("xdg, expected", [
    ("/srv/xdg", "/srv/xdg/repro"),          # an absolute XDG_DATA_HOME is used
    ("relative/xdg", "~/.local/share/repro"),  # a relative one is ignored, as the XDG spec says
    ("", "~/.local/share/repro"),            # unset or empty: the spec's default
])
def test_the_per_user_directory_follows_xdg(installed, monkeypatch, tmp_path, xdg, expected):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", xdg)
    path, origin = D.default_data_dir()
    assert str(path) == expected.replace("~", str(tmp_path)) and origin == "the per-user default"
    assert checkout.REPO_ROOT not in path.parents  # never inside the installation


def test_repro_data_wins_and_a_checkout_reads_shared_data(monkeypatch, tmp_path):
    monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    assert D.default_data_dir() == (tmp_path, "$REPRO_DATA")
    monkeypatch.setenv("REPRO_DATA", "  ")  # blank is unset
    assert checkout.in_checkout()  # these tests run from the checkout
    assert D.default_data_dir()[0] == checkout.REPO_ROOT.parent / "shared" / "data"


def test_a_missing_default_names_the_fetch_that_fills_it(installed, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(sys, "platform", "linux")
    with pytest.raises(D.DataError) as err:
        D.resolve_data_dir()
    message = str(err.value)
    assert "\n" not in message and len(message) < 300, message  # one short line
    assert f"{tmp_path / 'xdg' / 'repro'}' (from the per-user default) does not exist" in message
    assert "download the data into it with: repro data fetch (or pass --data-dir" in message
    (tmp_path / "xdg" / "repro").mkdir(parents=True)
    assert D.missing_datasets(["lambada", "race"]) == ["lambada", "race"]
    with pytest.raises(D.DataError, match=r"is missing; download it with: repro data fetch --only lambada$"):
        D.data_path(D.LAMBADA_TEST)
    with pytest.raises(D.DataError, match=r"download it with: repro data fetch --only lambada --data-dir \S+other$"):
        D.data_path(D.LAMBADA_TEST, tmp_path / "other" if (tmp_path / "other").mkdir() is None else None)


def test_missing_datasets_sees_what_is_there(data_dir):
    assert D.missing_datasets(list(D.DATASETS), data_dir) == []


def test_a_test_run_without_data_ends_with_one_line_saying_how_to_get_it(tmp_path):
    import os
    import subprocess

    from repro.checkout import REPO_ROOT

    missing = tmp_path / "no-data"
    # pyproject's plugin options again (``-o addopts=`` drops them): hypothesis' and anyio's cost ~2 CPU-s to load
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-p",
                           "no:hypothesispytest", "-p", "no:anyio", "tests/evals/test_evals_data_files.py"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "REPRO_DATA": str(missing)})
    assert done.returncode == 0, done.stdout[-2000:]
    lines = [line for line in done.stdout.splitlines() if "for want of the evaluation data" in line]
    assert len(lines) == 1 and lines[0].endswith(f"in {missing}: get it with `repro data fetch` (or point "
                                                 "$REPRO_DATA at a copy), then run them again"), done.stdout[-2000:]
    assert int(lines[0].split()[0]) >= 1
