"""``repro train`` in which a Ctrl-C lands inside library code that swallows KeyboardInterrupt, before training.

``python -m tests.training.swallowed_interrupt_job PHASE ARGS...``: PHASE ``options`` (while the options are checked)
or ``meeting`` (while the ranks meet): there, the process sends itself SIGINT inside ``try: ... except: pass``, as
mpmath's probe for its optional gmpy backend is written (torch 2.4 loads it on the first use of sympy, which the
trainer's imports make). A KeyboardInterrupt raised there is gone; the run must end all the same. ARGS go to
``python -m repro.training``. Started by test_interrupt.py.
"""

import os
import signal
import sys
import time

import repro.training.cli as training_cli
from repro.cliargs import run_entry_point

PHASES = {"options": "check_args", "meeting": "init_distributed"}


def swallowing(function):
    """``function``, after a SIGINT that arrives inside a bare ``except: pass``."""

    def called(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the handler runs here at the latest (the sleep is cut short by the signal)
        except:  # noqa: E722 - the point: library code that swallows everything
            pass
        return function(*args, **kwargs)

    return called


phase, sys.argv[1:] = sys.argv[1], sys.argv[2:]
setattr(training_cli, PHASES[phase], swallowing(getattr(training_cli, PHASES[phase])))
run_entry_point("repro.training.cli", "repro train")
