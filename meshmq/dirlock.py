"""One live process per data directory: ``<data_dir>/meshmq.lock``, held with ``flock``.

Why: two processes on one store corrupt it and answer clients as if each were the only one. It
happened with nothing more than a kill -9: a cluster node's supervisor died, its routers lived
on, and the node started again on the same config shared their MQTT ports through
``SO_REUSEPORT``, so two routers with one id served one store. The commit log's own ``LOCK``
(commitlog/store.py) covers only the log directory, only when the log is enabled, and says
neither which process holds it nor which key to change. This lock covers the whole data
directory of every meshmq process: a single node (``meshmq serve`` without ``[cluster]``), a
cluster node's supervisor (``<data_dir>``) and each of its routers (``<data_dir>/router-<r>``).

Why ``flock`` and not "the PID in the file is alive": the kernel releases an flock when its
holder dies however it dies, so a lock file left by a kill -9 never blocks a restart, and a
recycled PID never keeps one held (Kafka's ``.lock`` in each log dir and PostgreSQL's
``postmaster.pid`` made the opposite choice and need an operator to delete a stale file). The
PID, command line and start time written into the file are only information for the error
message and for an operator reading the file. The file is never deleted: unlinking a lock file
races with the next process opening it (two would then lock two different inodes).

The descriptor is close-on-exec, so a child process (a router started by the supervisor) does
not inherit the supervisor's lock and cannot keep it held after the supervisor is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sys
import time

from meshmq.preflight import StartupError

__all__ = ["LOCK_FILE", "DataDirInUse", "DataDirLock"]

LOCK_FILE = "meshmq.lock"

log = logging.getLogger("meshmq.dirlock")


class DataDirInUse(Exception):
    """The directory's lock is held by a live process; ``holder`` is what its file says."""

    def __init__(self, directory: str, holder: dict[str, object]) -> None:
        self.directory = directory
        self.holder = holder
        pid = holder.get("pid", "unknown")
        what = f"pid {pid}"
        if holder.get("argv"):
            what += f": {holder['argv']}"
        if holder.get("since"):
            what += f", since {holder['since']}"
        super().__init__(
            f"{directory} is in use by another meshmq process ({what}); two processes on one "
            f"store corrupt it. Stop that process first (kill -TERM {pid}; a process killed "
            f"with -9 releases the lock by itself), or point this one at another directory")


class DataDirLock:
    """An exclusive, non-blocking ``flock`` on ``<directory>/meshmq.lock`` while this object
    lives (``release()`` or process exit frees it)."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, LOCK_FILE)
        self._fd: int | None = None

    @classmethod
    def acquire(cls, directory: str) -> DataDirLock:
        """Take the lock or raise ``DataDirInUse``; ``StartupError`` (key node.data_dir) when
        the lock file cannot be opened at all (another user's, a read-only file system)."""
        lock = cls(directory)
        try:
            os.makedirs(lock.directory, exist_ok=True)
            fd = os.open(lock.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            # Typically a lock file left by a run as another user (root, by hand): an
            # operator's fix, so a StartupError (exit 2 naming the key), never a traceback
            # that systemd restarts into.
            raise StartupError("node.data_dir", f"cannot open the lock file {lock.path}: "
                               f"{exc.strerror or exc}; give this user (uid {os.geteuid()}) "
                               f"read-write access to it (chown), or point node.data_dir "
                               f"elsewhere") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(lock.directory, holder) from None
            raise
        lock._fd = fd
        info = {"pid": os.getpid(), "argv": " ".join(sys.argv)[:300],
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = (json.dumps(info) + "\n").encode()
        # Overwrite what a previous (dead) holder left: the lock is ours, the text informative.
        # Best effort: on a full disk (ENOSPC) or over a quota the lock is held all the same,
        # and a node that starts there reports the full disk through its commit log (refused
        # writes, /readyz); a traceback here would make systemd restart it into the same one.
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError as exc:
            log.warning("%s: locked, but the holder's PID could not be written into it (%s); "
                        "a second process on this directory is still refused, without naming "
                        "this one (pid %d). Free space on that filesystem", lock.path, exc,
                        os.getpid(), extra={"key": "node.data_dir"})
        return lock

    def release(self) -> None:
        """Free the lock (idempotent). The file stays: see the module docstring."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _read_holder(fd: int) -> dict[str, object]:
    """What the holder wrote, or ``{}`` (it may be between truncate and write)."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
