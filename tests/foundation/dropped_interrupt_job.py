"""A command whose Ctrl-C lands where Python cannot raise it: in a weakref callback (as torch.compile's caches hold).

``python -m tests.foundation.dropped_interrupt_job``: through :func:`repro.cliargs.run_entry_point`, ``main`` drops
an object whose weakref callback sends the process SIGINT and waits in it, so the KeyboardInterrupt is raised inside
the callback, where Python prints "Exception ignored" and goes on; then it works for 20 s and prints ``finished``.
Started by test_entry_point_interrupts.py.
"""

import os
import signal
import time
import weakref

from repro.cliargs import run_entry_point


class _Thing:
    pass


def _interrupted_inside(ref: weakref.ref) -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)  # the handler raises here, inside the callback (the sleep is cut short by the signal)


def main() -> int:
    thing = _Thing()
    ref = weakref.ref(thing, _interrupted_inside)
    del thing  # the callback runs now
    print(f"after the callback ({ref() is None})", flush=True)
    time.sleep(20)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    run_entry_point("tests.foundation.dropped_interrupt_job", "demo")
