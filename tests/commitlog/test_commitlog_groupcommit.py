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
        # Each callback ran after an fsync had completed, the counts only grow, and the
        # callbacks of one tick shared their fsync (group commit: never one per callback).
        assert sync_counts[0] >= 1, "a callback ran before any fsync completed"
        assert sync_counts == sorted(sync_counts), sync_counts
        assert len(set(sync_counts)) <= 31, f"{len(set(sync_counts))} fsyncs for 30 ticks"
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


class GatedWriteStore(FailingWriteStore):
    """Fault injection at the OS seams: fsync waits for a gate (an fsync in flight for as long
    as the test wants), and the next write can fail with ENOSPC."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.in_fsync = threading.Event()

    def _fsync(self, fd: int) -> None:
        self.in_fsync.set()
        assert self.gate.wait(30), "test never opened the fsync gate"
        super()._fsync(fd)


@pytest.mark.timeout(60)
def test_write_failing_while_an_fsync_is_in_flight(tmp_path):
    """Batch A's fsync is running when batch B's write fails: A was written before the
    failure, so it completes and is acknowledged; B is refused, rolled back (never visible,
    never on disk); then appends resume at A's end."""
    async def main():
        store = GatedWriteStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        results_a: list = []
        results_b: list = []
        store.gate.clear()
        for i in range(3):
            gc.append("a", 1, "t", 1, None, b"A%d" % i)
        gc.when_durable(results_a.append)
        await asyncio.sleep(0)  # flush A, start its fsync (it blocks at the gate)
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, store.in_fsync.wait, 30)
        store.fail_next_write = True
        for i in range(3):
            gc.append("a", 1, "t", 1, None, b"B%d" % i)
        gc.when_durable(results_b.append)
        await asyncio.sleep(0.05)  # B's flush fails while A's fsync is still in flight
        assert results_a == [] and results_b == [], "a callback ran before A's fsync returned"
        store.gate.set()
        with pytest.raises(OSError):  # registered behind the failed batch: refused with it
            await gc.wait_durable()
        assert results_a == [None], results_a
        assert len(results_b) == 1 and isinstance(results_b[0], OSError), results_b
        assert results_b[0].errno == errno.ENOSPC
        assert store.log_range("a") == (0, 3)
        await until_writable(gc)  # writes resume once the probe finds the volume writable
        assert gc.append("a", 1, "t", 1, None, b"C") == 3
        await gc.wait_durable()
        await gc.close()
        with LogStore.open(str(tmp_path)) as st:
            assert [r.payload for r in st.read("a", 0)] == [b"A0", b"A1", b"A2", b"C"]
            assert st.stats.recovery_truncations == 0

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_raising_durability_callback_does_not_stop_the_others(tmp_path, caplog):
    """One callback raising (a bug in a caller) is logged; the callbacks after it in the same
    batch and later batches still run, in order, and the committer keeps committing."""
    async def main():
        store = LogStore.open(str(tmp_path))
        gc = GroupCommitter(store)
        seen: list = []

        def boom(exc):
            seen.append("boom")
            raise RuntimeError("caller bug")

        gc.append("a", 1, "t", 1, None, b"x")
        gc.when_durable(lambda exc: seen.append(("before", exc)))
        gc.when_durable(boom)
        gc.when_durable(lambda exc: seen.append(("after", exc)))
        await gc.wait_durable()
        gc.append("a", 2, "t", 1, None, b"y")
        gc.when_durable(lambda exc: seen.append(("next batch", exc)))
        await gc.wait_durable()
        assert seen == [("before", None), "boom", ("after", None), ("next batch", None)]
        assert store.log_range("a") == (0, 2)
        await gc.close()

    with caplog.at_level("ERROR", logger="meshmq.commitlog"):
        asyncio.run(main())
    assert any("durability callback raised" in r.getMessage() for r in caplog.records)
