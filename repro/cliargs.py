"""Command-line conventions shared by every ``repro`` command: one-line errors (exit code 2) and checked numbers.

argparse prints its whole usage block before an error; on a cluster log that buries the one line that matters.
:class:`OneLineParser` prints only ``PROG: error: MESSAGE (see PROG --help)``. The ``positive_int`` family are
argparse ``type=`` functions whose error names the value given and the rule it breaks.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from typing import Callable, Iterator, NoReturn

#: seeds are accepted in [0, 2**63): torch's and numpy's generators take a 64-bit seed, and a larger or negative one
#: would wrap onto another seed (two runs told different seeds would draw the same data)
SEED_LIMIT = 2**63

#: 128 + SIGPIPE, as a shell reports a Unix tool whose reader left (``repro list | head -1``)
EXIT_BROKEN_PIPE = 141

#: how long after Python dropped a KeyboardInterrupt it is delivered again (:func:`redeliver_dropped_interrupts`)
REDELIVER_AFTER_S = 0.02


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; every option's help ends with its default, unless the help already says it or
    there is none to say (``None``, ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default in (None, False, argparse.SUPPRESS) or "default" in text.lower() or not action.option_strings
                or isinstance(default, bool)):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})".strip()


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2, and whose help shows each option's
    default (:class:`DefaultsFormatter`); subcommands inherit both."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def int_at_least(lowest: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= ``lowest`` (``why``: the reason, said in the refusal)."""
    def parse(text: str) -> int:
        value = _number(text, int)
        if value < lowest:
            raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= {lowest}{f' ({why})' if why else ''}")
        return value
    parse.__name__ = f"integer >= {lowest}"
    return parse


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive, finite number")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def probability(text: str) -> float:
    """A probability that may not be 1, such as a dropout rate: a number in [0, 1)."""
    value = _number(text, float)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number in [0, 1)")
    return value


def seed(text: str) -> int:
    """A random seed: an integer in [0, 2**63) (see :data:`SEED_LIMIT`)."""
    value = _number(text, int)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in [0, 2**63)")
    return value


def run_entry_point(module: str, prog: str) -> NoReturn:
    """``sys.exit(module.main())`` for an entry point, importing ``module`` only here, so that a Ctrl-C while it
    loads (torch takes seconds) is one line and exit code 130 (128 + SIGINT), not a traceback.

    While the module loads, a SIGINT ends the process at once (:func:`sigint_exits_at_once`): nothing has been done
    yet, so leaving at once loses nothing. Once the module is loaded the previous handler is back, and the command's
    own handling of Ctrl-C applies; a KeyboardInterrupt the command lets through is the line
    ``PROG: interrupted (SIGINT)`` and 130. One that Python had to drop, raised inside a callback it cannot raise
    from, is delivered again (:func:`redeliver_dropped_interrupts`).

    A reader of standard output that left early (``repro list | head -1``) ends the command quietly, as it ends a
    Unix tool: no traceback, exit code 141 (128 + SIGPIPE), see :func:`_reader_left`. The process ends without the
    interpreter's teardown (:func:`exit_without_teardown`)."""
    import importlib
    import os
    import sys

    with sigint_exits_at_once(f"{prog}: interrupted (SIGINT) before it started; nothing was done"):
        main = importlib.import_module(module).main
    redeliver_dropped_interrupts()
    try:
        try:
            code = main()
        except SystemExit as exit_:  # a refusal (exit code 2), --help, --version: ends as a returned code does
            code = exit_.code
        sys.stdout.flush()  # here, where a reader that left is caught, not in the interpreter's exit
    except KeyboardInterrupt:  # one the command did not handle itself (e.g. while it parses its options)
        print(f"{prog}: interrupted (SIGINT)", file=sys.stderr, flush=True)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _reader_left()
        os._exit(130)  # not sys.exit: see above (a KeyboardInterrupt raised in C code would end the process by SIGINT)
    except BrokenPipeError:
        _reader_left()
    exit_without_teardown(code)


