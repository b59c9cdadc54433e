"""Every process group the suite creates waits ``--timeout-s``, not torch's 30 minutes (issue 27).

Two independent ranks (no spawn parent: its own timeout would bound the job) initialise the default group with a
4 s timeout; rank 0 then waits in a barrier of every two-rank group of three layouts (tp=2, pp=2, dp=2), of the
model-parallel group of the optimizer, and of a layout made with ``init_parallel(timeout_s=1)``, all at once, while
rank 1 never joins. Each barrier must raise a timeout after its group's timeout: 4 s inherited, 1 s given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from repro.dist.spawn import free_port

DEFAULT_S = 4.0  # init_distributed(timeout_s=): every group of init_parallel inherits it
GIVEN_S = 1.0  # init_parallel(timeout_s=) overrides it
ROOT = Path(__file__).resolve().parents[2]


def rank_main(directory: str) -> None:
    """One rank of the job (run by the test in its own process); rank 0 prints JSON: group -> (timeout_s
    attribute, seconds its barrier waited, the error)."""
    from repro.dist import comm, init_distributed, init_parallel
    from repro.training.optim import model_parallel_group

    rank = int(os.environ["RANK"])
    Path(directory, f"ready{rank}").touch()  # start the rendezvous together: its timeout is the short one too
    while not all(Path(directory, f"ready{r}").exists() for r in range(2)):
        time.sleep(0.02)
    init_distributed(timeout_s=DEFAULT_S)
    tp, pp, dp = init_parallel(tp=2), init_parallel(pp=2), init_parallel(dp=2)
    given = init_parallel(pp=2, timeout_s=GIVEN_S)
    groups = {"tp": tp.tp, "pp": pp.pp, "dp": dp.dp, "world": tp.world, "embedding": pp.embedding,
              "model_parallel": model_parallel_group(tp), "given pp": given.pp, "given world": given.world,
              "given model_parallel": model_parallel_group(given)}
    if rank == 1:  # never joins; the test kills it
        time.sleep(120)
    waits: dict[str, tuple[float | None, float, str]] = {}

    def wait_in(name: str) -> None:
        started = time.monotonic()
        try:
            comm.barrier(groups[name])
            error = "returned"
        except RuntimeError as err:
            error = str(err)
        waits[name] = (groups[name].timeout_s, time.monotonic() - started, error)

    threads = [threading.Thread(target=wait_in, args=(name,)) for name in groups]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(waits), flush=True)
    os._exit(0)  # the process groups' destructors would wait for rank 1


def test_every_group_times_out_after_the_default_groups_timeout_or_the_given_one(tmp_path):
    port, procs = free_port(), []
    code = f"from tests.foundation.test_group_timeouts import rank_main; rank_main({str(tmp_path)!r})"
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        out, _ = procs[0].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode == 0, out
    waits = json.loads(out.strip().splitlines()[-1])
    print({name: round(seconds, 2) for name, (_, seconds, _) in waits.items()})
    for name, (timeout_s, seconds, error) in waits.items():
        expected = GIVEN_S if name.startswith("given") else DEFAULT_S
        assert timeout_s == expected, (name, timeout_s)
        assert "timed out" in error.lower() or "timeout" in error.lower(), (name, error)
        # never early; late by at most a loaded machine's scheduling (torch's default would be 30 minutes)
        assert expected - 0.2 < seconds < expected + (2.5 if expected == GIVEN_S else 10), (name, seconds)
