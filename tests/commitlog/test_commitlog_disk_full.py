"""A full or failing disk never acknowledges what it did not store (issue 11, item 1).

Faults are injected at the OS boundary: ``os.write`` / ``os.fsync`` are wrapped so that, while
armed, calls on the store's segment files fail the way a full or broken volume fails (a short
write then ENOSPC; EIO from fsync). Everything else (the store, the committer, the files) is real.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time

import pytest

from commitlog.groupcommit import GroupCommitter
from commitlog.settings import LogSettings
from commitlog.store import LogStore, LogWriteError


class Volume:
    """Makes writes/fsyncs of files under ``directory`` fail while armed (a full or broken
    volume: segment files and the committer's probe file alike)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: str) -> None:
        self.write_errno: int | None = None
        self.fsync_errno: int | None = None
        self.fsync_once = False
        self.failed_writes = 0
        self.failed_fsyncs = 0
        real_write, real_fsync = os.write, os.fsync

        prefix = os.path.realpath(directory) + os.sep

        def is_segment(fd: int) -> bool:
            try:
                return os.readlink(f"/proc/self/fd/{fd}").startswith(prefix)
            except OSError:
                return False

        def write(fd: int, data) -> int:
            if self.write_errno is not None and is_segment(fd):
                self.failed_writes += 1
                mv = memoryview(data)
                if len(mv) > 1:  # a real full disk takes part of the batch first
                    real_write(fd, mv[: len(mv) // 2])
                raise OSError(self.write_errno, os.strerror(self.write_errno))
            return real_write(fd, data)

        def fsync(fd: int) -> None:
            if self.fsync_errno is not None and is_segment(fd):
                self.failed_fsyncs += 1
                err = self.fsync_errno
                if self.fsync_once:
                    self.fsync_errno = None  # the error is reported once, as Linux does
                raise OSError(err, os.strerror(err))
            real_fsync(fd)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "fsync", fsync)


async def until(pred, what: str, deadline_s: float = 60) -> None:
    """Hang deadline (not a speed bound)."""
    end = time.monotonic() + deadline_s
    while not pred():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        await asyncio.sleep(0.01)


def stored(path: str) -> dict[str, list[bytes]]:
    with LogStore.open(path) as st:
        return {k: [r.payload for r in st.read(k, st.log_range(k)[0], 100_000)]
                for k in st.keys()}


@pytest.mark.parametrize("fault", ["write-ENOSPC", "fsync-EIO"])
def test_failed_batch_is_never_acknowledged(tmp_path, monkeypatch, fault):
    """The broker registers its batch callback in a later call_soon than the committer's
    flush. The issue's bug: after the flush failed and rolled back, that late callback saw a
    durable position 'covering' it and was called with None (acknowledged, not stored)."""
    path = str(tmp_path)
    vol = Volume(monkeypatch, path)

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        store = LogStore.open(path, LogSettings(tail_cache_bytes_per_device=1 << 16))
        gc = GroupCommitter(store)
        for i in range(3):
            gc.append(f"d{i % 2}", i, "t", 1, None, b"ok%d" % i)
        await gc.wait_durable()
        hwm_before = {k: store.high_watermark(k) for k in store.keys()}
        if fault == "write-ENOSPC":
            vol.write_errno = errno.ENOSPC
        else:
            vol.fsync_errno = errno.EIO
        results: list[BaseException | None] = []
        seen_hwm: list[dict] = []
        refused_offsets = []
        for i in range(10):
            refused_offsets.append(gc.append(f"d{i % 2}", 10 + i, "t", 1, None, b"bad%d" % i))
        # registered the way DeviceLogs used to: after the committer's call_soon(_flush)
        loop.call_soon(lambda: gc.when_durable(results.append))
        gc.when_durable(results.append)  # and the classic way: before the flush
        await until(lambda: len(results) == 2, "both callbacks")
        seen_hwm.append({k: store.high_watermark(k) for k in store.keys()})
        assert all(isinstance(r, OSError) for r in results), results
        assert gc.failure is not None
        # No partial batch: file, index and tail cache are back at the durable position.
        assert seen_hwm[0] == hwm_before
        active = store.segments[-1]
        assert os.path.getsize(active.path) == active.size
        assert store.committed_position == store.flushed_position == active.end
        assert [r.payload for r in store.read("d0", 0)] == [b"ok0", b"ok2"]
        assert [r.payload for r in store.read("d1", 0)] == [b"ok1"]
        # While failing: appends are refused at once (no write that can only fail again).
        writes = vol.failed_writes
        with pytest.raises(LogWriteError):
            gc.append("d0", 99, "t", 1, None, b"refused")
        await asyncio.sleep(0.3)  # a few probe intervals: the probe keeps failing
        assert gc.failure is not None and store.stats.writable == 0
        if fault == "write-ENOSPC":
            assert vol.failed_writes >= writes  # probes only; no segment write attempted
        # The volume recovers: writes resume by themselves, offsets continue densely from
        # the durable end (no reader ever saw the refused offsets).
        vol.write_errno = vol.fsync_errno = None
        await until(lambda: gc.failure is None, "the probe to accept writes")
        assert store.stats.writable == 1
        off = gc.append("d0", 100, "t", 1, None, b"after")
        assert off == hwm_before["d0"]
        await gc.wait_durable()
        await gc.close()
        return hwm_before

    asyncio.run(main())
    assert stored(path) == {"d0": [b"ok0", b"ok2", b"after"], "d1": [b"ok1"]}
    assert not os.path.exists(os.path.join(path, ".write-probe"))


def test_fsync_failure_is_not_retried_into_success(tmp_path, monkeypatch):
    """fsyncgate: one failed fsync, then the disk 'works' again. The pages of the failed
    fsync may be gone; the batch must stay refused and must not come back after a restart."""
    path = str(tmp_path)
    vol = Volume(monkeypatch, path)

    async def main() -> list:
        store = LogStore.open(path)
        gc = GroupCommitter(store)
        gc.append("d", 1, "t", 1, None, b"ok")
        await gc.wait_durable()
        vol.fsync_errno = errno.EIO
        vol.fsync_once = True  # one failed fsync; the next one reports success
        results: list = []
        for i in range(5):
            gc.append("d", 2, "t", 1, None, b"lost%d" % i)
        gc.when_durable(results.append)
        await until(lambda: results, "the callback")
        assert vol.failed_fsyncs == 1
        assert isinstance(results[0], OSError) and results[0].errno == errno.EIO
        assert store.high_watermark("d") == 1
        await until(lambda: gc.failure is None, "the probe")
        await gc.close()
        return results

    asyncio.run(main())
    assert stored(path) == {"d": [b"ok"]}


def test_only_what_was_refused_is_refused(tmp_path, monkeypatch):
    """A batch already fsynced when a later write fails is still acknowledged; only the
    failed batch is refused (per-batch all-or-nothing, never a partial batch)."""
    path = str(tmp_path)
    vol = Volume(monkeypatch, path)

    async def main() -> None:
        store = LogStore.open(path)
        gc = GroupCommitter(store)
        acked: list = []
        refused: list = []
        for tick in range(20):
            if tick == 10:
                vol.write_errno = errno.ENOSPC
            try:
                for j in range(5):
                    gc.append(f"k{j}", tick, "t", 1, None, b"%d-%d" % (tick, j))
            except LogWriteError:
                refused.append(tick)
                await asyncio.sleep(0)
                continue
            gc.when_durable(lambda exc, t=tick: (acked if exc is None else refused).append(t))
            await asyncio.sleep(0)
        await until(lambda: len(acked) + len(refused) == 20, "every batch answered")
        assert acked == list(range(len(acked))) and 10 not in acked
        vol.write_errno = None
        await until(lambda: gc.failure is None, "the probe")
        await gc.close()
        got = stored(path)
        for j in range(5):
            assert got[f"k{j}"] == [b"%d-%d" % (t, j) for t in acked]

    asyncio.run(main())
