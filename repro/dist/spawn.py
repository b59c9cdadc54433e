"""Run a function on N local processes with torch.distributed initialised: the embedded default launcher.

Each child gets the same environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), so code written for torchrun or srun runs unchanged. The first failing rank's traceback is re-raised
in the parent, and the remaining ranks are killed rather than left waiting on a collective.

How ranks start (:func:`choose_start_method`): ``fork`` only where torch was built without a GPU runtime, where it is
safe and fastest. With a CUDA (or ROCm, XPU) build, a forked child fails as soon as the parent has touched CUDA
("Cannot re-initialize CUDA in forked subprocess") or run a backward ("Unable to handle autograd's threading in
combination with fork-based multiprocessing"), so ranks start from a ``forkserver`` instead: a clean process that
imported torch once and never ran anything, forked per rank (fast, and the ranks may use many threads). ``fn`` and
its arguments must then be picklable (module-level functions); each rank gets the parent's current environment,
working directory and ``sys.path``. ``REPRO_START_METHOD`` overrides the choice.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable

from repro.environment import start_method as start_method_setting


class SpawnError(RuntimeError):
    """A rank failed (or the job timed out); carries the rank's traceback."""


def _killed_first(procs, rank: int, world_size: int, error: str) -> str:
    """The message for rank ``rank``'s error, naming first any other rank that a signal killed: when the kernel's
    OOM killer (SIGKILL) takes one rank, the others fail next with "connection closed by peer", and that error,
    which arrives first, says nothing about memory."""
    # a peer's closed socket: the killed rank may not have been reaped yet, so look for up to 2 s; else once
    peer_gone = "closed by peer" in error or "reset by peer" in error
    deadline = time.monotonic() + (2.0 if peer_gone else 0.0)
    while True:
        killed = [r for r, p in enumerate(procs) if r != rank and p.exitcode is not None and p.exitcode < 0]
        if killed or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    text = f"rank {rank} of {world_size} failed:\n{error}"
    if not killed:
        return text
    return "; ".join(f"rank {r} {_death(procs[r].exitcode)}" for r in killed) + "; then " + text


def _death(exitcode: int) -> str:
    """How a rank ended, in words: a negative exit code is the signal that killed it."""
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    hint = " (the kernel's OOM killer sends it when memory runs out)" if name == "SIGKILL" else ""
    return f"was killed by {name}{hint}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: torch's modules imported once before ranks are forked (with ``fork`` by the parent, else by the forkserver), so
#: that no rank imports them again. ``torch._dynamo`` (with sympy, ~800 modules) comes with a model's first weight
#: init (``normal_``) or torch.optim's first optimizer: left to the ranks it cost each one ~2 s of CPU (torch 2.13),
#: more than a small test's whole training.
TORCH_PRELOAD = ("torch", "torch.distributed", "torch._dynamo")

#: What the forkserver imports once, so that each rank forked from it starts without importing torch again (repro's
#: own modules above this floor, which a rank imports in ~0.15 s, are left to the rank: no import points up).
FORKSERVER_PRELOAD = (*TORCH_PRELOAD, "repro.dist.launch", "repro.dist.groups")


def accelerator_built() -> bool:
    """Whether this torch carries a GPU runtime (CUDA, ROCm or XPU), whose threads and state do not survive fork."""
    import torch  # here, not at module load: ``repro.dist`` binds ``spawn`` at once, and the wrapper needs no torch

    xpu = getattr(torch, "xpu", None)
    return bool(torch.version.cuda or getattr(torch.version, "hip", None)
                or (xpu is not None and getattr(xpu, "is_available", lambda: False)()))


def choose_start_method(requested: str | None = None) -> str:
    """How to start ranks: ``requested``, else ``$REPRO_START_METHOD``, else ``fork`` where torch has no GPU runtime
    and ``forkserver`` (``spawn`` where there is none) where it has one. Forking a process that has initialised
    CUDA is refused: its ranks would fail at their first CUDA call."""
    available = mp.get_all_start_methods()
    choice = requested or start_method_setting()  # the variable's own rule and one-line refusal
    if choice is None:
        if "fork" in available and not accelerator_built():
            return "fork"
        return "forkserver" if "forkserver" in available else "spawn"
    if choice not in available:
        raise ValueError(f"start method {choice!r} (REPRO_START_METHOD or start_method=) is not one of this "
                         f"platform's: {', '.join(available)}")
    import torch

    if choice == "fork" and accelerator_built() and torch.cuda.is_initialized():
        raise ValueError("start method 'fork' after CUDA was initialised in this process: the ranks would fail "
                         "with 'Cannot re-initialize CUDA in forked subprocess'; use forkserver or spawn")
    return choice


