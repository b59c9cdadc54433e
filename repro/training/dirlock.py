"""A ``--save`` directory belongs to one running job: the lock that holds it for the run's life.

Two runs saving into one directory interleave their logs, and each ``iter_N`` ends up the last writer's: the other
run's checkpoints are gone without a word. Checking "is anyone here?" before starting is a read, then an act; two
runs started together both pass it. So the directory is *held*, by rank 0 of the job, from before the load until
the process ends, in the file ``DIR/repro-train.lock``:

* **a lease**: the file names its holder (host, pid and the process's start time, Slurm job id, when it took the
  lock) and when it last refreshed it; a thread rewrites it every :data:`REFRESH_S` seconds while the run lives.
  Any file system has this.
* **an advisory lock** (``flock``) on the same file (removed when the run ends, so the directory is left as it was), where the file system supports it (local disks; NFS maps it
  to its byte-range locks; Lustre with ``-o flock``; GPFS): the kernel drops it when the process dies, however it
  dies. Where ``flock`` is not supported the lease alone decides (and a second writer is caught by the re-read
  after :data:`SETTLE_S`).

A second run is refused (one line naming the holder, exit code 2) when either says the directory is held. A crashed
or killed run's lock does not block its resume: the lease is **stale** when its process is gone from this host (the
pid is not running, or runs another program: its start time differs; the host was rebooted), when it belongs to this
very Slurm job (a requeued job takes its own lock over; its earlier incarnation is gone by the time Slurm restarts
it), or when it has not been refreshed for :data:`STALE_AFTER_S` seconds (a holder on another host, whose process
cannot be looked up from here). The job rule comes first: a requeued job may land on the host of its previous
incarnation, and Slurm restarts a job only once all of its processes have ended; two runs that one job starts at
once on one directory are the job's own mistake, caught at the first save of the run whose lease was taken over. Every rank of one job shares the lock: rank 0 takes it, and the others learn the
outcome through the job's rendezvous (:func:`repro.training.failfast.agree_on_setup`).

What it cannot promise: on a file system where neither ``flock`` works across hosts nor a file's content is
coherent between them (some object stores, NFS with aggressive attribute caching), two runs on different hosts may
both believe they hold the directory; and a holder that stops refreshing (frozen for :data:`STALE_AFTER_S`, a
wrong clock) loses it. Before each save rank 0 re-reads the lease (:meth:`DirectoryLock.check`): a run whose lock
was taken over publishes nothing and stops with exit code 74.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from repro.training.failfast import UsageError

LOCK_NAME = "repro-train.lock"
#: seconds between two refreshes of the lease by a living holder
REFRESH_S = 30.0
#: seconds without a refresh after which a holder on another host (or in another pid namespace) is presumed gone
STALE_AFTER_S = 300.0
#: where ``flock`` does not work: seconds between writing the lease and reading it back to see who won
SETTLE_S = 0.5
#: attempts to read a lease that is being rewritten (an empty or cut-short file) before taking it as garbage
_READ_TRIES, _READ_PAUSE_S = 10, 0.05
#: attempts to open the lock file while a releasing holder removes it
_OPEN_TRIES = 5


class DirectoryHeld(UsageError):
    """The directory is held by another living run: one line naming the holder."""


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(4096).strip()
    except OSError:
        return ""


def boot_id() -> str:
    """This host's boot id (Linux): a pid from before a reboot names no process of today."""
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``): pids of another container cannot be looked up here."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot, /proc/PID/stat field 22), '' when it is gone: a
    pid reused by another program has another start time."""
    text = _read(f"/proc/{pid}/stat")
    try:
        return text.rsplit(")", 1)[1].split()[19]
    except IndexError:
        return ""


@dataclass(frozen=True)
class Holder:
    """Who holds a directory, as its lease says."""

    host: str
    pid: int
    start: str = ""
    boot: str = ""
    pidns: str = ""
    job_id: str = ""
    since: float = 0.0
    refreshed: float = 0.0
    token: str = ""

    @classmethod
    def me(cls, token: str = "") -> "Holder":
        now = time.time()
        return cls(host=socket.gethostname(), pid=os.getpid(), start=process_start(os.getpid()), boot=boot_id(),
                   pidns=pid_namespace(), job_id=os.environ.get("SLURM_JOB_ID", ""), since=now, refreshed=now,
                   token=token or secrets.token_hex(8))

    @classmethod
    def parse(cls, text: str) -> "Holder | None":
        """The holder a lease names, None for an empty or unreadable one."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                return None
            fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
            holder = cls(**fields)
        except (ValueError, TypeError):
            return None
        texts = (holder.host, holder.start, holder.boot, holder.pidns, holder.job_id, holder.token)
        times = (holder.since, holder.refreshed)
        if (not all(isinstance(text, str) for text in texts) or isinstance(holder.pid, bool)
                or not isinstance(holder.pid, int) or not 0 <= holder.pid < 2**31
                or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1e11 for t in times)):
            return None  # garbage: no holder is named by it
        return holder

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        job = f" (Slurm job {self.job_id})" if self.job_id else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(self.since)))
        return (f"pid {self.pid} on host {self.host}{job}, holding it since {since}, last refreshed "
                f"{max(0.0, now - float(self.refreshed)):.0f} s ago")


