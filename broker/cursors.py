"""One cursor engine: where a session is in a device log, and the one reader of that log.

Two things read device logs into sessions: offset replay (``broker/replay.py``: a subscription
that asked for an offset) and catch-up (``broker/catchup.py``: a session that fell behind). Both
hold a ``LogCursor`` (the next offset, and whether it went live) and both read through one
``LogSource``, so the rules of reading a log are written once:

- **where the log is**: the router leading it, asked of the placement at every read (never kept
  from the subscribe: a leader moves); this router's store, or the leader over the mesh (the
  ``Forwarder.fetch`` the node wiring hands the router: ``broker/`` never imports ``cluster/``),
  one chunk at a time into the cursor's ``buffer``;
- **the seam with live delivery**: a read that finds nothing (the log end here, or an answer
  with no records from the leader) turns the cursor live at once; the leader routes to this
  router everything it stores after its answer, on the same link, after this router's routes
  (the link writes routes before requests), so a message is either below where the read ended
  (read) or routed after it (live), never neither. ``LogCursor.accept_live`` drops a duplicate;
- **offsets that are gone**: records a corrupt record took (the store quarantined them) are
  skipped and counted as dropped, reason ``corrupt``; a cursor outside the log (retention
  removed what it had to read) skips ahead, counted as ``expired``; never a stall;
- **reads of one leader out at once** are bounded (``FETCHES_PER_OWNER``: Kafka's
  max.in.flight.requests.per.connection); the rest wait in order for a slot;
- **one retry policy**: a failed remote read (leader unreachable, link down, no answer in
  time) is tried again after ``RETRY_S``, logged rate-limited, and counted in
  ``meshmq_log_read_retries_total``. A Kafka consumer does the same (``retry.backoff.ms``).

The reader (replay or catch-up) says what a cursor's session still wants (``Reader``) and
delivers what ``LogSource.take`` hands it, at the pace the window and socket allow.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.lograte import RateLimitedLog
from broker.stats import DropReason
from commitlog.store import OffsetOutOfRangeError

if TYPE_CHECKING:
    import asyncio

    from broker.message import Message
    from broker.stats import BrokerStats
    from commitlog.record import Record
    from commitlog.store import LogStore

log = logging.getLogger("broker.cursors")

RETRY_S = 1.0  # a failed read of another router's log is tried again after this
# Reads of one owner's logs out at once. A link to an owner coming back makes every session with
# a position there read back (broker/positions.py owner_back), one read per (session, device),
# all in the same turn; the owner answers at most 64 reads waiting on its link
# (cluster/mesh.py) and refuses the rest as busy, retried a second later all together again:
# rounds of refusals while those sessions wait (review3). The rest wait here, in order, and
# go out as answers come back (Kafka's max.in.flight.requests.per.connection, per owner).
FETCHES_PER_OWNER = 32


class LogCursor:
    """A session's place in one device log: read from ``next`` until the log end, then
    ``live`` (kept only to drop a duplicate at the seam). A replay cursor (on a subscription)
    and a lag cursor (``Session.lag``) are the same type, read the same way."""

    __slots__ = ("device", "next", "live", "owner_of", "pending_spec", "buffer", "reading",
                 "retrying", "high_watermark")

    def __init__(self, device: str, next_offset: int,
                 owner_of: Callable[[str], str | None] | None = None,
                 pending_spec: tuple[str, str] | None = None) -> None:
        self.device = device
        self.next = next_offset  # -1 until the owner resolved a subscription's start
        self.live = False
        self.owner_of = owner_of  # device -> leading router, None when this one
        self.pending_spec = pending_spec  # (spec, reset) the owner has not resolved yet
        self.buffer: deque[Record] = deque()  # fetched from the owner, not yet delivered
        self.reading = False  # a fetch is out (or waits for a slot): its answer reads again
        self.retrying = False  # a fetch failed: tried again after RETRY_S
        self.high_watermark = -1  # the owner's, at its last answer (for the lag gauge)

    @property
    def owner(self) -> str | None:
        """The router leading the log now (None: this one), asked at every read."""
        owner_of = self.owner_of
        return None if owner_of is None else owner_of(self.device)

    def accept_live(self, msg: Message) -> bool:
        """Whether a live (just stored) message goes to this cursor's subscription now."""
        if msg.device != self.device:
            return True
        if self.pending_spec is not None:
            return False  # routed before the owner resolved: below where this one starts
        if self.live and msg.offset >= self.next:
            self.next = msg.offset + 1
            return True
        return False  # already read, or the cursor will read it


