"""Bad input at the data boundary: missing directory, missing file, checksum mismatch, environment variable."""

from __future__ import annotations

import shutil

import pytest

from repro.text import data_files
from repro.text.data_files import DataError, data_path, race_split_files, resolve_data_dir
from evals.loaders import load_lambada


def test_missing_data_dir_names_the_fetch_that_fills_it(tmp_path):
    """One short line (a failing experiment point prints it): the directory, where it came from, the command that
    downloads the files into it; `repro data fetch --help` and the folders' SOURCE.md list the files."""
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError) as err:
        resolve_data_dir(missing)
    message = str(err.value)
    assert str(missing) in message and "\n" not in message and len(message) - 2 * len(str(missing)) < 200, message
    for expected in ("(from --data-dir)", f"repro data fetch --data-dir {missing}", "REPRO_DATA"):
        assert expected in message


def test_env_var_selects_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(data_files.ENV_VAR, str(tmp_path))
    assert resolve_data_dir() == tmp_path.resolve()
    monkeypatch.setenv(data_files.ENV_VAR, str(tmp_path / "absent"))
    with pytest.raises(DataError, match=r"\$REPRO_DATA"):
        resolve_data_dir()


def test_missing_file_in_existing_dir(tmp_path):
    with pytest.raises(DataError, match="lambada_test.jsonl.*missing"):
        data_path(data_files.LAMBADA_TEST, tmp_path)


def test_checksum_mismatch_is_refused(tmp_path, data_dir):
    (tmp_path / "lambada").mkdir()
    copy = tmp_path / "lambada" / "lambada_test.jsonl"
    shutil.copy(data_dir / "lambada" / "lambada_test.jsonl", copy)
    assert len(load_lambada(tmp_path).records) == 5153  # the pinned bytes load
    with open(copy, "ab") as handle:
        handle.write(b'{"text": "one more passage"}\n')
    with pytest.raises(DataError, match="checksum mismatch.*lambada_test.jsonl"):
        load_lambada(tmp_path)


def test_race_file_checked_against_manifest(tmp_path, data_dir):
    shutil.copytree(data_dir / "race" / "RACE" / "dev" / "middle", tmp_path / "race" / "RACE" / "dev" / "middle")
    shutil.copy(data_dir / "race" / "SHA256SUMS", tmp_path / "race" / "SHA256SUMS")
    assert len(race_split_files("dev", "middle", tmp_path)) == 368
    victim = sorted((tmp_path / "race" / "RACE" / "dev" / "middle").glob("*.txt"))[0]
    victim.write_text(victim.read_text().replace("a", "b", 1))
    with pytest.raises(DataError, match="checksum mismatch"):
        race_split_files("dev", "middle", tmp_path)
    with pytest.raises(ValueError, match="split 'train'"):
        race_split_files("train", "middle", tmp_path)
