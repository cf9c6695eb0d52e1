"""A resent APPEND is stored once, even when the owner restarted in between (issue 28).

Within one owner incarnation a resent APPEND is answered from memory (cluster/outcomes.py). A
restarted owner remembers nothing, and the publisher's router resends every APPEND still
unanswered (at most ``cluster.link_window``): one the old incarnation had stored before a kill -9
would be stored a second time. Kafka's idempotent producer solves the same problem by keeping
(producer id, epoch, sequence) with every batch and rebuilding its producer state from the log
tail on restart; meshmq does the same with less state:

* every record an owner appends for a peer carries one reserved header, ``:src``, naming where
  it came from: the first 8 bytes of the publisher router's incarnation (random per process
  start, so a restarted publisher's seqs starting again from 1 never match its old ones) and the
  APPEND's link seq (16 bytes a record, on the mesh path only; a single node never writes it);
* when this router adopts a publisher incarnation it has not heard from since it started (its
  own restart, or the peer's), the first ``link_window`` seqs it receives may be resends of
  APPENDs the old incarnation stored. For each, the device's recent tail (records written within
  ``RESEND_LOOKBACK_S`` before the previous run's last write to it, and since: however long this
  router was down; at most ``RESEND_SCAN_MAX``) is read once and the ``:src`` values of that
  publisher incarnation indexed: a match is answered "stored at offset N" instead of appended
  again. After the window, no read at all.

What it cannot see, and then stores again (at least once, as before): a record retention already
removed, one older than the lookback, one beyond the scan cap, or a tail that cannot be read
(logged). A record in the tail that is corrupt is read around by the store (commitlog/salvage.py):
if it was the one resent, the resend stores it again, which is what a reader of a lost record
needs anyway.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from typing import Any

from broker.devicelogs import H_SOURCE
from broker.lograte import RateLimitedLog

log = logging.getLogger("cluster.idempotence")

#: How far before the previous run's last write to a device a resent APPEND's first store may
#: lie (measured from there, not from this start, so downtime does not count): the publisher's
#: router keeps an unanswered APPEND queued past ``cluster.append_timeout`` (it refuses the
#: client, but the owner may still store it), so generously more than that.
RESEND_LOOKBACK_S = 60.0
#: Records read back per device (once per adopted publisher incarnation): what bounds the cost
#: of a restart on a device written very fast. One past it may be stored twice (logged).
RESEND_SCAN_MAX = 65536

_SRC = struct.Struct(">8sQ8s")


def owner_tag(owner: str) -> bytes:
    """8 bytes naming the router that appended a record for a peer (its id, stable across its
    restarts). Why: with replication a log holds records other leaders appended for the same
    publisher incarnation, under *their* links' seqs; a restarted leader checking resends must
    match only what it appended itself under this link's seqs (found by the chaos suite: a
    new publish whose link seq equalled one the previous leader's link had used was answered
    "stored at offset 28", never stored, and lost)."""
    return hashlib.blake2b(owner.encode(), digest_size=8).digest()


def source_value(incarnation: bytes, seq: int, owner: str = "") -> bytes:
    """The ``:src`` header value of a peer's APPEND: (publisher incarnation prefix, link seq,
    the appending router's tag)."""
    return _SRC.pack(incarnation[:8], seq, owner_tag(owner))


