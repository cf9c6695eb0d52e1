"""GroupCommitter: drives a LogStore from asyncio with classic group commit.

One event-loop tick of publishes becomes one batch: appends only buffer, a single
``call_soon`` flush per tick writes them with one ``write``, and one fsync in a
dedicated 1-thread executor makes them durable. While that fsync runs, the next ticks
keep appending and writing; the next fsync covers all of them, so under load the batch
grows instead of the queue (fsync rate stays bounded, throughput rises).

Acks: ``when_durable(cb)`` runs ``cb(None)`` on the loop thread, in registration order,
once everything appended before the call is durable and visible to readers. If a write
or fsync fails (ENOSPC, EIO) nothing pending is marked durable: every waiting callback
gets ``cb(exc)`` (the broker refuses those publishes: MQTT 5 reason 0x80/0x97), the store
truncates back to its last durable byte, and appending resumes once the disk accepts
writes again. A publish is never acknowledged unless it is stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from commitlog.record import Header
from commitlog.store import LogStore

log = logging.getLogger("meshmq.commitlog")

DurableCallback = Callable[[BaseException | None], object]


class GroupCommitter:
    """Batching front of a LogStore for one event loop. Not thread-safe: call from the loop."""

    def __init__(self, store: LogStore, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.store = store
        self._loop = loop or asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commitlog-fsync")
        self._interval_ms = store.settings.fsync_interval_ms
        self._flush_scheduled = False
        self._syncing = False
        self._unflushed: list[DurableCallback] = []
        self._waiting: deque[tuple[int, DurableCallback]] = deque()
        self._failure: BaseException | None = None
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._maint: asyncio.TimerHandle | None = None
        self._ckpt_running = False
        if self._interval_ms is not None:
            self._timer = self._loop.call_later(self._interval_ms / 1000, self._on_timer)
        self._maint = self._loop.call_later(
            store.settings.checkpoint_interval_s, self._on_maintenance)

    # ------------------------------------------------------------------ API

    def append(
        self,
        key: str,
        timestamp_us: int,
        topic: str,
        attrs: int,
        headers: Sequence[Header] | None,
        payload: bytes,
    ) -> int:
        """Append (buffered) and make sure this tick's batch gets flushed; return the offset.

        Raises LogWriteError while the store is failing (the publish must be refused)."""
        off = self.store.append(key, timestamp_us, topic, attrs, headers, payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return off

    def append_follower(self, key: str, data: bytes, leader_epoch: int | None = None) -> int:
        """Follower append (``LogStore.append_follower``: a leader's records at its offsets,
        verified, bytes unchanged) in this tick's batch: same write, same fsync, same
        ``when_durable`` acknowledgements as leader appends. Returns the new log end."""
        end = self.store.append_follower(key, data, leader_epoch)
        if self.store.pending() and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return end

    def start_epoch(self, key: str, epoch: int) -> bool:
        """``LogStore.start_epoch`` in this tick's batch (durable with it)."""
        started = self.store.start_epoch(key, epoch)
        if started and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return started

    def when_durable(self, callback: DurableCallback) -> None:
        """Call ``callback(None)`` once everything appended so far is durable, or
        ``callback(exc)`` if storing it failed. Callbacks run on the loop, in call order."""
        if self.store.pending() or self._unflushed:
            self._unflushed.append(callback)
            return
        token = self.store.flushed_position
        self._waiting.append((token, callback))
        if token <= self.store.committed_position:
            self._loop.call_soon(self._fire_ready)
        elif self._interval_ms is None:
            self._maybe_sync()

    def wait_durable(self) -> asyncio.Future[None]:
        """A future resolved when everything appended so far is durable (raises on failure).
        For tests, tools and shutdown; the broker's hot path uses when_durable."""
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

        self.when_durable(done)
        return fut

    async def close(self) -> None:
        """Make everything durable, stop timers and the worker, close the store."""
        if self._closed:
            return
        try:
            if self.store.pending() or self._waiting or self._unflushed:
                await self.wait_durable()
        finally:
            self._closed = True
            for h in (self._timer, self._maint):
                if h is not None:
                    h.cancel()
            await self._loop.run_in_executor(self._executor, lambda: None)
            self._executor.shutdown(wait=True)
            self.store.close()

    # ------------------------------------------------------------------ machinery

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._failure is not None:
            return  # rollback pending: these appends are failed with it
        try:
            token = self.store.flush()
        except Exception as exc:  # noqa: BLE001 - any write failure fails the batch
            self._fail(exc)
            return
        if self._unflushed:
            for cb in self._unflushed:
                self._waiting.append((token, cb))
            self._unflushed = []
        if self._interval_ms is None:
            self._maybe_sync()

    def _maybe_sync(self) -> None:
        if self._syncing or self._failure is not None or self._closed and not self._waiting:
            return
        if self.store.flushed_position <= self.store.committed_position:
            return
        self._syncing = True
        fut = self._loop.run_in_executor(self._executor, self.store.sync)
        fut.add_done_callback(self._on_sync_done)

    def _on_sync_done(self, fut: asyncio.Future[int]) -> None:
        self._syncing = False
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self._fail(exc)
            return
        token = fut.result()
        self.store.commit(token)
        self._fire_ready()
        if self._failure is not None:
            self._rollback()
            return
        if self._interval_ms is None:
            self._maybe_sync()

    def _fire_ready(self) -> None:
        committed = self.store.committed_position
        waiting = self._waiting
        while waiting and waiting[0][0] <= committed:
            _, cb = waiting.popleft()
            self._call(cb, None)

    def _call(self, cb: DurableCallback, exc: BaseException | None) -> None:
        try:
            cb(exc)
        except Exception:
            log.exception("commitlog: a durability callback raised")

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            log.error(
                "commitlog %s: storing failed (%s): the pending publishes are refused, not "
                "acknowledged. Free disk space or fix the volume under %s; the log resumes "
                "by itself once writes succeed.", self.store.directory, exc,
                self.store.directory)
        if not self._syncing:
            self._rollback()
        # else: the running fsync finishes first (what it covers was written before the
        # failure and may still be acknowledged); _on_sync_done then rolls back the rest.

    def _rollback(self) -> None:
        exc = self._failure
        assert exc is not None
        self.store.rollback()
        waiting = list(self._waiting)
        unflushed = self._unflushed
        self._waiting.clear()
        self._unflushed = []
        self._failure = None
        for _, cb in waiting:
            self._call(cb, exc)
        for cb in unflushed:
            self._call(cb, exc)

    def _on_timer(self) -> None:
        """Interval fsync policy: one fsync per interval covers every write since the last."""
        if self._closed:
            return
        self._maybe_sync()
        assert self._interval_ms is not None
        self._timer = self._loop.call_later(self._interval_ms / 1000, self._on_timer)

    def _on_maintenance(self) -> None:
        """Periodic checkpoint (serialised on the loop, written on the worker) and retention."""
        if self._closed:
            return
        try:
            self.store.apply_retention(time.time_ns() // 1000)
            if not self._ckpt_running:
                data = self.store.snapshot_checkpoint()
                self._ckpt_running = True
                cf: Future[None] = self._executor.submit(self.store.write_checkpoint, data)
                cf.add_done_callback(self._on_ckpt_done)
        except Exception:
            log.exception("commitlog %s: maintenance failed", self.store.directory)
        self._maint = self._loop.call_later(
            self.store.settings.checkpoint_interval_s, self._on_maintenance)

    def _on_ckpt_done(self, cf: Future[None]) -> None:
        self._ckpt_running = False
        exc = cf.exception()
        if exc is not None:
            log.error("commitlog %s: checkpoint write failed (%s); recovery will rescan more",
                      self.store.directory, exc)
