"""A FUSE filesystem that forgets what was never fsynced: a power cut for tests.

Why: ``kill -9`` leaves the kernel page cache intact, so a broker that acknowledges before its
fsync (or never fsyncs) loses nothing in a kill test and looks durable. Jepsen's LazyFS
(used in the 2025 NATS JetStream analysis, which found acknowledged writes lost because data
was not synced) keeps unsynced writes in its own "page cache" and drops that cache on
command. This is the same idea, small enough to read in one sitting.

What is simulated (and what is not):

* **File data and size** (``write``, ``truncate``, ``fallocate``, ``O_TRUNC``): since its last
  ``fsync``/``fdatasync``, every file keeps a *dirty layer*: its durable size and an undo log of
  the durable bytes each unsynced write or truncate overwrote. The backing directory always
  holds the newest state (so reads are plain pass-through reads); ``fsync`` of the file forgets
  its dirty layer (the data is now "on disk"); a **power cut** rolls every dirty file back to
  its durable bytes and size. This is LazyFS's ``clear-cache`` fault.
* **Not simulated: directory entries.** ``create``, ``rename``, ``unlink``, ``mkdir`` take effect
  at once, as if every directory were fsynced right away (LazyFS does the same: it loses data,
  not metadata). A file created and never fsynced survives a cut with size 0; a rename of an
  unsynced file survives with the file's durable (possibly empty) content. Lost renames and
  lost new entries are a stricter model (ALICE, "All File Systems Are Not Created Equal",
  OSDI 2014) that this layer does not claim.

Run as a process: ``python tests/helpers/lazyfs.py BACKING MOUNTPOINT [FSYNC_DELAY_S]`` (the
delay makes every fsync take that long before it counts, like a slow disk). It prints ``ready``
on stdout once mounted and then reads commands, one per line, on stdin:

* ``cut``: power cut. Roll back every dirty file; from then on every operation fails with EIO
  (a machine without power writes nothing). Answers ``cut N`` (N files rolled back).
* ``cut torn=SEED``: the same, but each file keeps a random-length prefix (seeded) of the bytes
  it had appended past its durable size: a torn tail, as when the disk wrote back part of the
  cache before the power went (LazyFS's ``torn-seq`` fault, simplified).
* ``freeze``: from now on no fsync completes (each waits, then fails with EIO at the cut);
  writes still succeed. The last instant before a power cut: the disk takes writes into its
  cache but nothing more becomes durable. A process blocked in such an fsync cannot finish
  dying until the cut releases it.
* ``fail fsync EIO`` / ``fail write ENOSPC`` (any errno name): from now on every fsync (or
  write) fails with that error; the data stays unsynced. ``heal`` ends every such fault.
* ``stats``: answers ``stats fsyncs=N dirty=M`` (how many fsyncs it has seen; dirty files now).

``LazyFS`` (the class below this module's FUSE code) drives one from a test: ``mount()``,
``cut()``, ``unmount()``.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FUSERMOUNT = "fusermount3"


# --------------------------------------------------------------------------------------------
# The filesystem (runs in its own process; imports mfusepy only there)
# --------------------------------------------------------------------------------------------


@dataclass
class Dirty:
    """The unsynced state of one file (one backing inode)."""

    fd: int  # our own O_RDWR descriptor of the backing inode (survives renames and unlinks)
    durable_size: int
    undo: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, durable bytes)


def _make_fs(backing: str, fsync_delay: float) -> Any:
    import mfusepy as fuse  # the test extra pins it; only the FUSE process needs it

    class LazyPassthrough(fuse.Operations):
        """Loopback onto ``backing`` with a per-file dirty layer (see the module docstring)."""

        use_ns = True

        def __init__(self) -> None:
            self.root = os.path.realpath(backing)
            self._mutex = threading.RLock()
            self.dirty: dict[int, Dirty] = {}
            self.dead = False
            self.fsyncs = 0
            self.failing: dict[str, int] = {}  # "fsync"/"write" -> errno to answer
            self.thawed = threading.Event()  # cleared by "freeze": fsyncs wait for the cut
            self.thawed.set()

        # -- plumbing ------------------------------------------------------------------------
        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _track(self, fd: int) -> Dirty:
            """The dirty layer of the inode behind ``fd`` (started now if it is clean)."""
            st = os.fstat(fd)
            state = self.dirty.get(st.st_ino)
            if state is None:
                own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
                state = Dirty(own, st.st_size)
                self.dirty[st.st_ino] = state
            return state

        def _before_change(self, fd: int, start: int, end: int) -> None:
            """Save the bytes [start, end) about to change, where they are durable."""
            state = self._track(fd)
            end = min(end, state.durable_size)
            if start < end:
                state.undo.append((start, os.pread(state.fd, end - start, start)))

        def _synced(self, fd: int) -> None:
            self.fsyncs += 1
            state = self.dirty.pop(os.fstat(fd).st_ino, None)
            if state is not None:
                os.close(state.fd)

        def power_cut(self, torn_seed: int | None) -> int:
            rng = random.Random(torn_seed)
            with self._mutex:
                self.dead = True
                self.thawed.set()  # fsyncs held by a freeze now fail with EIO
                count = len(self.dirty)
                for state in self.dirty.values():
                    size = os.fstat(state.fd).st_size
                    for offset, data in reversed(state.undo):
                        os.pwrite(state.fd, data, offset)
                    keep = state.durable_size
                    if torn_seed is not None and size > keep:
                        # A torn tail: the disk wrote back part of the unsynced appends.
                        keep += rng.randrange(size - keep + 1)
                    os.ftruncate(state.fd, keep)
                    os.fsync(state.fd)
                    os.close(state.fd)
                self.dirty.clear()
                return count

        # -- metadata ------------------------------------------------------------------------
        def access(self, path: str, amode: int) -> int:
            if not os.access(self._full(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._full(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._full(path), uid, gid)
            return 0

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
            out = {key: getattr(st, key) for key in (
                "st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_ino")}
            for key in ("st_atime", "st_mtime", "st_ctime"):
                out[key] = getattr(st, key + "_ns")
            return out

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._full(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._full(path))

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._full(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._full(path))
            return 0

        def unlink(self, path: str) -> int:
            full = self._full(path)
            st = os.lstat(full)
            os.unlink(full)
            if st.st_nlink <= 1:
                state = self.dirty.pop(st.st_ino, None)
                if state is not None:
                    os.close(state.fd)
            return 0

        def rename(self, old: str, new: str) -> int:
            target = self._full(new)
            try:
                replaced = os.lstat(target)
            except FileNotFoundError:
                replaced = None
            os.rename(self._full(old), target)
            if replaced is not None and replaced.st_nlink <= 1:
                state = self.dirty.pop(replaced.st_ino, None)
                if state is not None:
                    os.close(state.fd)
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._full(target))
            return 0

        def link(self, target: str, source: str) -> int:
            os.link(self._full(source), self._full(target))
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            os.utime(self._full(path), ns=times)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._full(path))
            return {key: getattr(st, key) for key in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")}

        # -- file data -----------------------------------------------------------------------
        @staticmethod
        def _flags(flags: int) -> int:
            # The kernel hands us the offset of every write (it resolves O_APPEND itself);
            # an O_APPEND backing fd would make pwrite ignore that offset.
            return flags & ~(os.O_APPEND | os.O_CREAT | os.O_EXCL)

        def open(self, path: str, flags: int) -> int:
            fd = os.open(self._full(path), self._flags(flags) & ~os.O_TRUNC)
            if flags & os.O_TRUNC:
                self._before_change(fd, 0, os.fstat(fd).st_size)
                os.ftruncate(fd, 0)
            return fd

        def create(self, path: str, mode: int, flags: int) -> int:
            fd = os.open(self._full(path), (self._flags(flags) & ~os.O_TRUNC) | os.O_CREAT, mode)
            if flags & os.O_TRUNC:
                self._before_change(fd, 0, os.fstat(fd).st_size)
                os.ftruncate(fd, 0)
            return fd

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            if "write" in self.failing:
                raise fuse.FuseOSError(self.failing["write"])
            self._before_change(fh, offset, offset + len(data))
            return os.pwrite(fh, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            fd = fh if fh is not None else os.open(self._full(path), os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                if length < size:
                    self._before_change(fd, length, size)
                else:
                    self._track(fd)
                os.ftruncate(fd, length)
            finally:
                if fh is None:
                    os.close(fd)
            return 0

        def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
            self._track(fh)
            os.posix_fallocate(fh, offset, size)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0  # close() is not fsync: the dirty layer stays

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            if "fsync" in self.failing:
                # Like a disk error: the call fails and the data stays unsynced (dirty).
                raise fuse.FuseOSError(self.failing["fsync"])
            self._synced(fh)
            return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            self.fsyncs += 1  # directory entries are not simulated (module docstring)
            return 0

    def serialized(method: Any) -> Any:
        """Every operation runs under the filesystem's lock (the undo log and the cut must see
        one order of events); after a cut every operation but closing fails with EIO."""
        @functools.wraps(method)
        def run(self: LazyPassthrough, *args: Any) -> Any:
            if method.__name__ == "fsync":
                # A slow disk: the data becomes durable only at the end of the delay (a cut
                # meanwhile wins), so an ack sent before its fsync returned is caught reliably.
                if fsync_delay:
                    time.sleep(fsync_delay)
                self.thawed.wait()  # frozen: no fsync completes before the cut
            with self._mutex:
                if self.dead and method.__name__ not in ("destroy", "release", "flush"):
                    raise fuse.FuseOSError(errno.EIO)
                return method(self, *args)
        return run

    for name, value in list(vars(LazyPassthrough).items()):
        if callable(value) and not name.startswith("_") and name != "power_cut":
            setattr(LazyPassthrough, name, serialized(value))
    return fuse, LazyPassthrough()


def _serve(backing: str, mountpoint: str, fsync_delay: float) -> None:
    fuse, fs = _make_fs(backing, fsync_delay)

    def control() -> None:
        # Wait for the mount to appear, then say so and serve commands from stdin.
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            if time.monotonic() > deadline:
                os._exit(3)
            time.sleep(0.02)
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "cut" or command.startswith("cut torn="):
                seed = int(command[9:]) if command != "cut" else None
                print(f"cut {fs.power_cut(seed)}", flush=True)
            elif command.startswith("fail "):  # fail fsync|write ERRNO_NAME
                _, op, name = command.split()
                with fs._mutex:
                    fs.failing[op] = getattr(errno, name)
                print(f"failing {op} {name}", flush=True)
            elif command == "freeze":
                fs.thawed.clear()
                print("frozen", flush=True)
            elif command == "heal":
                with fs._mutex:
                    fs.failing.clear()
                print("healed", flush=True)
            elif command == "stats":
                with fs._mutex:
                    print(f"stats fsyncs={fs.fsyncs} dirty={len(fs.dirty)}", flush=True)
            elif command:
                print(f"error unknown command {command!r}", flush=True)

    threading.Thread(target=control, daemon=True).start()
    # Multithreaded (every operation takes fs._mutex); no kernel attribute/entry caching, so what
    # the broker sees after a cut and remount is exactly what the backing directory holds.
    fuse.FUSE(fs, mountpoint, foreground=True, nothreads=False, raw_fi=False,
              attr_timeout=0, entry_timeout=0, negative_timeout=0)


# --------------------------------------------------------------------------------------------
# The test side
# --------------------------------------------------------------------------------------------


def fuse_problem() -> str | None:
    """Why FUSE cannot be used here (None when it can)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (a container needs --device /dev/fuse)"
    if shutil.which(FUSERMOUNT) is None:
        return f"{FUSERMOUNT} is missing: install Debian's fuse3 package (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3 ({exc}): pip install -e '.[test]' and install fuse3"
    return None


