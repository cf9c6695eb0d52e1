"""``GroupCommitter.when_high_watermark``: the per-device acknowledgement (issue 26).

A callback per appended record, fired when the device's high-water mark passes it (on one
node: the durable end), batched per commit, and given the write's own error when the write
fails: never a success for what was not stored. Real stores on tmp_path; the failing
volume is the store's fsync seam (as in test_commitlog_groupcommit.py). Callbacks only
record what they saw (the store logs and swallows a callback's exception), the test
asserts afterwards.
"""

from __future__ import annotations

import asyncio
import errno
import threading
import time

from commitlog.groupcommit import GroupCommitter
from commitlog.store import LogStore

HANG_S = 60  # hang deadline, not a speed bound


class GatedSyncStore(LogStore):
    """The first fsync waits for ``release``, so the test appends more while a commit is on
    its way: the log end is ahead of the durable end when that commit wakes the waiters."""

    in_sync: threading.Event
    release: threading.Event

    def _fsync(self, fd: int) -> None:  # inside sync: the position it covers is taken
        self.in_sync.set()
        assert self.release.wait(HANG_S), "the test never released the fsync"
        super()._fsync(fd)


class FailingSyncStore(LogStore):
    """fsync fails with ENOSPC while ``failing`` is set (a full volume)."""

    failing = False

    def _fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._fsync(fd)


async def until(pred, what: str) -> None:
    end = time.monotonic() + HANG_S
    while not pred():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        await asyncio.sleep(0.01)


def test_waiters_fire_per_commit_once_their_record_is_committed(tmp_path, impl):
    async def main() -> None:
        store = GatedSyncStore.open(str(tmp_path))
        store.in_sync, store.release = threading.Event(), threading.Event()
        gc = GroupCommitter(store)
        seen: list[tuple[str, int, object, int, int, bytes | None]] = []

        def waiter(key: str, off: int):
            def cb(exc: BaseException | None) -> None:
                recs = store.read(key, off, 1) if off < store.high_watermark(key) else []
                seen.append((key, off, exc, store.high_watermark(key), store.stats.fsyncs,
                             recs[0].payload if recs else None))
            return cb

        n = 0

        async def tick() -> None:
            nonlocal n
            for _ in range(20):
                key = f"d{n % 5}"
                off = gc.append(key, n, "t", 1, None, b"m%d" % n)
                assert gc.when_high_watermark(key, off, waiter(key, off)) is not None
                n += 1
            await asyncio.sleep(0)  # the tick's flush (call_soon) writes them
            await asyncio.sleep(0)

        await tick()
        await until(store.in_sync.is_set, "the first fsync to start")
        for _ in range(3):  # written while that fsync runs: not durable when it commits
            await tick()
        assert all(store.log_end(f"d{k}") == 16 for k in range(5))
        assert not seen and store.high_watermark_waiters == n
        store.release.set()
        await until(lambda: len(seen) == n, "every waiter")
        for key, off, exc, hw, _fsyncs, payload in seen:
            assert exc is None, (key, off, exc)
            assert hw > off, f"{key}@{off} acknowledged at high-water mark {hw}"
            assert payload is not None, f"{key}@{off} acknowledged but not readable"
        for k in range(5):
            offs = [off for key, off, *_ in seen if key == f"d{k}"]
            assert offs == list(range(len(offs))), f"d{k} waiters out of order: {offs}"
        # Per commit, not per record: the callbacks share the fsyncs that covered them.
        counts = [c for *_, c, _p in seen]
        assert counts == sorted(counts) and counts[0] >= 1
        assert counts.count(1) == 20, "the first fsync's batch is the first tick's 20"
        assert store.stats.fsyncs <= 4, f"{store.stats.fsyncs} fsyncs for 4 ticks"
        assert store.high_watermark_waiters == 0
        # Already past: called at once, nothing registered.
        now: list[object] = []
        assert gc.when_high_watermark("d0", 0, now.append) is None and now == [None]
        await gc.close()

    asyncio.run(main())


def test_a_failed_write_gives_its_error_to_the_waiters_and_never_a_success(tmp_path):
    async def main() -> None:
        store = FailingSyncStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        for i in range(3):
            gc.append("d0", i, "t", 1, None, b"ok%d" % i)
        await gc.wait_durable()
        store.failing = True
        got: dict[tuple[str, int], object] = {}
        for i in range(10):
            key = f"d{i % 2}"
            off = gc.append(key, 10 + i, "t", 1, None, b"lost%d" % i)
            gc.when_high_watermark(key, off, lambda exc, k=(key, off): got.setdefault(k, exc))
        await until(lambda: len(got) == 10, "the waiters of the failed batch")
        assert all(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in got.values()), got
        assert (store.high_watermark("d0"), store.high_watermark("d1")) == (3, 0)
        assert store.log_end("d0") == 3 and store.high_watermark_waiters == 0

        # Registered after the rollback, for a record that is no longer in the log: it must
        # fail, not wait for whatever is appended at offset 3 next.
        late: list[object] = []
        gc.when_high_watermark("d0", 3, late.append)
        store.failing = False
        await until(lambda: gc.failure is None, "the volume to accept writes again")
        again: list[object] = []
        off = gc.append("d0", 99, "t", 1, None, b"new")
        assert off == 3  # the refused offset is assigned again, to another record
        gc.when_high_watermark("d0", off, again.append)
        await gc.wait_durable()
        await until(lambda: late and again, "both waiters")
        assert again == [None] and store.high_watermark("d0") == 4
        assert len(late) == 1 and isinstance(late[0], OSError), (
            f"a waiter for a rolled-back record got {late}")
        await gc.close()

    asyncio.run(main())