class ResendCheck:
    """Per link, the owner's side: which APPENDs of the peer's current incarnation may be
    resends of ones a previous incarnation of *this* router stored, and where they are."""

    __slots__ = ("window", "started_us", "_inc", "_first", "_found", "_scan_log", "found",
                 "scanned", "_owner")

    def __init__(self, window: int, started_us: int | None = None, owner: str = "") -> None:
        self.window = window
        self._owner = owner_tag(owner)  # this router: only what it appended can match
        self.started_us = time.time_ns() // 1000 if started_us is None else started_us
        self._inc = b""
        self._first = -1  # the first seq heard from this incarnation; -1: none yet
        self._found: dict[str, dict[bytes, int]] = {}  # device -> {:src value -> offset}
        self._scan_log = RateLimitedLog(log, logging.WARNING, "resend check incomplete",
                                        burst=1, window=10.0)
        self.found = 0  # resent APPENDs answered from the log (counted per link)
        self.scanned = 0  # device tails read

    def adopt(self, incarnation: bytes) -> None:
        """A peer incarnation this router has not processed anything of: check its first
        window of seqs against the log."""
        self._inc = incarnation[:8]
        self._first = -1
        self._found = {}

    def forget(self) -> None:
        """The peer restarted again: its new incarnation's seqs start from 1 and can be
        nothing a previous run of ours stored. ``stored_at`` never looks them up (it compares
        incarnations: looking them up as the adopted one's matched old records of the same
        seq, and a new publish was answered "stored" at an old offset and never stored, found
        by the chaos suite); here only the index's memory is let go."""
        self._first = -1
        self._found = {}

    def stored_at(self, store: Any, device: str, seq: int, incarnation: bytes) -> int | None:
        """The offset where this APPEND of ``incarnation`` is already stored, or None (append
        it). Only the adopted incarnation's first window of seqs is ever looked up."""
        if not self._inc or incarnation[:8] != self._inc:
            return None
        first = self._first
        if first < 0:
            self._first = first = seq
        if seq >= first + self.window:
            if self._found:
                self._found = {}  # past the window: nothing more to look up
            return None
        index = self._found.get(device)
        if index is None:
            index = self._found[device] = self._scan(store, device)
        return index.get(_SRC.pack(self._inc, seq, self._owner))

    def _last_before_start(self, store: Any, device: str, start: int) -> int:
        """When the previous run last wrote to ``device`` (this start if unknown): the
        lookback is measured back from there, not from our start, so the time this router was
        down (a reboot, a crash noticed after minutes) does not push what that run stored out
        of the lookback (review3: it then stored every resent APPEND a second time)."""
        first_new = store.offset_for_timestamp(device, self.started_us)
        if first_new > start:
            recs = store.read(device, first_new - 1, 1)
            if recs and recs[0].offset < first_new:
                return min(self.started_us, recs[0].timestamp_us)
        return self.started_us

    def _scan(self, store: Any, device: str) -> dict[bytes, int]:
        """``:src`` values of this publisher incarnation in the device's recent tail."""
        self.scanned += 1
        index: dict[bytes, int] = {}
        inc = self._inc
        try:
            # to the durable end, not the high-water mark: a resent APPEND's first copy is
            # usually above the mark (its answer was lost before the mark passed it), and a
            # restarted leader's mark is its checkpoint's, or none (chaos seed 4242: a leader
            # killed 0.3 s after storing stored 15 resends again). pubdedupe reads the same way
            start = store.log_range(device)[0]
            end = store.durable_end(device)
            if start >= end:
                return index
            back = int(RESEND_LOOKBACK_S * 1e6)
            since = self._last_before_start(store, device, start) - back
            off = max(start, store.offset_for_timestamp(device, since), end - RESEND_SCAN_MAX)
            capped = off == end - RESEND_SCAN_MAX and off > start
            while off < end:
                recs = store.read_durable(device, off, 4096, 1 << 24)
                if not recs:
                    break
                for rec in recs:
                    for name, value in rec.headers or ():
                        if name == H_SOURCE and bytes(value[:8]) == inc:
                            index[bytes(value)] = rec.offset
                off = recs[-1].offset + 1
        except Exception as err:  # noqa: BLE001 - an unreadable tail: store again (at least
            # once, as without this check), never refuse a write for a read
            self._scan_log("could not read the tail of device log %s to find resent publishes "
                           "(%r): any the previous run stored are stored again (duplicates in "
                           "the log; check the store: meshmq log verify)", device, err,
                           extra={"device": device})
            return index
        if capped:
            self._scan_log("device log %s had over %d records in the last %g s before this "
                           "router started: a resent publish older than that is stored again",
                           device, RESEND_SCAN_MAX, RESEND_LOOKBACK_S, extra={"device": device})
        return index
