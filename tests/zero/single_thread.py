"""An autouse fixture for the test modules that train a tiny model in the pytest process: one intra-op thread.

A CI worker has 2 cores shared with another worker; torch's 2 OpenMP threads per process then spin-wait for each
other on every small kernel, which cost these modules 2-2.5x the CPU time of one thread (same losses: a module's
reference and its stages run under the same setting). Import it by name into a test module
(``from single_thread import one_thread``) to apply it there; the previous thread count is restored after the
module. Not for modules whose assertions read wall time at toy sizes (test_zero_gpu_experiment's search projects
the next size's time from the last one: slower single-threaded steps there skip sizes under load).
"""

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
