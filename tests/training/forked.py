"""``python -m MODULE ARGS`` as a process forked from a warm server: the command's own exit code, standard output and
error, and signals, without the ~5 s of CPU each new interpreter spends importing torch and repro.

The server is :mod:`multiprocessing`'s forkserver (as :mod:`repro.dist.spawn` uses where fork is unsafe): a clean
process that imported torch and the trainer once and never ran anything (no thread pool, no process group, none of
pytest's capturing), forked per command. The child takes the caller's environment, working directory and
``sys.path``, points its descriptors 1 and 2 at files, and runs the module as ``python -m`` does
(:func:`runpy.run_module` as ``__main__``, ``sys.argv`` set), so ``repro train``'s entry point, its signal handling
and its ``os._exit`` codes all apply. What it skips is the interpreter's start and those imports: a test about them
(a line printed at import, ``python -m`` itself) starts a real interpreter (``subprocess``), as each test file keeps
at least one of its kind doing.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from tests.training.ranks import ROOT, Ranks
from repro.dist.spawn import FORKSERVER_PRELOAD

#: imported once by the server: what ``repro train`` imports before and during its first step
PRELOAD = (*FORKSERVER_PRELOAD, "repro.models", "repro.training.trainer", "repro.experiments", "repro.cli",
           "repro.training.cli", "repro.training.loop", "repro.training.checkpoint", "repro.training.consolidate",
           "repro.training.startcheck", "repro.training.watchdog", "repro.training.dirlock", "tests.training.forked")


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    if not _STOP_AT_EXIT:
        _STOP_AT_EXIT.append(atexit.register(_stop_server))
    return ctx


_STOP_AT_EXIT: list = []


def _stop_server() -> None:
    """Stop the server and wait for it, so that it ends with the test run and its CPU time (its children's) counts
    in the run's, as a subprocess's would (Python's own tests stop it so; there is no public call)."""
    server = getattr(mp.forkserver, "_forkserver", None)
    if server is not None and hasattr(server, "_stop"):
        server._stop()


def _exit_code(exit_: SystemExit) -> int:
    """The status ``sys.exit(value)`` gives a process: None is 0, an int itself, anything else printed and 1."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)
    return 1


def _run_module(module: str, argv: list[str], environ: dict[str, str], cwd: str, path: list[str], out: str,
                err: str | None) -> None:  # pragma: no cover - runs in the forked child
    """The child: the caller's process state, then ``python -m module argv``; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.path[:] = path
        out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err_fd = out_fd if err is None else os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        # a fresh interpreter's streams: buffered standard output into a file, line-buffered standard error
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if environ.get("OMP_NUM_THREADS", "").isdigit():  # read by torch at its import, in the server
            import torch

            torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_)
    except KeyboardInterrupt:  # as the interpreter ends on one: by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream: nothing more to say
                pass
        os._exit(code & 0xFF)


class Forked:
    """A started command, read as a :class:`subprocess.Popen` (``pid``, ``poll``, ``wait``, ``send_signal``,
    ``kill``, ``returncode``; a signal's death is its negative number)."""

    def __init__(self, program: list[str], *, out: Path, err: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path | str | None = None) -> None:
        if len(program) < 2 or program[0] != "-m":
            raise ValueError(f"program {program!r}: only ['-m', MODULE, ARGS...] can be forked")
        environ = dict(os.environ if env is None else env)
        for path in (out, err):  # here, as subprocess.Popen's caller opens them: a reader may look before the child
            if path is not None:  # runs (wait_for reads the log at once)
                Path(path).write_bytes(b"")
        args = (program[1], list(program[2:]), environ, str(cwd or os.getcwd()), list(sys.path), str(out),
                None if err is None else str(err))
        self.args = program
        self._process = _context().Process(target=_run_module, args=args, daemon=False)
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, number: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()


def run(program: list[str], *, env: dict[str, str] | None = None, cwd: Path | str | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` of ``python PROGRAM`` (``["-m", MODULE, ARGS...]``), forked: stdout and stderr as
    text, apart."""
    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        proc = Forked(program, out=out, err=err, env=env, cwd=cwd)
        try:
            code = proc.wait(timeout)
        finally:
            proc.kill()
        text = [path.read_text(errors="replace") if path.exists() else "" for path in (out, err)]
        return subprocess.CompletedProcess(["python", *program], code, *text)


def train(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``python -m repro.training ARGV``, forked (see :func:`run`)."""
    return run(["-m", "repro.training", *argv], **kwargs)


class ForkedRanks(Ranks):
    """:class:`~tests.training.ranks.Ranks` (independent rank processes, as srun starts them), each forked."""

    def start(self, argv: list[str], env: dict[str, str], log: Path):
        return Forked(argv, out=log, env=env, cwd=ROOT)