def _context(method: str):
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    elif method == "fork":  # the ranks inherit what this process imported (once; no thread starts on import)
        for name in TORCH_PRELOAD:
            importlib.import_module(name)
    return ctx


def forget_inherited_compile_pool() -> None:
    """In a forked child: drop the compile thread pool inherited from the parent, so that the child's first
    compile that misses the cache starts a pool of its own.

    TorchInductor compiles its C++ (CPU) kernels on a thread pool (``AsyncCompile.pool``, made once and cached)
    where ``compile_threads`` > 1, the default on any machine of 2 cores or more. A forked child inherits the pool
    object but not its threads: its jobs queue behind threads that do not exist, and a rank whose graph is not in
    the cache waits forever (until the spawn's timeout) for its kernels. torch resets its compile *process* pool
    after a fork (``after_fork``), but not this one (seen on torch 2.4.1 and 2.13: a parent that compiled one
    graph, then a forked rank compiling another, with an empty cache). Nothing to do where inductor is not loaded.
    """
    module = sys.modules.get("torch._inductor.async_compile")
    pool = getattr(getattr(module, "AsyncCompile", None), "pool", None)
    if callable(getattr(pool, "cache_clear", None)):
        pool.cache_clear()


def _child(fn, rank, world_size, port, backend, timeout_s, threads, results, args, kwargs,
           parent=None):  # pragma: no cover
    if parent is not None:  # forkserver/spawn: the parent's environment, directory and path as they are now
        environ, cwd, path = parent
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.path[:] = path
    forget_inherited_compile_pool()  # a forkserver child inherits the server's state too
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    try:
        import torch  # already imported by a forked rank's parent or the forkserver

        torch.set_num_threads(threads)
        from repro.dist.launch import exit_now, init_distributed, leave_process_group

        if world_size > 1:
            init_distributed(backend, timeout_s=timeout_s)
            # every rank through the rendezvous before any may leave: a rank whose fn returns at once (no
            # collective) would close its connections while a slower rank still builds gloo's full mesh
            # ("Connection closed by peer" there)
            torch.distributed.barrier()
        value = fn(rank, world_size, *args, **kwargs)
        # Plain pickle (not the queue's ForkingPickler, which shares tensors through file descriptors that die
        # with this process before the parent reads them).
        results.put(("ok", rank, pickle.dumps(value)))
        if not leave_process_group():  # torch < 2.5: no destroy (it can deadlock); leave with the process
            results.close()
            results.join_thread()
            exit_now(0)
    except BaseException:  # noqa: BLE001 - everything must reach the parent
        results.put(("error", rank, traceback.format_exc()))
        results.close()
        results.join_thread()  # the queue's feeder thread must flush before _exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    start_method: str | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes; return their results by rank.

    The ranks start as :func:`choose_start_method` says (``start_method`` here overrides): with ``fork``, ``fn`` may
    be a closure and ranks run single-threaded; otherwise ``fn`` and its arguments must be picklable.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer")
    method = choose_start_method(start_method)
    ctx = _context(method)
    parent = None if method == "fork" else (dict(os.environ), os.getcwd(), list(sys.path))
    results = ctx.Queue()
    port = free_port()
    # GNU OpenMP's thread pool does not survive fork: a forked child that runs a multi-threaded kernel after the
    # parent used the pool deadlocks. Forked ranks therefore compute single-threaded; use start_method="spawn" for
    # multi-threaded ranks (each then re-imports torch, about a second per rank).
    threads = 1 if method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, rank, world_size, port, backend, min(timeout_s, 600.0), threads, results, args, kwargs,
                  parent),
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SpawnError(f"timed out after {timeout_s:.0f} s; ranks done: {sorted(values)}")
            try:
                status, rank, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in values]
                if dead:
                    # A rank died without reporting (killed, segfault): give the queue a moment, then fail.
                    try:
                        status, rank, value = results.get(timeout=2.0)
                    except queue.Empty:
                        raise SpawnError(
                            f"rank {dead[0]} {_death(procs[dead[0]].exitcode)} without a report"
                        ) from None
                else:
                    continue
            if status == "error":
                raise SpawnError(_killed_first(procs, rank, world_size, value))
            values[rank] = pickle.loads(value)
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    return [values[rank] for rank in range(world_size)]