class LazyFS:
    """One mount of the lazy filesystem, driven from a test (a subprocess stopped by its PID)."""

    def __init__(self, backing: Path, mountpoint: Path, *, fsync_delay_s: float = 0.0) -> None:
        self.fsync_delay_s = fsync_delay_s
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = self.backing.parent / f"{self.mountpoint.name}.lazyfs.log"

    def mount(self, timeout: float = 30.0) -> LazyFS:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(self.backing), str(self.mountpoint),
             str(self.fsync_delay_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
        )
        log.close()
        line = self._read_line(timeout)
        if line != "ready":
            self.unmount()
            raise AssertionError(f"lazyfs did not mount (said {line!r}); log:\n"
                                 f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return self

    def _read_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not result:
            raise AssertionError(f"lazyfs did not answer within {timeout}s")
        return result[0].strip()

    def command(self, text: str, timeout: float = 30.0) -> str:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self._read_line(timeout)

    def cut(self, torn_seed: int | None = None) -> int:
        """Power cut: every byte not fsynced is gone (with ``torn_seed``, a random prefix of
        each file's unsynced appends stays: a torn tail). Returns how many files were dirty."""
        answer = self.command("cut" if torn_seed is None else f"cut torn={torn_seed}")
        assert answer.startswith("cut "), f"lazyfs answered {answer!r} to cut"
        return int(answer.split()[1])

    def freeze(self) -> None:
        """No fsync completes from now until the cut (writes still do)."""
        answer = self.command("freeze")
        assert answer == "frozen", f"lazyfs answered {answer!r}"

    def fail(self, op: str, errno_name: str) -> None:
        """Make every ``op`` ("fsync" or "write") fail with ``errno_name`` until ``heal``."""
        answer = self.command(f"fail {op} {errno_name}")
        assert answer == f"failing {op} {errno_name}", f"lazyfs answered {answer!r}"

    def heal(self) -> None:
        answer = self.command("heal")
        assert answer == "healed", f"lazyfs answered {answer!r}"

    def stats(self) -> dict[str, int]:
        answer = self.command("stats")
        assert answer.startswith("stats "), f"lazyfs answered {answer!r} to stats"
        return {k: int(v) for k, v in (kv.split("=") for kv in answer.split()[1:])}

    def unmount(self) -> None:
        if self.proc is None:
            return
        # Always (a crashed filesystem process leaves a mount that answers ENOTCONN, which
        # os.path.ismount does not report as a mount); lazy, so a straggler cannot block it.
        subprocess.run([FUSERMOUNT, "-u", "-z", str(self.mountpoint)],
                       capture_output=True, timeout=30)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.proc = None


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
