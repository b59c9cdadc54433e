"""How a rank ends (:func:`repro.dist.launch.end_rank`): with its own exit code, the process group left before the
interpreter's exit, on every torch, also when its peer is already gone.

The ranks are real processes (the destructors at an interpreter's exit are what is under test): each initialises
the default gloo group and the groups of a tp x dp grid, as ``repro train`` does, then ends with ``end_rank(75)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repro.dist.spawn import free_port
from repro.optional import torch_version

ROOT = Path(__file__).resolve().parents[2]

#: argv[1]: what rank 1 does after the setup ("end": end_rank like rank 0; "vanish": os._exit(0) at once)
RANK = """
import os, sys, time
import torch.distributed as dist
from repro.dist import init_distributed, init_parallel
from repro.dist.launch import end_rank

launch = init_distributed("gloo", timeout_s=30)
init_parallel(tp=2, pp=1, dp=1, timeout_s=30)
dist.barrier()
if launch.rank == 1 and sys.argv[1] == "vanish":
    os._exit(0)
if sys.argv[1] == "vanish":
    time.sleep(1)  # rank 1 is gone by now
code = end_rank(75)
print(f"returned: initialized={dist.is_initialized()}", flush=True)
sys.exit(code)
"""


def _ranks(mode: str) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, mode], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    done = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return done


def test_every_rank_ends_with_its_own_code_and_the_group_left():
    ranks = _ranks("end")
    assert [r.returncode for r in ranks] == [75, 75], [r.stdout for r in ranks]
    for rank in ranks:
        assert "terminate called" not in rank.stdout and "Traceback" not in rank.stdout, rank.stdout
        # torch >= 2.5 destroys the group and returns; older torch ends the process inside end_rank (no destructors)
        returned = "returned: initialized=False" in rank.stdout
        assert returned == (torch_version() >= (2, 5)), rank.stdout


def test_a_peer_gone_first_changes_nothing():
    """Rank 1 leaves without a word right after the setup; rank 0 still ends with 75, no traceback."""
    rank0, rank1 = _ranks("vanish")
    assert (rank0.returncode, rank1.returncode) == (75, 0), rank0.stdout
    assert "Traceback" not in rank0.stdout and "terminate called" not in rank0.stdout, rank0.stdout