class Session(Protocol):
    """The session a cursor belongs to, as this module sees it (``broker/session.Session``,
    which imports this module for ``LogCursor``: declared here so the imports go one way)."""

    client_id: str


class Reader(Protocol):
    """What ``LogSource`` needs of the engine a cursor belongs to (replay or catch-up)."""

    kind: str  # "replay" or "catch-up", in log lines
    chunk: int  # records asked of an owner per fetch

    def wants(self, session: Session, cursor: LogCursor) -> bool:
        """Whether ``cursor`` is still one ``session`` reads (not ended, replaced or live)."""

    def went_live(self, session: Session, cursor: LogCursor) -> None:
        """``cursor`` reached the log end at ``cursor.next``: live delivery takes over."""

    def resume(self, session: Session) -> None:
        """An answer (or a retry) came: read and deliver again, and write."""


class LogSource:
    """Reads device logs for cursors: this router's store, or the log's leader over the mesh."""

    def __init__(self, store: LogStore, stats: BrokerStats, loop: asyncio.AbstractEventLoop,
                 forwarder: Callable[[], Any]) -> None:
        self.store = store
        self.stats = stats
        self._loop = loop
        self._forwarder = forwarder  # () -> the Forwarder in a cluster, None on one node
        self._failed_log = RateLimitedLog(log, logging.WARNING,
                                          "reads of other routers' logs failed",
                                          burst=3, window=10.0)
        # owner -> reads out, and the ones waiting for a slot (bounded by the sessions'
        # cursors, each waiting at most once: it is marked reading)
        self._fetching: dict[str, int] = {}
        self._waiting: dict[str, deque[tuple[Session, LogCursor, Reader]]] = {}

    def owner_of(self, device: str) -> str | None:
        """The router leading ``device``'s log when it is another one (None on one node)."""
        fw = self._forwarder()
        return None if fw is None else fw.owner_of(device)

    def take(self, session: Session, c: LogCursor, chunk: int,
             reader: Reader) -> deque[Record] | None:
        """Records to deliver from ``c.next`` now (consumed from the left; what is left waits
        in the cursor's buffer), an empty deque when the cursor moved (ask again), or None:
        nothing now (it went live, or a read of the owner is out)."""
        if c.pending_spec is not None:
            return None  # the owner has not said where it starts
        if c.owner is not None:
            if c.buffer:
                return c.buffer
            self._fetch(session, c, reader)
            return None
        store = self.store
        try:
            records = store.read(c.device, c.next, chunk)
        except OffsetOutOfRangeError:
            start, end = store.log_range(c.device)
            self._outside(session, c, start, end, reader)
            return deque()
        if not records:
            # caught up (past a quarantined gap, if any): live delivery takes over
            self._live(session, c, store.past_gap(c.device, c.next), reader)
            return None
        return deque(records)

    def skip_lost(self, session: Session, c: LogCursor, to: int) -> None:
        """Move ``c`` over offsets a corrupt record took (the store quarantined them and logged
        them at ERROR): counted as dropped, reason ``corrupt``, never a stall."""
        if to > c.next:
            log.warning("a log read skips offsets lost to a corrupt record in the device log",
                        extra={"client_id": session.client_id, "device": c.device,
                               "from": c.next, "to": to})
            self.stats.dropped(DropReason.CORRUPT, to - c.next)
        c.next = to

    def lag(self, c: LogCursor) -> int:
        """Messages ``c`` is behind the log's visible end (another router's: at its last
        answer)."""
        if c.high_watermark >= 0:
            return max(0, c.high_watermark - c.next)
        start, end = self.store.log_range(c.device)
        return max(0, end - max(c.next, start))

    # -- internals ------------------------------------------------------------------------
    def _live(self, session: Session, c: LogCursor, at: int, reader: Reader) -> None:
        self.skip_lost(session, c, at)
        c.live = True
        c.buffer.clear()
        reader.went_live(session, c)

    def _outside(self, session: Session, c: LogCursor, start: int, end: int,
                 reader: Reader) -> None:
        """``c`` is outside the log: retention deleted what it had to read (or the log ends
        before it)."""
        to = start if c.next < start else end
        log.warning("%s cursor fell behind retention (or is past its log's end); skipping "
                    "ahead", reader.kind,
                    extra={"client_id": session.client_id, "device": c.device,
                           "from": c.next, "to": to})
        self.stats.dropped(DropReason.EXPIRED, max(0, start - c.next))
        c.next = to

    def _fetch(self, session: Session, c: LogCursor, reader: Reader) -> None:
        if c.reading or c.retrying:
            return  # an answer, or the failed read's retry, reads again
        c.reading = True
        owner = c.owner
        if self._fetching.get(owner, 0) >= FETCHES_PER_OWNER:
            self._waiting.setdefault(owner, deque()).append((session, c, reader))
            return
        self._send(session, c, owner, reader)

    def _send(self, session: Session, c: LogCursor, owner: str, reader: Reader) -> None:
        fw = self._forwarder()
        if fw is None:  # (the mesh went away: a node shutting down)
            c.reading = False
            return
        self._fetching[owner] = self._fetching.get(owner, 0) + 1
        asked = c.next
        fw.fetch(owner, c.device, asked, reader.chunk,
                 lambda result: self._answered(session, c, owner, asked, reader, result))

    def _slot_freed(self, owner: str) -> None:
        """A read of ``owner``'s logs was answered (or failed): its slot goes to the next
        waiting cursor still wanted (one whose session ended or moved on is let go)."""
        out = self._fetching.get(owner, 1) - 1
        waiting = self._waiting.get(owner)
        while waiting and out < FETCHES_PER_OWNER:
            session, c, reader = waiting.popleft()
            if not reader.wants(session, c):
                c.reading = False
                continue
            self._fetching[owner] = out
            self._send(session, c, owner, reader)
            out = self._fetching.get(owner, 0)  # (an answer that came at once freed it)
        if not waiting:
            self._waiting.pop(owner, None)
        if out > 0:
            self._fetching[owner] = out
        else:
            self._fetching.pop(owner, None)

    def _answered(self, session: Session, c: LogCursor, owner: str, asked: int,
                  reader: Reader, result: Any) -> None:
        self._slot_freed(owner)
        c.reading = False
        if not reader.wants(session, c):
            return  # the session ended, or moved on
        if c.owner != owner:
            # the log's leader moved while this read was out: what the former one answered
            # (its end, its records) is not the log's now; read again, from the new leader
            reader.resume(session)
            return
        if result.status == "ok":
            c.high_watermark = result.high_watermark
            if result.records and result.records[0].offset > c.next and asked != c.next:
                pass  # read from past where the cursor now is (it moved back): read again
            # (from where it asked, a later first record means the owner skipped offsets lost
            # to a corrupt record: delivered from there, the gap counted as dropped)
            elif result.records:
                c.buffer = deque(r for r in result.records if r.offset >= c.next)
            else:
                # the owner's end: what it stores from here is routed here live (after this
                # answer, on the same link), so live delivery takes over now, past offsets
                # the owner lost to a corrupt record at its end (counted as dropped)
                self._live(session, c, max(c.next, result.next_offset), reader)
        elif result.status == "out_of_range":
            self._outside(session, c, result.start, result.high_watermark, reader)
        else:
            self._failed(session, c, owner, reader, result.why)
            return
        reader.resume(session)

    def _failed(self, session: Session, c: LogCursor, owner: str, reader: Reader,
                why: str) -> None:
        """The one retry policy: a failed read of another router's log is counted, logged
        (rate-limited) and tried again after ``RETRY_S``, from where the cursor is then."""
        self.stats.log_read_retries += 1
        self._failed_log("%s read of %r from its owner router %s failed (retried in %.0f s): "
                         "%s", reader.kind, c.device, owner, RETRY_S, why,
                         extra={"client_id": session.client_id})
        c.retrying = True
        self._loop.call_later(RETRY_S, self._retry, session, c, reader)

    def _retry(self, session: Session, c: LogCursor, reader: Reader) -> None:
        c.retrying = False
        if reader.wants(session, c):
            reader.resume(session)