def stale_reason(holder: Holder, me: Holder, now: float) -> str | None:
    """Why ``holder``'s lease no longer holds for ``me`` (a sentence), or None when it still holds."""
    if holder.token and holder.token == me.token:
        return "it is this run's own"
    if me.job_id and holder.job_id == me.job_id:  # before the pid: Slurm restarts a job only once it has ended
        return f"it is this Slurm job's own ({me.job_id}), requeued"
    local = holder.host == me.host and (not holder.boot or holder.boot == me.boot)
    if holder.host == me.host and holder.boot and me.boot and holder.boot != me.boot:
        return "its host was restarted since"
    if local and holder.pidns == me.pidns:
        if holder.pid == me.pid and (not holder.start or holder.start == me.start):
            return None if holder.token else "it is this process"
        start = process_start(holder.pid) if holder.pid > 0 else ""
        alive = _pid_alive(holder.pid) and (not holder.start or not start or start == holder.start)
        if not alive:
            return f"its process {holder.pid} is gone from this host"
        return None  # a living process of another job on this host holds it, whatever its refresh time
    age = now - float(holder.refreshed)
    if age > STALE_AFTER_S:
        return f"it was last refreshed {age:.0f} s ago (over {STALE_AFTER_S:.0f} s)"
    return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _try_flock(fd: int) -> str:
    """'held' (ours now), 'busy' (another open file holds it) or 'unsupported' (this file system has no flock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "held"
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return "busy"
        return "unsupported"  # ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL: a file system without working locks


class DirectoryLock:
    """The lock on one directory, held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, directory: str | os.PathLike, *, option: str = "--save") -> None:
        self.directory, self.option = Path(directory), option
        self.path = self.directory / LOCK_NAME
        self.me = Holder.me()
        self.fd: int | None = None
        self.flock = "unsupported"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the lease ----------------------------------------------------------------------------------------------

    def _lease(self) -> tuple[Holder | None, str]:
        """(holder, raw text) of the lease; a lease being rewritten is read again until it parses (or gives up)."""
        text = ""
        for attempt in range(_READ_TRIES):
            try:
                text = os.pread(self.fd, 8192, 0).decode("utf-8", "replace") if self.fd is not None else ""
            except OSError:
                text = ""
            holder = Holder.parse(text) if text.strip() else None
            if holder is not None or not text.strip():
                return holder, text
            time.sleep(_READ_PAUSE_S)
        return None, text

    def _write(self, holder: Holder) -> None:
        data = (json.dumps(asdict(holder), indent=1) + "\n").encode()
        os.pwrite(self.fd, data, 0)  # over the old lease, then cut: a reader sees one or the other (or retries)
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)

    def refused(self, holder: Holder) -> DirectoryHeld:
        return DirectoryHeld(
            f"{self.option} {self.directory} is held by another run: {holder.describe()}; a checkpoint directory "
            f"belongs to one running job: wait for that run to end or save elsewhere (a crashed run's lock is "
            f"taken over once its process is gone from its host, by its own requeued Slurm job, or "
            f"{STALE_AFTER_S:.0f} s after its last refresh; the lock is {self.path})")

    # ---- taking and holding it ----------------------------------------------------------------------------------

    def acquire(self) -> "DirectoryLock":
        """Take the directory, or raise :class:`DirectoryHeld` naming its holder (nothing else is touched)."""
        for _ in range(_OPEN_TRIES):
            self._open()
            try:
                self._take()
                if self._still_the_file():
                    break
            except BaseException:
                self._close()
                raise
            self._close()  # the holder released (removed the file) while this run took it: take the new file
        else:
            raise UsageError(f"{self.option} {self.directory}: its lock file {self.path} was replaced {_OPEN_TRIES} "
                             "times while this run took it; is another program removing it?")
        self._thread = threading.Thread(target=self._refresh_forever, name="repro-dirlock", daemon=True)
        self._thread.start()
        return self

    def _open(self) -> None:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            why = "it is a symlink" if err.errno == errno.ELOOP else (err.strerror or str(err))
            raise UsageError(f"{self.option} {self.directory}: cannot open its lock file {self.path} ({why})") from None
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            self._close()
            raise UsageError(f"{self.option} {self.directory}: its lock file {self.path} is not a regular file")

    def _still_the_file(self) -> bool:
        """Whether the open file is still the one the path names (a releasing holder removes it)."""
        try:
            here, there = os.fstat(self.fd), os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def _take(self) -> None:
        """With the file open: its flock if free, then the lease, unless a living run holds either."""
        self.flock = _try_flock(self.fd)
        holder, _ = self._lease()
        now = time.time()
        if holder is not None and stale_reason(holder, self.me, now) is None:
            raise self.refused(holder)
        if self.flock == "busy" and holder is None:  # another run is between its flock and its first lease
            time.sleep(SETTLE_S)
            holder, _ = self._lease()
            if holder is None or stale_reason(holder, self.me, time.time()) is None:
                raise self.refused(holder or Holder(host="?", pid=0, since=now, refreshed=now))
        # a busy flock with a stale lease: a holder whose lock outlived it (a dead node's NFS lock, a forked child
        # that kept the descriptor); the lease rules say it is gone, so the lease is taken over
        self._write(self.me)
        if self.flock != "held":  # nothing serialises two takers: the one whose lease stays wins
            time.sleep(SETTLE_S)
            holder, _ = self._lease()
            if holder is not None and holder.token != self.me.token:
                raise self.refused(holder)

    def _refresh_forever(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                holder, _ = self._lease()
                if holder is not None and holder.token != self.me.token:
                    return  # taken over: check() says so before the next save
                self.me = Holder(**{**asdict(self.me), "refreshed": time.time()})
                self._write(self.me)
            except OSError:
                continue  # a file system hiccup: the next refresh tries again

    def check(self) -> str | None:
        """Why this run no longer holds its directory (another run's lease replaced its own), or None."""
        if self.fd is None:
            return None
        holder, _ = self._lease()
        if holder is not None and holder.token != self.me.token:
            return f"{self.option} {self.directory} was taken over by another run: {holder.describe()}"
        return None

    def _close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)  # drops the flock
            except OSError:
                pass
            self.fd = None

    def release(self) -> None:
        """Give the directory back: the lock file is removed (if its lease is still ours; the directory is left as
        it would be without the lock), then the flock dropped. A run that ends without this (killed) leaves its
        lease behind, which the next run finds stale."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.fd is not None:
            try:
                holder, _ = self._lease()
                if (holder is None or holder.token == self.me.token) and self._still_the_file():
                    os.ftruncate(self.fd, 0)  # a reader that opened it already sees it released
                    os.unlink(self.path)
            except OSError:
                pass
        self._close()

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold_directory(directory: str | os.PathLike, *, option: str = "--save") -> DirectoryLock:
    """Take ``directory`` (created when missing) for this process; :class:`DirectoryHeld` when another run holds
    it."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return DirectoryLock(directory, option=option).acquire()
