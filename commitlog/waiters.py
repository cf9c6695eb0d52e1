"""Per-device commit waiters: "call me when device D's high-water mark reaches N".

Why: with replication a publish with acks=all may be acknowledged only once the record
is committed cluster-wide, i.e. once *its device's* high-water mark passes its offset
(Kafka's DelayedProduce purgatory keyed by partition). The group committer's
``when_durable`` is keyed by store position and means "durable here", which is the
single-node acknowledgement; this is the replicated one. Long-polling fetches use the
same waiters to wake when a device gets data.

Waiters are kept per key in a list sorted by target, so a high-water mark move costs one
comparison when nobody waits on that device, and the store checks the registry only when
it is non-empty. Callbacks run on the store's thread (the event loop), after the state
change that satisfied them, in target order; ``cb(None)`` on success, ``cb(exc)`` when the
record they waited for is gone (truncated by a leader change, or rolled back after a
failed write). Registration returns a handle so a timed-out long poll removes its waiters
(otherwise a device that never gets data would accumulate them).
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable

log = logging.getLogger("meshmq.commitlog")

WaiterCallback = Callable[[BaseException | None], object]


class HighWaterWaiters:
    """Registry of (key, target, callback); not thread-safe (the store's loop thread)."""

    __slots__ = ("by_key", "_seq", "count")

    def __init__(self) -> None:
        self.by_key: dict[str, list[tuple[int, int, WaiterCallback]]] = {}
        self._seq = itertools.count()
        self.count = 0

    def add(self, key: str, target: int, cb: WaiterCallback) -> tuple[str, int, int]:
        """Register ``cb`` for ``key`` reaching ``target``; returns a handle for cancel()."""
        item = (target, next(self._seq), cb)
        lst = self.by_key.get(key)
        if lst is None:
            lst = self.by_key[key] = []
        bisect.insort(lst, item, key=lambda t: (t[0], t[1]))
        self.count += 1
        return (key, target, item[1])

    def cancel(self, handle: tuple[str, int, int]) -> bool:
        """Remove a waiter that has not fired; False if it already fired or was cancelled."""
        key, target, seq = handle
        lst = self.by_key.get(key)
        if not lst:
            return False
        i = bisect.bisect_left(lst, (target, seq), key=lambda t: (t[0], t[1]))
        if i < len(lst) and lst[i][1] == seq:
            del lst[i]
            self.count -= 1
            if not lst:
                del self.by_key[key]
            return True
        return False

    def take_ready(self, key: str, hw: int) -> list[WaiterCallback]:
        """Remove and return the callbacks of ``key`` whose target is <= ``hw``."""
        lst = self.by_key.get(key)
        if not lst or lst[0][0] > hw:
            return []
        i = bisect.bisect_right(lst, hw, key=lambda t: t[0])
        ready = [t[2] for t in lst[:i]]
        del lst[:i]
        self.count -= i
        if not lst:
            del self.by_key[key]
        return ready

    def take_between(self, key: str, end: int, old_end: int) -> list[WaiterCallback]:
        """Remove and return the callbacks of ``key`` whose target is in ``(end, old_end]``:
        they waited for records that existed and are gone (the log now ends at ``end``).
        Waiters beyond ``old_end`` wait for records not written yet and stay."""
        lst = self.by_key.get(key)
        if not lst or lst[-1][0] <= end:
            return []
        i = bisect.bisect_right(lst, end, key=lambda t: t[0])
        k = bisect.bisect_right(lst, old_end, key=lambda t: t[0])
        gone = [t[2] for t in lst[i:k]]
        del lst[i:k]
        self.count -= len(gone)
        if not lst:
            del self.by_key[key]
        return gone

    def take_acks_after(self, key: str, end: int) -> list[WaiterCallback]:
        """Remove and return the callbacks of ``key`` whose target is past ``end``, but for
        ``Watch`` ones, which stay (in their places: the order of targets holds)."""
        lst = self.by_key.get(key)
        if not lst or lst[-1][0] <= end:
            return []
        i = bisect.bisect_right(lst, end, key=lambda t: t[0])
        gone = [t[2] for t in lst[i:] if type(t[2]) is not Watch]
        if gone:
            lst[i:] = [t for t in lst[i:] if type(t[2]) is Watch]
            self.count -= len(gone)
            if not lst:
                del self.by_key[key]
        return gone


class Watch:
    """A waiter that is no acknowledgement: a record routed once it is committed (one whose
    ack was refused, broker/ingest.py). A leader that refuses the acks its stuck mark holds
    (``LogStore.fail_high_watermark_waiters``) leaves it waiting, in its place; a truncation
    or a rolled-back write still fails it. (Failed and registered again each refusal, it was
    counted as a refused ack every 0.25 s for as long as the mark stayed stuck.)"""

    __slots__ = ("call",)

    def __init__(self, call: WaiterCallback) -> None:
        self.call = call

    def __call__(self, exc: BaseException | None) -> object:
        return self.call(exc)


def call_all(cbs: list[WaiterCallback], exc: BaseException | None) -> None:
    """Run callbacks; one raising is logged and does not stop the others."""
    for cb in cbs:
        try:
            cb(exc)
        except Exception:
            log.exception("commitlog: a high-water mark callback raised")
