"""torchrun's agent as :mod:`repro.dist.torchrun` starts it: ``torch.distributed.run`` with its failure report held
back when the ranks already said why they stopped.

A rank of the suite that stops for a known reason prints one line and exits with its own code (2 a bad input, 3 a
non-finite loss, 74 a failed save, 75 preempted, 124 a hang). torchrun's agent then SIGTERMs the other ranks, logs
each failure and raises ``ChildFailedError``, whose traceback and report (~45 lines) bury that line, and exits 1.
Here the agent's own stderr (its Python logging and tracebacks; the ranks write to the inherited file descriptor,
untouched) passes through as it comes until its first warning or error record, and is held from there: when the
first rank to fail exited with one of the suite's codes and every other failed rank with one of them too, or was
stopped by the agent (SIGTERM, SIGKILL), the held lines are dropped and the agent exits with that code; otherwise
they are written out and the failure is raised as torchrun would. A signal that reaches the agent (torchrun raises
``SignalException`` once it has passed the signal to its ranks and stopped them) is one line and exit code 128 + N,
never its traceback, also when torch's own code raised another error over it (:func:`signal_behind`):
:mod:`repro.dist.torchrun` turns it into 75 or 0 by what the ranks did.

A job of one node that names no rendezvous (no ``--master-port``, ``--rdzv-endpoint`` or ``--standalone``) gets a
port of its own, from the operating system, on every torch: recent torch does this itself (c10d at ``localhost:0``),
torch 2.4 binds 29500, so a second such job on the machine died of ``EADDRINUSE`` (:func:`own_rendezvous`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import uuid
from typing import Mapping, Sequence, TextIO

#: the exit codes of a rank that stopped for a reason it printed in one line
SUITE_CODES = (2, 3, 74, 75, 124)
#: a rank's exit code when the agent stopped it after another rank failed (-SIGTERM, -SIGKILL)
STOPPED_BY_AGENT = (-15, -9)
#: where the agent's report starts: a W or E record of torch's elastic agent (``W1128 17:30:41.109000 1212
#: .../torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 1264 closing signal SIGTERM``), or a
#: traceback; torchrun's start-up banner (from torch/distributed/run.py) passes
REPORT_START = re.compile(r"^([WE]\d{4} \d\d:\d\d:\d\d\S* \d+ \S*torch/distributed/elastic/|Traceback \(most recent)")


class HeldStream(io.TextIOBase):
    """Passes lines to ``real`` until one matches :data:`REPORT_START`; holds that one and every later line."""

    def __init__(self, real: TextIO) -> None:
        super().__init__()
        self.real, self.held, self.holding, self._partial = real, [], False, ""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:  # the agent's fault handler writes there
        return self.real.fileno()

    def write(self, text: str) -> int:
        self._partial += text
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            self._line(line + "\n")
        return len(text)

    def _line(self, line: str) -> None:
        self.holding = self.holding or bool(REPORT_START.match(line))
        if self.holding:
            self.held.append(line)
        else:
            self.real.write(line)
            self.real.flush()

    def flush(self) -> None:
        self.real.flush()

    def release(self) -> None:
        """Write out what was held, and pass everything through from now on."""
        self.real.write("".join(self.held) + self._partial)
        self.real.flush()
        self.held, self.holding, self._partial = [], False, ""

    def drop(self) -> None:
        self.held, self._partial = [], ""


def suite_exit_code(exit_codes: Mapping[int, tuple[float, int]]) -> int | None:
    """The code to exit with when the failed ranks (rank -> (time, exit code)) all stopped for the suite's reasons:
    the first one's; None when any failed otherwise (a traceback, a signal the agent did not send)."""
    own = sorted((when, code) for when, code in exit_codes.values() if code not in STOPPED_BY_AGENT)
    if own and all(code in SUITE_CODES for _, code in own):
        return own[0][1]
    return None


def _rebind_handlers(real: TextIO, held: HeldStream) -> None:
    """Point every logging handler that writes to ``real`` (torch's, made when torch was imported) at ``held``."""
    loggers = [logging.getLogger(), *(lg for lg in logging.root.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is real:
                handler.setStream(held)


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(int(number)).name
    except ValueError:
        return f"signal {number}"


def signal_behind(err: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``err`` if it is a ``kind``, else the ``kind`` it was raised while handling (its ``__cause__`` or
    ``__context__``, followed back), else None. torchrun raises ``SignalException`` from its signal handler, which
    can run anywhere in the agent: inside torch's metrics ``timer`` wrapper, before that wrapper's ``start`` is set,
    its ``finally`` turns it into an ``UnboundLocalError`` (seen with torch 2.4.1; the wrapper is the same in 2.13),
    which is still a signal that reached the agent."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def own_rendezvous(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """``argv`` with ``--rdzv-backend c10d --rdzv-endpoint localhost:0 --rdzv-id <new>`` in front when it is a job of
    one node (``--nnodes`` 1 or 1:1) with torchrun's static rendezvous and no port, endpoint or ``PET_MASTER_PORT``:
    torch's own rule since it stopped defaulting to port 29500; the options as given otherwise (torchrun reports
    options it cannot parse itself)."""
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    parser = get_args_parser()
    parser.set_defaults(master_port=None)  # torch 2.4's default is 29500: None tells "not given" on every torch
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(list(argv))
            _, max_nodes = parse_min_max_nnodes(args.nnodes)
    except (SystemExit, ValueError, RuntimeError):
        return list(argv)
    named = args.standalone or args.rdzv_backend != "static" or args.rdzv_endpoint or args.master_port is not None
    if named or environ.get("PET_MASTER_PORT") or max_nodes != 1:
        return list(argv)
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", uuid.uuid4().hex, *argv]


def main(argv: Sequence[str] | None = None) -> int:
    real = sys.stderr
    held = HeldStream(real)
    sys.stderr = held
    import runpy

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _rebind_handlers(real, held)
    sys.argv[1:] = own_rendezvous(sys.argv[1:] if argv is None else argv)
    try:  # as python -m torch.distributed.run: its own messages (the start-up banner) look the same
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except ChildFailedError as err:
        code = suite_exit_code({rank: (f.timestamp, f.exitcode) for rank, f in err.failures.items()})
        if code is not None:
            held.drop()  # each rank printed its line
            return code
        held.release()
        sys.stderr = real
        raise
    except BaseException as err:
        signalled = signal_behind(err, SignalException)
        if signalled is None:
            held.release()
            sys.stderr = real
            raise
        # a signal reached the agent, which passed it to its ranks and stopped them
        held.drop()  # its report of stopping them; the ranks said for themselves what they did
        sys.stderr = real
        print(f"repro torchrun: torchrun's agent got {_signal_name(signalled.sigval)} and stopped its ranks",
              file=sys.stderr, flush=True)
        return 128 + int(signalled.sigval)
    held.release()
    return 0


if __name__ == "__main__":
    from repro.cliargs import exit_without_teardown

    exit_without_teardown(main())
