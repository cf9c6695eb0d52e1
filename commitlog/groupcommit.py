"""GroupCommitter: drives a LogStore from asyncio with classic group commit.

One event-loop tick of publishes becomes one batch: appends only buffer, a single
``call_soon`` flush per tick writes them with one ``write``, and one fsync in a dedicated
worker thread (``commitlog/syncworker.py``) makes them durable. While that fsync runs, the
next ticks keep appending and writing; the next fsync covers all of them, so under load the batch
grows instead of the queue (fsync rate stays bounded, throughput rises).

Acks: ``when_durable(cb)`` runs ``cb(None)`` on the loop thread, in registration order,
once everything appended before the call is durable and visible to readers. If a write
or fsync fails (ENOSPC, EIO) nothing pending is marked durable: every waiting callback
gets ``cb(exc)`` (the broker refuses those publishes: MQTT 5 reason 0x80/0x97), the store
truncates back to its last durable byte, and appending resumes once the disk accepts
writes again. A publish is never acknowledged unless it is stored. The per-device form,
``when_high_watermark(key, offset, cb)``, fires when the device's high-water mark passes
the record (the durable end on one node; the replicated mark with replication) and gets
the same error when the write fails.

Failure handling (issue 11, item 1). Three rules, each from a way this went wrong before:

* **A waiter registered after its batch failed is failed too.** The broker registers one
  callback per tick; if that registration comes after the tick's flush (``call_soon``
  order) and the flush failed and rolled back, the durable position looks like it already
  covers the callback: it was acknowledged for records that were never stored. So callers
  that collect a batch register through :meth:`before_flush` (called right before each
  write, while the batch is still pending), and :meth:`when_durable` with nothing pending
  after a rollback that discarded records fails the callback instead of firing it.
* **After a failed write or fsync nothing since the last good fsync is trusted** (the
  PostgreSQL "fsyncgate" lesson, 2018: Linux may drop the dirty pages of a failed
  writeback and report success on the next fsync). The store truncates back to the
  committed position through a freshly opened descriptor and fsyncs that; the failed
  fsync is never retried and called good.
* **Back off, probe, resume by itself.** While failing, appends are refused at once (no
  write that can only fail again, no ERROR per batch); a timer probes the volume with a
  small write + fsync of a scratch file, with exponential backoff (``RETRY_MIN_S`` doubling
  to ``RETRY_MAX_S``, as Kafka's ``retry.backoff.ms``/``retry.backoff.max.ms`` do), and lets
  appends through again once it succeeds. :attr:`failure` is what ``/readyz`` reports.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from commitlog.record import Header
from commitlog.store import LogStore, LogWriteError
from commitlog.syncworker import SyncWorker

log = logging.getLogger("meshmq.commitlog")

DurableCallback = Callable[[BaseException | None], object]

#: First and longest wait before probing a failed volume again (seconds).
RETRY_MIN_S = 0.1
RETRY_MAX_S = 5.0
PROBE_NAME = ".write-probe"


class GroupCommitter:
    """Batching front of a LogStore for one event loop. Not thread-safe: call from the loop."""

    def __init__(self, store: LogStore, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.store = store
        self._loop = loop or asyncio.get_running_loop()
        # fsyncs, checkpoint writes and probes, one at a time (commitlog/syncworker.py)
        self._worker = SyncWorker(self._loop, "commitlog-fsync")
        self._interval_ms = store.settings.fsync_interval_ms
        # True from the append that schedules this tick's flush until that flush runs: while
        # it is (and ``failure`` is None), LogStore.append is all :meth:`append` would do, so a
        # caller on the hot path may append to the store itself (broker/devicelogs.py). Read
        # it; only this class sets it.
        self.flush_scheduled = False
        self._syncing = False
        self._unflushed: list[DurableCallback] = []
        self._waiting: deque[tuple[int, DurableCallback]] = deque()
        self._failure: BaseException | None = None
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._maint: asyncio.TimerHandle | None = None
        self._ckpt_running = False
        self._before_flush: list[Callable[[], object]] = []
        # Set by a rollback that discarded appended records, cleared by the next successful
        # write: a when_durable() with nothing pending in between covers refused records.
        self._refused: BaseException | None = None
        # Not None from a failure until a probe write succeeds: appends are refused.
        self.failure: BaseException | None = None
        self._retry_s = RETRY_MIN_S
        self._retry: asyncio.TimerHandle | None = None
        self._probing = False
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
        if self.failure is not None:
            exc = self.failure
            raise LogWriteError(getattr(exc, "errno", None) or errno.EIO,
                                f"commit log cannot write ({exc}); waiting for the volume "
                                f"under {self.store.directory} to accept writes again")
        off = self.store.append(key, timestamp_us, topic, attrs, headers, payload)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self._loop.call_soon(self._flush)
        return off

    def append_follower(self, key: str, data: bytes, leader_epoch: int | None = None) -> int:
        """Follower append (``LogStore.append_follower``: a leader's records at its offsets,
        verified, bytes unchanged) in this tick's batch: same write, same fsync, same
        ``when_durable`` acknowledgements as leader appends. Returns the new log end."""
        end = self.store.append_follower(key, data, leader_epoch)
        if self.store.pending() and not self.flush_scheduled:
            self.flush_scheduled = True
            self._loop.call_soon(self._flush)
        return end

    def start_epoch(self, key: str, epoch: int) -> bool:
        """``LogStore.start_epoch`` in this tick's batch (durable with it)."""
        started = self.store.start_epoch(key, epoch)
        if started and not self.flush_scheduled:
            self.flush_scheduled = True
            self._loop.call_soon(self._flush)
        return started

    def before_flush(self, hook: Callable[[], object]) -> None:
        """Call ``hook()`` right before every flush, while the batch is still pending: the
        place to register a batch's :meth:`when_durable` callback so that it is attached to
        exactly that write (and failed with it), whatever the ``call_soon`` order."""
        self._before_flush.append(hook)

    def request_flush(self) -> None:
        """Make sure a flush runs this tick even if nothing is appended yet: for a
        :meth:`before_flush` hook that appends what it gathered (state records coalesced
        per tick) when nothing else is written."""
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self._loop.call_soon(self._flush)

    def when_durable(self, callback: DurableCallback) -> None:
        """Call ``callback(None)`` once everything appended so far is durable, or
        ``callback(exc)`` if storing it failed. Callbacks run on the loop, in call order."""
        if self.store.pending() or self._unflushed:
            self._unflushed.append(callback)
            return
        if self._refused is not None:
            # What was appended before this call was discarded by a rollback (the write
            # failed before the callback was registered): never report it durable.
            exc = self._refused
            self._loop.call_soon(self._call, callback, exc)
            return
        token = self.store.flushed_position
        self._waiting.append((token, callback))
        if token <= self.store.committed_position:
            self._loop.call_soon(self._fire_ready)
        elif self._interval_ms is None:
            self._maybe_sync()

    def when_high_watermark(self, key: str, offset: int,
                            callback: DurableCallback) -> tuple[str, int, int] | None:
        """Call ``callback(None)`` once the high-water mark of ``key`` passes ``offset``
        (the record appended at ``offset`` is committed and readers see it), or
        ``callback(exc)`` if that record is not stored: its write or fsync failed (``exc``
        is that error: ENOSPC, EIO) or a leader change truncated it. Never a success for
        what was not stored.

        The per-device acknowledgement (Kafka's DelayedProduce, completed when the
        partition's high watermark passes the produce's last offset): on one node the
        high-water mark is the durable end, so it fires exactly when :meth:`when_durable`
        would; with replication the replica manager moves the mark
        (``LogStore.set_high_watermark``) and these fire then. Batched like the durable
        callbacks: the store wakes a device's waiters once per commit (one fsync batch),
        one bisect over that device's sorted waiters, not one check per message
        (``commitlog/waiters.py``, the same registry the fetch API's long polls use).

        Register right after the append, in the same tick (as the broker does): a record
        no longer in the log (``offset >= log_end``: rolled back before this call) fails
        at once rather than waiting for whatever is appended at that offset next. Runs
        ``callback`` now if the mark already passed; returns a handle for
        ``store.cancel_high_watermark_wait`` otherwise."""
        store = self.store
        if offset >= store.log_end(key):
            exc = self._refused or LogWriteError(
                errno.EIO, f"record {offset} of {key!r} is not in the log (its write failed "
                           "and was rolled back, or it was never appended)")
            self._loop.call_soon(self._call, callback, exc)
            return None
        return store.when_high_watermark(key, offset + 1, callback)

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
            for h in (self._timer, self._maint, self._retry):
                if h is not None:
                    h.cancel()
            await self._worker.stop()
            try:
                self.store.close()
            except OSError as exc:
                # A full disk must not turn a clean shutdown into a crash: everything acked
                # is already durable; only the checkpoint is missing (a longer rescan).
                log.error("commitlog %s: closing could not write the final checkpoint (%s); "
                          "the next start rescans from the previous one (nothing acknowledged "
                          "is lost)", self.store.directory, exc)

    # ------------------------------------------------------------------ machinery

    def _flush(self) -> None:
        self.flush_scheduled = False
        for hook in self._before_flush:
            try:
                hook()
            except Exception:
                log.exception("commitlog: a before-flush hook raised")
        if self._failure is not None:
            # rollback pending: these appends are failed with it
            if self.store.pending():
                self._refused = self._failure
            return
        had = self.store.pending()
        try:
            token = self.store.flush()
        except Exception as exc:  # noqa: BLE001 - any write failure fails the batch
            self._fail(exc)
            return
        if had:
            self._refused = None
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
        self._worker.submit(self.store.sync, self._on_sync_done)

    def _on_sync_done(self, token: int, exc: BaseException | None) -> None:
        self._syncing = False
        if exc is not None:
            self._fail(exc)
            return
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
            if self.failure is None:
                log.error(
                    "commitlog %s: storing failed (%s): the pending publishes are refused, "
                    "not acknowledged, and new ones are refused until the volume accepts "
                    "writes again. Free disk space under %s (or lower retention) or fix the "
                    "volume; the log resumes by itself, probing every %.1f-%.0f s.",
                    self.store.directory, exc, self.store.directory, RETRY_MIN_S,
                    RETRY_MAX_S)
            self.failure = exc
            self.store.stats.writable = 0
        if not self._syncing:
            self._rollback()
        # else: the running fsync finishes first (what it covers was written before the
        # failure and may still be acknowledged); _on_sync_done then rolls back the rest.

    def _rollback(self) -> None:
        exc = self._failure
        assert exc is not None
        st = self.store
        if st.pending() or self._waiting or self._unflushed or \
                st.flushed_position > st.committed_position:
            self._refused = exc
        st.rollback(exc)
        waiting = list(self._waiting)
        unflushed = self._unflushed
        self._waiting.clear()
        self._unflushed = []
        self._failure = None
        for _, cb in waiting:
            self._call(cb, exc)
        for cb in unflushed:
            self._call(cb, exc)
        self._schedule_probe()

    # ------------------------------------------------------------------ recovery from failure

    def _schedule_probe(self) -> None:
        if self._closed or self._retry is not None or self._probing:
            return
        delay = self._retry_s
        self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
        self._retry = self._loop.call_later(delay, self._probe)

    def _probe(self) -> None:
        """Is the volume writable again? The store first (a rollback that could not
        truncate is retried), then a small write + fsync of a scratch file on the worker."""
        self._retry = None
        if self._closed or self.failure is None:
            return
        if self.store.broken is not None:
            self.store.rollback()
            if self.store.broken is not None:
                self._schedule_probe()
                return
        self._probing = True
        self._worker.submit(partial(_probe_write, self.store.directory), self._on_probe_done)

    def _on_probe_done(self, _result: None, exc: BaseException | None) -> None:
        self._probing = False
        if self._closed:
            return
        if exc is not None:
            self._schedule_probe()
            return
        log.warning("commitlog %s: the volume accepts writes again (failed with: %s); "
                    "publishes are stored and acknowledged again", self.store.directory,
                    self.failure)
        self.failure = None
        self._retry_s = RETRY_MIN_S
        self.store.stats.writable = 1

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
                self._worker.submit(partial(self.store.write_checkpoint, data),
                                    self._on_ckpt_done)
        except Exception:
            log.exception("commitlog %s: maintenance failed", self.store.directory)
        self._maint = self._loop.call_later(
            self.store.settings.checkpoint_interval_s, self._on_maintenance)

    def _on_ckpt_done(self, _result: None, exc: BaseException | None) -> None:
        self._ckpt_running = False
        if exc is not None:
            log.error("commitlog %s: checkpoint write failed (%s); recovery will rescan more",
                      self.store.directory, exc)


def _probe_write(directory: str) -> None:
    """Write, fsync and remove a 4 KiB scratch file: the cheapest real proof that the
    volume takes writes again (free space alone says nothing about EIO or quotas)."""
    path = os.path.join(directory, PROBE_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = memoryview(b"\0" * 4096)
        while data:
            n = os.write(fd, data)
            data = data[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
