"""Issue 27: one-process ``python -m repro.training`` needs no port unless MASTER_PORT names one.

It used to bind 127.0.0.1:29500 whatever MASTER_PORT said, so a second run on the machine died of EADDRINUSE. The runs
that train are processes forked from a warm server (tests/training/forked.py: each its own process, as ports see it,
without a new interpreter's ~5 s of CPU); the first bad value goes through a real interpreter.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from repro.dist import read_launch_env
from repro.dist.spawn import free_port
from tests.training.forked import Forked  # rank processes forked from a warm server: see forked.py
from tests.training.ranks import SMALL

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "TORCHELASTIC_")


def _environ(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}
    return {**clean, "OMP_NUM_THREADS": "1", **env}


def _one_process(steps: int, **env: str) -> subprocess.Popen:
    """``python -m repro.training``, a new interpreter."""
    return subprocess.Popen([sys.executable, "-m", "repro.training", *SMALL, "--steps", str(steps)],
                            env=_environ(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _forked(tmp_path: Path, name: str, steps: int, **env: str) -> Forked:
    """``python -m repro.training``, forked; its standard output and error in ``tmp_path/name.out`` and ``.err``."""
    return Forked(["-m", "repro.training", *SMALL, "--steps", str(steps)], out=tmp_path / f"{name}.out",
                  err=tmp_path / f"{name}.err", env=_environ(**env))


def _ended(proc: Forked, tmp_path: Path, name: str) -> tuple[int, str, str]:
    """The exit code, standard output and error of ``proc`` (started as ``name``), once it has ended."""
    try:
        code = proc.wait(180)
    finally:
        proc.kill()
    return code, (tmp_path / f"{name}.out").read_text(), (tmp_path / f"{name}.err").read_text()


def test_two_one_process_runs_at_once_both_train(tmp_path):
    runs = {name: _forked(tmp_path, name, 6) for name in ("first", "second")}
    for name, run in runs.items():
        code, out, err = _ended(run, tmp_path, name)
        assert code == 0, err[-2000:]
        assert "training done: iteration 6" in out


def test_master_port_is_honoured(tmp_path):
    """A free MASTER_PORT trains; the same port held by another process is one line naming it (exit code 2), which
    shows the run tried that port and no other."""
    port = free_port()
    code, out, err = _ended(_forked(tmp_path, "free", 2, MASTER_PORT=str(port)), tmp_path, "free")
    assert code == 0 and "training done: iteration 2" in out, err[-2000:]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        code, out, err = _ended(_forked(tmp_path, "taken", 2, MASTER_PORT=str(taken), MASTER_ADDR="127.0.0.1"),
                                tmp_path, "taken")
    assert code == 2, err
    assert err.splitlines() == [f"repro train: error: launch variable MASTER_PORT={taken}: the port is in use on "
                                f"127.0.0.1 (another job?); unset MASTER_PORT to run without a port"], err


@pytest.mark.parametrize("value", ["abc", "0", "65536", "-1"])
def test_bad_master_port_is_one_line_and_exit_code_2(value, monkeypatch, capsys):
    """The first value through a real process; the others through the same entry point in this process (the same
    check: the process boundary, exit code and stderr, is the first's and test_master_port_is_honoured's)."""
    if value == "abc":
        run = _one_process(2, MASTER_PORT=value)
        err = run.communicate(timeout=180)[1]
        code = run.returncode
    else:
        from repro.training.cli import main

        for name in [name for name in os.environ if name.startswith(LAUNCH_VARS)]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("MASTER_PORT", value)
        code = main([*SMALL, "--steps", "2"])
        err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [f"repro train: error: launch variable MASTER_PORT={value!r} must be a TCP port "
                                f"number in 1..65535"], err


def test_read_launch_env_single_process():
    assert read_launch_env({}).master_port == 0  # no port: an in-process store
    launch = read_launch_env({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert (launch.world_size, launch.master_addr, launch.master_port, launch.launcher) == (1, "10.0.0.1", 1234,
                                                                                             "single")
    for env in ({"MASTER_PORT": "x"}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "a", "MASTER_PORT": "99999"},
                {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n1",
                 "MASTER_PORT": ""}):
        with pytest.raises(ValueError, match="must be a TCP port number in 1..65535"):
            read_launch_env(env)
