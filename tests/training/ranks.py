"""Start ``repro train`` as independent rank processes (as srun starts them: no parent that kills the others)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from repro.dist.spawn import free_port

ROOT = Path(__file__).resolve().parents[2]  # the ranks run here, so that ``-m tests.training...`` imports
SMALL = ["--layers", "2", "--hidden", "32", "--heads", "4", "--vocab", "64", "--seq-len", "16",
         "--micro-batches", "2", "--micro-batch-size", "2"]


def base_options(args: list[str]) -> list[str]:
    """SMALL without the options ``args`` gives itself (repro train refuses an option given twice with two values)."""
    given = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    pairs = [SMALL[i:i + 2] for i in range(0, len(SMALL), 2)]
    return [item for pair in pairs if pair[0] not in given for item in pair]


class Ranks:
    """``world`` processes of ``python -m repro.training ARGS``, each logging to ``tmp/<name>.rank<r>.log``;
    ``program`` replaces ``-m repro.training`` (a script that wraps ``repro.training.cli.main``)."""

    def __init__(self, tmp: Path, name: str, world: int, args: list[str], *, timeout_s: float = 60,
                 program: list[str] | None = None) -> None:
        port = free_port()
        self.logs = [tmp / f"{name}.rank{r}.log" for r in range(world)]
        self.procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            command = [*(program or ["-m", "repro.training"]), *base_options(args),
                       *([] if "--timeout-s" in args else ["--timeout-s", str(timeout_s)])]
            self.procs.append(self.start([*command, *args], env, self.logs[rank]))

    def start(self, argv: list[str], env: dict[str, str], log: Path):
        """One rank: ``python ARGV``, a new interpreter, its output into ``log``."""
        with open(log, "w") as out:
            return subprocess.Popen([sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def output(self, rank: int = 0) -> str:
        return self.logs[rank].read_text()

    def wait_for(self, pattern: str, timeout_s: float = 120, rank: int = 0) -> None:
        """Until ``pattern`` (a regular expression) appears in the rank's output."""
        deadline = time.monotonic() + timeout_s
        text = pattern
        while not re.search(pattern, self.output(rank)):
            if any(p.poll() is not None for p in self.procs):
                raise AssertionError(f"a rank ended before printing {text!r}:\n{self.all_output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout_s} s:\n{self.all_output()}")
            time.sleep(0.1)

    def wait(self, timeout_s: float = 180) -> list[int]:
        deadline = time.monotonic() + timeout_s
        try:
            return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]
        finally:
            self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def all_output(self) -> str:
        return "\n".join(f"--- rank {r}\n{log.read_text()[-3000:]}" for r, log in enumerate(self.logs))


def iterations(jsonl: Path) -> list[dict]:
    """The ``iteration`` records of a training JSONL log, in order."""
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["event"] == "iteration"]
