"""Issue 27: one-process ``python -m repro.training`` needs no port unless MASTER_PORT names one.

It used to bind 127.0.0.1:29500 whatever MASTER_PORT said, so a second run on the machine died of EADDRINUSE.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from repro.dist import read_launch_env
from repro.dist.spawn import free_port
from tests.training.ranks import SMALL

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "TORCHELASTIC_")


def _one_process(steps: int, **env: str) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}
    return subprocess.Popen([sys.executable, "-m", "repro.training", *SMALL, "--steps", str(steps)],
                            env={**clean, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_one_process_runs_at_once_both_train():
    runs = [_one_process(6), _one_process(6)]
    outputs = [run.communicate(timeout=180) for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-2000:]
        assert "training done: iteration 6" in out


def test_master_port_is_honoured():
    """A free MASTER_PORT trains; the same port held by another process is one line naming it (exit code 2), which
    shows the run tried that port and no other."""
    port = free_port()
    run = _one_process(2, MASTER_PORT=str(port))
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0 and "training done: iteration 2" in out, err[-2000:]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        run = _one_process(2, MASTER_PORT=str(taken), MASTER_ADDR="127.0.0.1")
        out, err = run.communicate(timeout=180)
    assert run.returncode == 2, err
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
