"""Test-only failpoint: hold chosen devices' high-water marks back, from outside the process.

Why: "a PUBACK means committed" is the promise, and with replication the high-water mark moves
later than the local fsync (when the in-sync replicas have the record: issue 24). A broker that
acked or routed at its fsync instead of at the mark would pass every single-node test, because
there the two are the same instant. This failpoint separates them in a real ``meshmq serve``
process, as a lagging follower would: a test lists a device in a file, the mark of that device
stays where it is while its records keep becoming durable, and the test sees that nothing is
acked, answered (a peer's APPEND) or delivered until it removes the line.
(FoundationDB's BUGGIFY and FreeBSD's fail points are the precedent: a fault the code path must
survive, switched on only by a test.)

Switched on only by the environment variable ``MESHMQTEST_HWM_HOLD_FILE`` (not a ``MESHMQ_``
config key on purpose: no config file or operator setting can reach it). Its value is a path; the
file holds device keys, one a line. Every ``POLL_S`` the file is read again (when its size or
mtime changed): a listed device whose log exists gets ``LogStore.set_high_watermark(key, its
current mark)``, which freezes the mark; a device no longer listed (or the file removed) gets
``set_high_watermark(key, None)``, the single-node rule again (the mark jumps to the durable end
and wakes the acks waiting for it). A device with no log yet is held once its first record
exists (its first publish may already be visible: publish once and wait for its ack before
holding, as the tests do). Never set it in production: a held device never acks.
"""

from __future__ import annotations

import asyncio
import logging
import os

from commitlog.store import LogStore

log = logging.getLogger("meshmq.hwmhold")

ENV = "MESHMQTEST_HWM_HOLD_FILE"
POLL_S = 0.05


class HighWatermarkHold:
    """Polls the hold file and freezes or releases the listed devices' high-water marks."""

    def __init__(self, path: str, store: LogStore, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self.store = store
        self.loop = loop
        self.wanted: set[str] = set()
        self.held: set[str] = set()
        self._seen: tuple[int, int] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str], store: LogStore | None,
                 loop: asyncio.AbstractEventLoop) -> HighWatermarkHold | None:
        path = environ.get(ENV)
        if not path or store is None:
            return None
        log.warning("TEST-ONLY failpoint %s=%s is set: the high-water marks of the devices "
                    "listed in that file are held back, so their publishes are never "
                    "acknowledged or delivered while listed. Unset it: it exists for tests "
                    "only.", ENV, path)
        return cls(path, store, loop)

    def start(self) -> None:
        self._poll()

    def stop(self) -> None:
        """Release every held device (a node stopping settles what it holds)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.wanted = set()
        self._apply()

    def _poll(self) -> None:
        try:
            st = os.stat(self.path)
            seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen != self._seen:
            self._seen = seen
            wanted: set[str] = set()
            if seen is not None:
                try:
                    with open(self.path, encoding="utf-8") as f:
                        wanted = {line.strip() for line in f if line.strip()}
                except OSError as exc:
                    log.warning("failpoint %s: cannot read %s (%s)", ENV, self.path, exc)
                    wanted = self.wanted
            self.wanted = wanted
        self._apply()
        self._timer = self.loop.call_later(POLL_S, self._poll)

    def _apply(self) -> None:
        store = self.store
        for key in list(self.held - self.wanted):
            self.held.discard(key)
            store.set_high_watermark(key, None)
            log.warning("failpoint %s: high-water mark of %r released", ENV, key)
        for key in self.wanted - self.held:
            if key not in store:
                continue  # no log yet: held once its first record exists
            store.set_high_watermark(key, store.high_watermark(key))
            self.held.add(key)
            log.warning("failpoint %s: high-water mark of %r held at %d", ENV, key,
                        store.high_watermark(key))
