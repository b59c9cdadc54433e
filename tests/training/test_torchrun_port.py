"""``python -m repro.dist.torchrun`` on one node without a port gets one of its own on every torch.

Recent torch gives such a job a c10d rendezvous at ``localhost:0``; torch 2.4 (the floor) bound 29500, so two jobs
on one machine (two users, or two tests at once) died of ``EADDRINUSE``. The rule as a table, and a real job that
trains while another process holds 29500.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from repro.dist.torchrun_agent import own_rendezvous

OWN = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
#: name -> (torchrun's options, environment, gets a port of its own?)
CASES = {
    "one_node_no_port": (["--nproc-per-node", "2", "-m", "repro.training"], {}, True),
    "nnodes_1_to_1": (["--nnodes", "1:1", "--nproc-per-node", "2", "x.py"], {}, True),
    "the_script_names_a_port": (["--nproc-per-node", "2", "x.py", "--master-port", "9"], {}, True),
    "a_port_given": (["--nproc-per-node", "2", "--master-port", "29501", "x.py"], {}, False),
    "the_default_port_given": (["--master_port", "29500", "x.py"], {}, False),
    "a_port_from_the_environment": (["--nproc-per-node", "2", "x.py"], {"PET_MASTER_PORT": "29501"}, False),
    "an_endpoint_given": (["--rdzv-endpoint", "host:29400", "--rdzv-backend", "c10d", "x.py"], {}, False),
    "standalone": (["--standalone", "x.py"], {}, False),
    "two_nodes": (["--nnodes", "2", "--node-rank", "0", "x.py"], {}, False),
    "elastic_up_to_two_nodes": (["--nnodes", "1:2", "x.py"], {}, False),
    "options_torchrun_refuses": (["--no-such-option", "x.py"], {}, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_port_of_its_own_only_where_none_is_named(name):
    argv, environ, own = CASES[name]
    got = own_rendezvous(argv, environ)
    if own:
        assert got[:4] == OWN and got[4] == "--rdzv-id" and len(got[5]) == 32 and got[6:] == argv
        assert own_rendezvous(argv, environ)[5] != got[5]  # a new rendezvous id per job
    else:
        assert got == argv


def test_a_job_trains_while_another_process_holds_port_29500(tmp_path):
    script = tmp_path / "meet.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "t = __import__('torch').ones(1)\ndist.all_reduce(t)\n"
                      "dist.get_rank() or print('ranks met, sum', int(t.item()), flush=True)\n"
                      "dist.destroy_process_group()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_"))}
    with socket.socket() as held:
        try:
            held.bind(("", 29500))
            held.listen()
        except OSError:
            pass  # something else holds it already: the job must not need it either
        run = subprocess.run([sys.executable, "-m", "repro.dist.torchrun", "--nproc-per-node", "2", str(script)],
                             capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["ranks met, sum 2"], run.stdout
