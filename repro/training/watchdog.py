"""Catch a rank that hangs anywhere (a step, a save, a load, an evaluation) and say which rank and where.

A rank that another rank waits for can stop making progress in two ways: it is stopped or dead (SIGSTOP, a frozen
node) or it is alive but stuck (a deadlock, a collective that the others never join). A stopped rank cannot say so
itself; the ranks that wait for it must, and they find out in one of two ways:

* **the process-group timeout** (``--timeout-s``): every collective and receive of every group raises after it
  (:func:`repro.dist.comm.new_comm_group`). :class:`Watchdog` turns that exception into one line and exit code 124;
* **the watchdog's own limit** (``--watchdog-s``): no heartbeat for that long, whatever the rank is doing (compute
  that never ends, a wait without a timeout), and it exits the same way from its thread.

The watchdog is never paused: the loop names what it is doing (``watchdog.doing("saving checkpoint iteration 12:
writing rank00001.pt")``), each pipeline action, file written or read and evaluation batch is a heartbeat, and the
line it prints names the activity. To name the rank it waits for, every rank posts a small record to the job's
rendezvous store every second or so (:class:`Heartbeats`): when it was last alive, when it last made progress and in
what. A rank that gives up reads them all (with a 2 s bound: the store's host may be the stopped rank) and names the
ranks not heard from (stopped or dead), else those doing something else than itself.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from repro.dist.torchrun import HUNG_FILE_VAR
from repro.training.failfast import EXIT_HUNG

#: how long a rank reading the others' records waits for the store before it reports without them
READ_BOUND_S = 2.0


def is_collective_timeout(err: BaseException) -> bool:
    """Whether ``err`` is a collective, receive or store operation that ran past its timeout (gloo: "Timed out
    waiting 10000ms for recv operation"; the store: "Socket Timeout", "wait timeout"; nccl in blocking-wait mode:
    "timed out"), as opposed to a dead peer ("Connection closed by peer") or a bug."""
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)


class Heartbeats:
    """Every rank's last sign of life and of progress, posted to the job's rendezvous store.

    A daemon thread sets ``repro/heartbeat/<rank>`` to ``{"alive": t, "progress": t, "activity": str}`` (wall
    clock) every ``interval_s``. Reads are bounded (:data:`READ_BOUND_S`) so that a report never waits on a store
    whose host is the stopped rank."""

    PREFIX = "repro/heartbeat/"

    def __init__(self, store: Any, rank: int, world_size: int, *, interval_s: float = 1.0) -> None:
        self.store, self.rank, self.world_size, self.interval_s = store, rank, world_size, interval_s
        self.progress_at, self.activity = time.time(), "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._post_forever, name="repro-heartbeat", daemon=True)

    @classmethod
    def of_default_group(cls, *, interval_s: float) -> "Heartbeats | None":
        """Heartbeats through the default group's store; None in a job of one or where torch hides the store."""
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return None
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):
            return None
        return cls(store, dist.get_rank(), dist.get_world_size(), interval_s=interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def progress(self, activity: str) -> None:
        self.progress_at, self.activity = time.time(), activity

    def _post_forever(self) -> None:
        while True:
            record = {"alive": time.time(), "progress": self.progress_at, "activity": self.activity}
            try:
                self.store.set(f"{self.PREFIX}{self.rank}", json.dumps(record))
            except Exception:  # noqa: BLE001 - the store's host ended or is stuck: nothing to post to
                pass
            if self._stop.wait(self.interval_s):
                return

    def read(self) -> dict[int, dict[str, Any]] | None:
        """Every rank's last record (ranks that never posted are absent); None when the store does not answer."""
        result: list[dict[int, dict[str, Any]]] = []

        def fetch() -> None:
            keys = [f"{self.PREFIX}{r}" for r in range(self.world_size)]
            try:
                present = keys if self.store.check(keys) else [k for k in keys if self.store.check([k])]
                values = self.store.multi_get(present) if present else []
            except Exception:  # noqa: BLE001 - the store's host ended (connection reset): it does not answer
                return
            result.append({int(k[len(self.PREFIX):]): json.loads(bytes(v)) for k, v in zip(present, values)})

        reader = threading.Thread(target=fetch, name="repro-heartbeat-read", daemon=True)
        reader.start()
        reader.join(READ_BOUND_S)
        return result[0] if result else None

    def suspects(self, activity: str) -> str:
        """Which ranks this rank seems to wait for, in words: those not heard from for a while (stopped or dead),
        else those busy with something other than ``activity``, else that every rank is in it."""
        records = self.read()
        if records is None:
            return "the rendezvous store does not answer (its host may be the stopped rank)"
        now, quiet_s = time.time(), 2 * self.interval_s + 1
        others = {r: rec for r, rec in records.items() if r != self.rank}
        never = [r for r in range(self.world_size) if r != self.rank and r not in others]
        silent = sorted((r for r, rec in others.items() if now - rec["alive"] > quiet_s),
                        key=lambda r: others[r]["alive"])
        if silent or never:
            named = [f"rank {r} (not heard from for {now - others[r]['alive']:.0f} s: stopped or dead?; "
                     f"last seen in '{others[r]['activity']}')" for r in silent[:4]]
            named += [f"rank {r} (never heard from)" for r in never[: max(0, 4 - len(named))]]
            more = len(silent) + len(never) - len(named)
            return "waiting for " + ", ".join(named) + (f" and {more} more" if more > 0 else "")
        elsewhere = sorted((r for r, rec in others.items() if rec["activity"] != activity),
                           key=lambda r: others[r]["progress"])
        if elsewhere:
            named = [f"rank {r} is in '{others[r]['activity']}' (no progress for {now - others[r]['progress']:.0f} s)"
                     for r in elsewhere[:4]]
            return "; ".join(named) + (f" and {len(elsewhere) - 4} more elsewhere" if len(elsewhere) > 4 else "")
        return f"every rank is in '{activity}'"


def note_hung(rank: int | str) -> None:
    """Tell ``python -m repro.dist.torchrun`` (through the file ``REPRO_HUNG_FILE`` names, when it names one) that
    this rank gave up on a hang: the wrapper then kills the ranks that are stopped (they cannot end by themselves,
    and torchrun's agent would wait its whole shutdown timeout for them) and exits 124."""
    path = os.environ.get(HUNG_FILE_VAR)
    if not path:
        return
    try:
        with open(path, "a") as handle:
            handle.write(json.dumps({"rank": int(rank), "exit_code": EXIT_HUNG}) + "\n")
    except (OSError, ValueError):
        pass  # the wrapper is gone, or the rank is not a number: nobody to tell


class Watchdog:
    """Exit the process with :data:`EXIT_HUNG` and one line naming the rank and its activity when :meth:`beat` has
    not been called for ``timeout_s`` seconds, or when a collective times out inside the ``with`` block.

    ``limit_name`` is how the line names the limit (``--watchdog-s``); ``group_timeout_s`` is the process groups'
    timeout, named when a collective ran past it. ``heartbeats`` (optional) names the ranks it waits for."""

    def __init__(
        self, timeout_s: float, *, name: str = "training loop", rank: int | None = None,
        limit_name: str = "the watchdog's limit", group_timeout_s: float | None = None,
        heartbeats: Heartbeats | None = None, slow_hint: str | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"watchdog timeout_s={timeout_s} must be positive")
        self.timeout_s, self.name, self.limit_name = timeout_s, name, limit_name
        self.rank = rank if rank is not None else os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        self.group_timeout_s, self.heartbeats = group_timeout_s, heartbeats
        #: said when no other rank is to blame (alone, or every rank in the same activity): the work may be slow
        self.slow_hint = slow_hint
        self.activity = name
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="repro-watchdog", daemon=True)
        self._exiting = threading.Lock()

    def beat(self, *_: object) -> None:
        """Progress in the current activity (a pipeline action, a file written or read, a batch evaluated)."""
        self._last = time.monotonic()
        if self.heartbeats is not None:
            self.heartbeats.progress(self.activity)

    def doing(self, activity: str) -> None:
        """Start ``activity`` (``"step 12"``, ``"saving checkpoint iteration 12: writing rank00001.pt"``): a beat
        that the line printed on a hang will name."""
        self.activity = activity
        self.beat()

    def exit_hung(self, why: str) -> None:
        """Print ``[watchdog] rank R: no progress for N s in 'ACTIVITY' (WHY); SUSPECTS; exiting with 124`` and
        leave at once (``os._exit``: interpreter shutdown may wait on the stuck peers)."""
        with self._exiting:  # the watchdog thread and a timed-out collective may both get here
            silent = time.monotonic() - self._last
            suspects = self.heartbeats.suspects(self.activity) if self.heartbeats is not None else ""
            if self.slow_hint and (not suspects or suspects.startswith("every rank is in")):
                suspects = "; ".join(part for part in (suspects, self.slow_hint) if part)
            print(f"[watchdog] rank {self.rank}: no progress for {silent:.0f} s in '{self.activity}' ({why})"
                  + (f"; {suspects}" if suspects else "") + f"; exiting with {EXIT_HUNG}",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            note_hung(self.rank)
            os._exit(EXIT_HUNG)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if time.monotonic() - self._last > self.timeout_s:
                self.exit_hung(f"> {self.limit_name} {self.timeout_s:g}")

    def __enter__(self) -> "Watchdog":
        self.beat()
        if self.heartbeats is not None:
            self.heartbeats.start()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and is_collective_timeout(exc):
            limit = f" after --timeout-s {self.group_timeout_s:g}" if self.group_timeout_s is not None else ""
            self.exit_hung(f"a collective timed out{limit}")
        self._stop.set()
        self._thread.join()
        if self.heartbeats is not None:
            self.heartbeats.stop()


def heartbeat_interval(timeout_s: float) -> float:
    """How often a rank posts its record: often enough that a rank stopped when the others start waiting is 'not
    heard from' (2 intervals + 1 s) well before they give up at ``timeout_s``; at most every 0.5 s."""
    return min(5.0, max(0.5, timeout_s / 5))

