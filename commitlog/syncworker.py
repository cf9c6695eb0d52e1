"""The commit log's one worker thread: fsyncs, checkpoint writes and volume probes, in order.

Why not ``loop.run_in_executor`` on a 1-thread ``ThreadPoolExecutor`` (what the group
committer used until issue 25): every fsync batch then paid, on the event loop's thread, the
executor's ``submit`` (two locks, a ``concurrent.futures.Future``, a work item, the idle
semaphore), ``asyncio.wrap_future``'s chaining (a second future, its done-callbacks) and one
extra turn of the loop between the worker's result and the committer's callback (the result
is copied into the asyncio future by one ``call_soon_threadsafe``, whose ``set_result``
schedules the callback with another ``call_soon``). Under a logged QoS 1 load with one fsync
per ~15 messages that was ~4 % of the broker's CPU for bookkeeping around one syscall. Here a
job is a callable and a callback: one C ``SimpleQueue.put`` to submit, and the worker hands
``done(result, exc)`` straight to the loop with one ``call_soon_threadsafe`` (the same
wake-up the executor path needed). PostgreSQL's WAL writer and Kafka's log flusher are
likewise one dedicated thread fed a queue, not a pool.

Jobs run one at a time in submission order (an fsync never overlaps a checkpoint write, as
with the former single-thread executor). ``done`` always runs on the loop, never on the
worker; an exception of the job (``BaseException`` too: a failed fsync is never lost) is
passed to it as ``exc``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

JobDone = Callable[[Any, BaseException | None], object]

_STOP = None  # the sentinel that ends the thread's loop


class SyncWorker:
    """One thread running blocking jobs for one event loop (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], JobDone] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # started by the first job

    def submit(self, job: Callable[[], Any], done: JobDone) -> None:
        """Run ``job()`` on the worker; then ``done(result, None)`` or ``done(None, exc)`` on
        the loop. Call from the loop's thread."""
        if self._thread is None:
            # a daemon: a store left open by a crashed caller must not keep the process alive
            # (GroupCommitter.close stops and joins it)
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((job, done))

    def run(self, job: Callable[[], Any]) -> asyncio.Future[Any]:
        """``job()`` on the worker, as a future of the loop (for the rare, awaited jobs)."""
        fut: asyncio.Future[Any] = self._loop.create_future()

        def done(result: Any, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)

        self.submit(job, done)
        return fut

    async def stop(self) -> None:
        """Wait for every job submitted so far, then end the thread."""
        if self._thread is None:
            return
        await self.run(lambda: None)
        self._jobs.put(_STOP)
        thread, self._thread = self._thread, None
        thread.join()  # (idle since the job above: it ends at once)

    def _run(self) -> None:
        get = self._jobs.get
        loop = self._loop
        while True:
            item = get()
            if item is _STOP:
                return
            job, done = item
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, never dropped
                self._hand_back(loop, done, None, exc)
                continue
            self._hand_back(loop, done, result, None)

    @staticmethod
    def _hand_back(loop: asyncio.AbstractEventLoop, done: JobDone, result: Any,
                   exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(done, result, exc)
        except RuntimeError:
            # the loop is closed (a process ending without closing its log): nobody is left
            # to answer; what this job made durable was never acknowledged
            pass
