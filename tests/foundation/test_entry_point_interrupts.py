"""A Ctrl-C to a ``repro`` command is never lost (repro.cliargs.run_entry_point), even where Python drops it."""

from __future__ import annotations

import signal
import subprocess
import sys

from repro.results import REPO_ROOT


def test_a_ctrl_c_python_drops_in_a_callback_is_delivered_again():
    """A KeyboardInterrupt raised in a weakref callback is "ignored" by Python, traceback printed; seen during
    torch.compile (its caches' weakref callbacks) under ``repro run``, which then ran on. The command must end as
    for any Ctrl-C it does not handle: one line, 130, no traceback, and no more of its work."""
    proc = subprocess.run([sys.executable, "-m", "tests.foundation.dropped_interrupt_job"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "finished" not in proc.stdout
    assert proc.stderr.strip() == "demo: interrupted (SIGINT)", proc.stderr
