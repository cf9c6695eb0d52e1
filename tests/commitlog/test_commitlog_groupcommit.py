"""GroupCommitter under asyncio: ordering, durability before callbacks, failure handling."""

from __future__ import annotations

import asyncio
import errno
import threading
import time

import pytest

from commitlog.groupcommit import GroupCommitter
from commitlog.settings import LogSettings
from commitlog.store import LogStore


class SlowSyncStore(LogStore):
    """Fault/latency injection: every fsync takes a while (a slow disk)."""

    delay_s = 0.02

    def sync(self) -> int:
        time.sleep(self.delay_s)
        return super().sync()


class FailingSyncStore(LogStore):
    """Fault injection: fsync fails with ENOSPC while ``failing`` is set."""

    failing = False

    def _fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._fsync(fd)


async def until_writable(gc: GroupCommitter, deadline_s: float = 60) -> None:
    """Wait (hang deadline, not a speed bound) for the committer's probe to accept writes."""
    end = time.monotonic() + deadline_s
    while gc.failure is not None:
        assert time.monotonic() < end, f"the log never became writable again: {gc.failure}"
        await asyncio.sleep(0.02)


def test_callbacks_in_order_after_durable(tmp_path):
    async def main():
        store = LogStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        seen: list[tuple[int, int]] = []
        sync_counts = []

        def cb_for(i: int, key: str, off: int):
            def cb(exc):
                assert exc is None
                # durable and visible when the callback runs
                assert store.high_watermark(key) > off
                assert store.read(key, off, 1)[0].payload == b"m%d" % i
                sync_counts.append(store.stats.fsyncs)
                seen.append((i, off))
            return cb

        n = 0
        for _tick in range(30):
            for _ in range(20):
                key = f"k{n % 7}"
                off = gc.append(key, n, "t", 1, None, b"m%d" % n)
                gc.when_durable(cb_for(n, key, off))
                n += 1
            await asyncio.sleep(0)
        await gc.wait_durable()
        assert [i for i, _ in seen] == list(range(n))
        assert store.stats.fsyncs <= 31  # at most one per tick, never one per record
        assert store.stats.batches <= 30
        await gc.close()

    asyncio.run(main())


def test_batches_grow_while_fsync_runs(tmp_path):
    async def main():
        store = SlowSyncStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        done = []
        for tick in range(50):
            for j in range(10):
                gc.append(f"k{j}", tick, "t", 1, None, b"x")
            gc.when_durable(done.append)
            await asyncio.sleep(0.002)
        await gc.wait_durable()
        assert done == [None] * 50
        # 50 ticks over ~100 ms with 20 ms fsyncs: far fewer fsyncs than batches
        assert store.stats.fsyncs < store.stats.batches / 2
        await gc.close()

    asyncio.run(main())


def test_interval_policy_acks_after_interval_fsync(tmp_path):
    async def main():
        store = LogStore.open(str(tmp_path), LogSettings(fsync=50))
        gc = GroupCommitter(store)
        gc.append("a", 1, "t", 1, None, b"x")
        # No further append comes: the interval timer alone must make it durable (a hang here,
        # not a speed bound, is the failure; timings belong in bench/).
        await asyncio.wait_for(gc.wait_durable(), timeout=30)
        assert store.read("a", 0)[0].payload == b"x"
        fsyncs = store.stats.fsyncs
        for _ in range(100):
            gc.append("a", 1, "t", 1, None, b"y")
            await asyncio.sleep(0)
        await gc.wait_durable()
        assert store.stats.fsyncs - fsyncs <= 2
        await gc.close()

    asyncio.run(main())


def test_failing_fsync_fails_callbacks_and_hides_records(tmp_path, caplog):
    async def main():
        store = FailingSyncStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        gc.append("a", 1, "t", 1, None, b"ok")
        await gc.wait_durable()
        store.failing = True
        results = []
        for i in range(5):
            gc.append("a", 2, "t", 1, None, b"lost%d" % i)
            gc.when_durable(results.append)
        with pytest.raises(OSError) as ei:
            await gc.wait_durable()
        assert ei.value.errno == errno.ENOSPC
        assert len(results) == 5 and all(isinstance(r, OSError) for r in results)
        assert store.log_range("a") == (0, 1)
        assert [r.payload for r in store.read("a", 0)] == [b"ok"]
        assert store.stats.fsync_errors >= 1
        # the disk has room again: appending resumes, offsets continue densely
        store.failing = False
        await until_writable(gc)
        assert gc.append("a", 3, "t", 1, None, b"after") == 1
        await gc.wait_durable()
        assert [r.payload for r in store.read("a", 0)] == [b"ok", b"after"]
        await gc.close()
        with LogStore.open(str(tmp_path)) as st2:
            assert [r.payload for r in st2.read("a", 0)] == [b"ok", b"after"]

    with caplog.at_level("ERROR", logger="meshmq.commitlog"):
        asyncio.run(main())
    assert any("refused, not acknowledged" in r.getMessage() for r in caplog.records)


class FailingWriteStore(LogStore):
    """Fault injection at the write: the disk is full for the next flush."""

    fail_next_write = False

    def _write_all(self, buf: bytearray) -> None:
        if self.fail_next_write:
            self.fail_next_write = False
            # a partial write reached the file before the error, as with a real ENOSPC
            super()._write_all(buf[: len(buf) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._write_all(buf)


def test_failing_write_truncates_partial_batch(tmp_path):
    async def main():
        store = FailingWriteStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        for i in range(3):
            gc.append("a", 1, "t", 1, None, b"ok%d" % i)
        await gc.wait_durable()
        store.fail_next_write = True
        for i in range(3):
            gc.append("a", 1, "t", 1, None, b"bad%d" % i)
        with pytest.raises(OSError):
            await gc.wait_durable()
        assert store.stats.write_errors == 1
        assert store.log_range("a") == (0, 3)
        await until_writable(gc)
        assert gc.append("a", 1, "t", 1, None, b"ok3") == 3
        await gc.wait_durable()
        await gc.close()
        with LogStore.open(str(tmp_path)) as st:
            assert st.stats.recovery_truncations == 0
            assert [r.payload for r in st.read("a", 0)] == [b"ok0", b"ok1", b"ok2", b"ok3"]

    asyncio.run(main())


def test_sync_from_thread_while_appending(tmp_path):
    """The store contract: sync() on another thread while the loop thread appends."""
    store = LogStore.open(str(tmp_path), LogSettings(segment_bytes=8192))
    stop = threading.Event()
    tokens: list[int] = []

    def syncer():
        while not stop.is_set():
            tokens.append(store.sync())

    th = threading.Thread(target=syncer)
    th.start()
    try:
        for i in range(3000):
            store.append(f"k{i % 5}", i, "t", 0, None, b"p" * 50)
            if i % 37 == 0:
                store.flush()
                store.commit(store._synced_pos)
    finally:
        stop.set()
        th.join()
    store.flush()
    store.commit(store.sync())
    assert tokens == sorted(tokens)
    for k in range(5):
        assert [r.offset for r in store.iter_records(f"k{k}")] == list(range(600))
    store.close()
    with LogStore.open(str(tmp_path)) as st:
        assert st.log_range("k4") == (0, 600)