@contextlib.contextmanager
def sigint_exits_at_once(line: str) -> Iterator[None]:
    """While inside, a SIGINT (Ctrl-C) prints ``line`` to standard error and ends the process at once with exit code
    130 (128 + SIGINT), instead of raising KeyboardInterrupt; on leaving, the previous handler is back.

    For work that has nothing to lose yet (modules loading, options checked, ranks meeting), where a
    KeyboardInterrupt is not safe to raise: one raised inside a library can be swallowed by its broad ``except``
    (mpmath's ``except: pass`` around its optional gmpy import, which torch 2.4's first use of sympy runs: the
    Ctrl-C was lost and training ran on), or, raised inside C code that runs Python (``PyRun_*``), make the
    interpreter end by SIGINT even after it was caught (exit -2 instead of 130). The process ends with ``os._exit``
    (standard output flushed first): no exception travels through anyone's code. A SIGINT that was ignored
    (``nohup``, a background job) stays ignored, one handled outside Python is left alone, and off the main thread
    (where Python runs no signal handler) nothing changes."""
    import os
    import signal
    import sys
    import threading

    def interrupted(signum: int, frame: object) -> None:
        print(line, file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):  # a reader gone, or closed: nothing more can be said there
            sys.stdout.flush()
        os._exit(130)

    previous = signal.getsignal(signal.SIGINT)
    ours = (threading.current_thread() is threading.main_thread()
            and previous is not signal.SIG_IGN and previous is not None)  # None: a handler set outside Python
    if ours:
        signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGINT, previous)


def redeliver_dropped_interrupts() -> None:
    """From now on, a KeyboardInterrupt that Python drops is delivered again, as a new SIGINT to the main thread.

    Where Python cannot raise (a weakref callback, a ``__del__``, a garbage-collector callback), it prints "Exception
    ignored in ..." with a traceback and goes on as if the Ctrl-C had not come: during torch.compile, whose caches
    hold weakref callbacks, a Ctrl-C to ``repro run`` was lost that way and the run went on. The interpreter hands
    the dropped exception to :data:`sys.unraisablehook`; this hook, for a KeyboardInterrupt, prints nothing and
    starts a thread that sends SIGINT to the main thread :data:`REDELIVER_AFTER_S` later, once the hook has returned
    (a signal that came while it ran would be raised inside it, where it is dropped for good), so the handler runs
    where it can raise. One dropped again (the next callback of the same collection) comes back again. Any other
    exception goes to the hook that was there before."""
    import _thread
    import signal
    import sys
    import threading
    import time

    previous = sys.unraisablehook
    main = threading.main_thread().ident

    def interrupt_main() -> None:
        time.sleep(REDELIVER_AFTER_S)
        if hasattr(signal, "pthread_kill"):  # a real signal: it also cuts short a sleep or a blocking read
            signal.pthread_kill(main, signal.SIGINT)
        else:  # Windows
            _thread.interrupt_main()

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)
            return
        _thread.start_new_thread(interrupt_main, ())  # returns at once (threading.Thread.start waits in Python)

    sys.unraisablehook = hook


def exit_without_teardown(code: object) -> NoReturn:
    """``sys.exit(code)`` as far as anyone can tell (the atexit handlers run, standard output and error are flushed,
    the exit code is the same), without the interpreter's teardown: freeing every object and module one by one
    took ~1 s of CPU in a process that had loaded torch (and its compiler stack, which torch.optim loads), paid by
    every rank of every run, and on torch < 2.5 running gloo's destructors there could deadlock or abort (see
    :func:`repro.dist.launch.end_rank`). The operating system frees the memory and closes the descriptors anyway.
    Where a thread that the interpreter would wait for still runs (a pool's worker, say), or the code is not a
    number, the process ends the ordinary way."""
    import atexit
    import os
    import sys
    import threading

    waited_for = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if waited_for or not (code is None or isinstance(code, int)):
        sys.exit(code)
    atexit._run_exitfuncs()  # what the interpreter runs at its exit: logging's flush, coverage, finalizers
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_left()
    for stream in {id(s): s for s in (sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None}.values():
        try:
            stream.flush()
        except (OSError, ValueError):  # its reader gone, or closed: nothing more can be said there
            pass
    os._exit(code or 0)


def _reader_left() -> NoReturn:
    """Exit 141 without a word: standard output's reader is gone. What is still buffered for it is dropped by
    pointing the descriptor at /dev/null, or the interpreter's own flush at exit would print a traceback-like
    "Exception ignored" message."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(EXIT_BROKEN_PIPE)


def repro_command() -> NoReturn:
    """The ``repro`` console script (pyproject's ``[project.scripts]``): :func:`run_entry_point` of
    :mod:`repro.commands` (the front of :mod:`repro.cli`), so an installed ``repro`` treats an early Ctrl-C as
    ``python -m repro`` does."""
    run_entry_point("repro.commands", "repro")
