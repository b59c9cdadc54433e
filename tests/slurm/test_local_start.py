"""slurm/local/start.sh without starting anything (``--dry-run``, bad node counts), and its commands in
slurm/README.md and .ci/run: every ``start.sh`` line the README shows runs here as ``--dry-run``, and CI starts the
emulated multi-node cluster that tests/slurm/test_multinode.py needs. (The real start is CI's own first step.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest

from repro.results import REPO_ROOT
from tests.readme_blocks import SLURM_README, commands

START = REPO_ROOT / "slurm" / "local" / "start.sh"


def _start(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPRO_SLURM_")}
    return subprocess.run(["bash", str(START), *args], capture_output=True, text=True, timeout=30,
                          env={**clean, **env})


def _node_lines(conf: str) -> list[str]:
    return [line for line in conf.splitlines() if line.startswith("NodeName=")]


def test_dry_run_of_one_node_is_this_host():
    proc = _start("--dry-run")
    assert proc.returncode == 0, proc.stderr
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    (line,) = _node_lines(proc.stdout)
    assert line.startswith(f"NodeName={host} NodeHostname={host} NodeAddr=127.0.0.1 Port=6818 CPUs=8 "), line
    assert f"PartitionName=debug Nodes={host} " in proc.stdout and "/etc/hosts" not in proc.stdout


@pytest.mark.parametrize("how", [("--nodes", "2"), ("--nodes=2",), ("env",)], ids=["--nodes 2", "--nodes=2", "env"])
def test_dry_run_of_two_nodes_gives_each_slurmd_its_name_port_and_spool(how):
    proc = _start("--dry-run", **{"REPRO_SLURM_NODES": "2"}) if how == ("env",) else _start(*how, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = _node_lines(proc.stdout)
    names = [re.search(r"NodeName=(\S+)", line).group(1) for line in lines]
    ports = [re.search(r"Port=(\d+)", line).group(1) for line in lines]
    assert len(names) == 2 and names[0].endswith("-n1") and names[1].endswith("-n2"), lines
    assert ports == ["6818", "6819"] and all("NodeAddr=127.0.0.1" in line for line in lines), lines
    # per-node files: slurmd expands %n to the name it was started with (slurmd -N NAME)
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        assert re.search(rf"^{key}=\S*%n", proc.stdout, re.M), key
    assert f"Nodes={names[0][:-1]}[1-2] " in proc.stdout
    assert f"127.0.0.1 {names[0]} {names[1]}" in proc.stdout  # the /etc/hosts line it would add


@pytest.mark.parametrize("args,message", [
    (("--nodes", "0"), "must be from 1 to 16, not 0"),
    (("--nodes", "17"), "must be from 1 to 16, not 17"),
    (("--nodes", "two"), "must be a whole number from 1 to 16, not 'two'"),
    (("--nodes",), "--nodes needs a number"),
    (("--node", "2"), "unknown argument '--node'"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_anything_starts(args, message):
    proc = _start(*args, "--dry-run") if args != ("--nodes",) else _start(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_readme_start_commands_run_as_dry_run_and_ci_starts_two_nodes():
    starts = [shlex.split(line) for line in commands(SLURM_README, "## A real Slurm on one machine")
              if "slurm/local/start.sh" in line]
    assert [argv[:2] for argv in starts] == [["sudo", "slurm/local/start.sh"]] * 2, starts
    assert [argv[2:] for argv in starts] == [[], ["--nodes", "2"]], starts
    for argv in starts:
        proc = _start(*argv[2:], "--dry-run")
        assert proc.returncode == 0, proc.stderr
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^bash slurm/local/start\.sh --nodes 2$", ci, re.M), ci
