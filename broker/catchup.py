"""Delivery from the log for sessions that fall behind: a lag is an offset, never a copy.

A logged message is in its device log before anyone sees it, so a subscriber that cannot take it
now (window and queue full, or offline) does not need the broker to keep a copy: it needs to
remember *where it is* in that log. This is Kafka's consumer model applied to MQTT sessions, and
what the design this broker comes from asks for ("subscribers just hold an offset"); brokers that
queue copies (Mosquitto's max_queued_messages, EMQX's mqueue) must drop when the copy queue is
full, which a 2,000-message burst against a 32 + 1,000 window overflowed.

How it works, per session:
- Live delivery of logged QoS>0 messages is unchanged while the session keeps up: straight into
  the window, or into the bounded in-memory queue.
- When the queue is full (or the session is offline), the session *falls behind* on that device:
  it records a ``LagCursor`` at the message's offset and stops copying. From then on every live
  logged delivery to it is left to the log ("lag mode"), and the logged deliveries still in its
  queue are turned into cursors too, so its memory is a cursor per device, not a copy per message.
- ``pump`` reads each cursor's device log from its offset, at the pace the window and socket
  allow, and rebuilds what live routing would have sent this session from the session's own
  subscriptions (same merge as ``Router.route``: one copy, highest granted QoS, every
  subscription id, No Local, Retain As Published). Per-device order is log order.
- At the log end a cursor goes *live*: it keeps its next offset until the next live message of
  that device arrives, so a message routed after the read found it (or before) is delivered
  exactly once; then it is dropped. That is the replay cursor's seam (``devicelogs.ReplayCursor``).

Not covered (they keep the bounded queue and its policy, documented in config.example.toml):
unlogged topics (``log = false`` rules, ``$`` topics), shared subscriptions (a share is chosen
per message at routing time; a member that falls behind hands shares to other members instead),
retained messages sent on SUBSCRIBE, and sessions past ``mqtt.max_lagging_devices``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.auth import topic_matches
from broker.devicelogs import record_message
from broker.lograte import RateLimitedLog
from broker.message import Message
from broker.session import LagCursor
from broker.stats import DropReason
from commitlog.store import OffsetOutOfRangeError

if TYPE_CHECKING:
    from broker.message import Delivery
    from broker.session import Session
    from broker.stats import BrokerStats
    from commitlog.record import Record
    from commitlog.store import LogStore

log = logging.getLogger("broker.catchup")

_CHUNK = 256  # records read per device per step
_STEP = 5_000  # records examined per session per loop turn before yielding to other work
_RETRY_S = 1.0  # a failed read of another router's log is tried again after this
# Reads of one owner's logs out at once. A link to an owner coming back makes every session with
# a position there read back (broker/positions.py owner_back), one read per (session, device),
# all in the same turn; the owner answers at most 64 reads waiting on its link
# (cluster/mesh.py) and refuses the rest as busy, retried a second later all together again:
# rounds of refusals while those sessions wait (review3). The rest wait here, in order, and
# go out as answers come back (Kafka's max.in.flight.requests.per.connection, per owner).
_FETCHES_PER_OWNER = 32
CLOCK_SKEW_US = 1_000_000  # tolerated between routers' clocks (match_record)


# (session, msg, granted qos, retain flag, subscription ids, position) -> None
Deliver = Callable[["Session", Message, int, bool, "tuple[int, ...] | None", bool], None]


class LogCatchUp:
    """Falls sessions behind onto their device logs and feeds them back from there."""

    def __init__(self, store: LogStore, stats: BrokerStats, deliver: Deliver,
                 max_queued: tuple[int, int], max_devices: int, call_soon: Callable,
                 remote: Callable[[], Any] | None = None,
                 call_later: Callable | None = None) -> None:
        self.store = store
        # () -> (owner_of, fetch) in a cluster, None on one node: logs other routers own are
        # read from them (Forwarder.fetch), so a subscriber there lags instead of dropping
        self._remote = remote
        self._call_later = call_later
        self._failed_log = RateLimitedLog(log, logging.WARNING,
                                          "catch-up reads of other routers' logs failed",
                                          burst=3, window=10.0)
        self.stats = stats
        self._deliver = deliver
        # the queue's bounds (mqtt.max_queued_messages, mqtt.max_queued_bytes): full by
        # either, a session falls behind instead of dropping
        self._max_queued, self._max_queued_bytes = max_queued
        self._max_devices = max_devices
        self._call_soon = call_soon
        self.lagging: set[Session] = set()  # sessions with at least one cursor behind
        self._scheduled: set[Session] = set()
        self._limit_logged = 0.0
        # owner -> reads out, and the ones waiting for a slot (bounded by the sessions'
        # cursors, each waiting at most once: it is marked reading)
        self._fetching: dict[str, int] = {}
        self._waiting: dict[str, deque[tuple[Session, str, LagCursor, Callable]]] = {}

    # -- the router's hooks --------------------------------------------------------------
    def divert(self, session: Session, msg: Message, qos: int) -> bool:
        """Called for a live logged delivery (at ``qos``) to a session with cursors: True when
        the log (not this call) delivers it."""
        lag = session.lag
        c = lag.get(msg.device)
        if c is not None:
            if not c.live or msg.offset < c.next:
                return True  # behind: the cursor reads it; or already read at the seam
            del lag[msg.device]  # the first live message after the seam: live from here
        if session.lag_behind and qos:
            # lag mode: keep this device in log order. (QoS 0 on a device with no cursor goes
            # on live, or is not kept for an offline session, as without a lag.)
            return self.fall_behind(session, msg)
        return False

    def must_fall_behind(self, session: Session) -> bool:
        """A live logged QoS>0 delivery that would be queued: does it go to the log instead?
        (Not asked in lag mode: ``divert`` already tried, and only a full
        ``max_lagging_devices`` sends the delivery on to the queue.)"""
        queue = session.queue
        return not session.lag_behind and (
            session.conn is None or len(queue) >= self._max_queued
            or queue.nbytes >= self._max_queued_bytes)

    def fall_behind(self, session: Session, msg: Message) -> bool:
        """Record that ``session`` is behind on ``msg``'s device from ``msg``; False if the
        ``max_lagging_devices`` bound refuses it (the caller queues it under the queue's policy)."""
        lag = session.lag
        device = msg.device
        if device not in lag and len(lag) >= self._max_devices:
            self.stats.lag_limit_hits += 1
            now = time.monotonic()
            if now - self._limit_logged > 10:
                self._limit_logged = now
                log.warning("session behind on too many device logs (mqtt.max_lagging_devices="
                            "%d): further messages use the in-memory queue and its policy",
                            self._max_devices, extra={"client_id": session.client_id})
            return False
        first = not session.lag_behind
        self._behind(session, device, msg.offset)
        if first:
            self.lagging.add(session)
            # INFO for a connected subscriber too slow for its stream (an operator's concern);
            # DEBUG for an offline session, which every persistent session is now and then.
            log.log(logging.INFO if session.conn is not None else logging.DEBUG,
                    "session fell behind; delivering from the device logs",
                    extra={"client_id": session.client_id, "device": device,
                           "offset": msg.offset, "online": session.conn is not None})
            self._compact_queue(session)
        return True

    def pump(self, session: Session) -> None:
        """Feed the window from the cursors while the client can take more."""
        if not session.lag_behind:
            return
        conn = session.conn
        if conn is None or conn.closing:
            return
        lag = session.lag
        inflight = session.inflight
        window = session.window
        queue = session.queue
        remote = self._remote() if self._remote is not None else None
        budget = _STEP
        while budget > 0:
            moved = False
            for device, c in list(lag.items()):
                if c.live:
                    continue
                if queue or len(inflight) >= window or conn.congested:
                    return  # resumed by acks (_window_freed) or the socket draining (writable)
                owner = remote[0](device) if remote is not None else None
                if owner is not None:
                    records = c.buffer
                    if not records:
                        self._fetch(session, device, c, owner, remote[1])
                        continue  # its answer pumps again
                else:
                    try:
                        records = deque(self.store.read(
                            device, c.next, min(_CHUNK, max(16, window - len(inflight)))))
                    except OffsetOutOfRangeError:
                        start, end = self.store.log_range(device)
                        self._skip(session, device, c, start, end)
                        moved = True
                        continue
                    if not records:
                        self._caught_up(session, c, self.store.past_gap(device, c.next))
                        continue
                moved = True
                remote_rec = owner is not None
                while records:
                    rec = records.popleft()
                    budget -= 1
                    if rec.offset > c.next:  # offsets lost to a corrupt record (quarantined)
                        self.stats.dropped(DropReason.CORRUPT, rec.offset - c.next)
                    c.next = rec.offset + 1
                    self._deliver_record(session, rec, remote_rec)
                    if queue or len(inflight) >= window or conn.congested:
                        break
            if not session.lag_behind:
                self._all_caught_up(session)
                return
            if not moved:
                return
        if session not in self._scheduled:  # more to do: yield to other work first
            self._scheduled.add(session)
            self._call_soon(self._resume, session)

    def _caught_up(self, session: Session, c: LagCursor, at: int) -> None:
        """At the log end (past a quarantined gap, if any): live delivery takes over."""
        c.next = at
        c.live = True
        session.lag_behind -= 1

    def _all_caught_up(self, session: Session) -> None:
        if session in self.lagging:
            self.lagging.discard(session)
            log.info("session caught up with the device logs; live delivery again",
                     extra={"client_id": session.client_id})

    def _fetch(self, session: Session, device: str, c: LagCursor, owner: str,
               fetch: Callable) -> None:
        if c.reading or c.retrying:
            return
        c.reading = True
        if self._fetching.get(owner, 0) >= _FETCHES_PER_OWNER:
            self._waiting.setdefault(owner, deque()).append((session, device, c, fetch))
            return
        self._send_fetch(session, device, c, owner, fetch)

    def _send_fetch(self, session: Session, device: str, c: LagCursor, owner: str,
                    fetch: Callable) -> None:
        self._fetching[owner] = self._fetching.get(owner, 0) + 1
        asked = c.next
        fetch(owner, device, asked, _CHUNK,
              lambda result: self._fetched(session, device, c, owner, result, asked))

    def _fetch_done(self, owner: str) -> None:
        """A read of ``owner``'s logs was answered (or failed): its slot goes to the next
        waiting cursor still behind (one whose session ended or moved on is let go)."""
        out = self._fetching.get(owner, 1) - 1
        waiting = self._waiting.get(owner)
        while waiting and out < _FETCHES_PER_OWNER:
            session, device, c, fetch = waiting.popleft()
            if session.lag.get(device) is not c or c.live:
                c.reading = False
                continue
            self._fetching[owner] = out
            self._send_fetch(session, device, c, owner, fetch)
            out = self._fetching.get(owner, 0)  # (an answer that came at once freed it)
        if not waiting:
            self._waiting.pop(owner, None)
        if out > 0:
            self._fetching[owner] = out
        else:
            self._fetching.pop(owner, None)

    def _fetched(self, session: Session, device: str, c: LagCursor, owner: str,
                 result: Any, asked: int = -1) -> None:
        """A read of another router's log answered (see ``broker/replay.py`` for the seam: the
        same holds here, the owner routing live what it stores after its answer)."""
        self._fetch_done(owner)
        c.reading = False
        if session.lag.get(device) is not c or c.live:
            return  # the session ended, or moved on
        remote = self._remote() if self._remote is not None else None
        if remote is not None and remote[0](device) != owner:
            # the log's leader moved while this read was out: what the former one answered
            # is not the log's now; read again, from the new leader (as broker/replay.py)
            self.pump(session)
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
                self._caught_up(session, c, max(c.next, result.next_offset))
                if not session.lag_behind:
                    self._all_caught_up(session)
        elif result.status == "out_of_range":
            self._skip(session, device, c, result.start, result.high_watermark)
        else:
            self._failed_log("reading %r from its owner router %s failed (retried in %.0f s):"
                             " %s", device, owner, _RETRY_S, result.why,
                             extra={"client_id": session.client_id})
            c.retrying = True
            if self._call_later is not None:
                self._call_later(_RETRY_S, self._retry, session, c)
            return
        self.pump(session)

    def _retry(self, session: Session, c: LagCursor) -> None:
        c.retrying = False
        self.pump(session)

    def restore(self, session: Session, device: str, offset: int) -> None:
        """A restored session (broker/sessionstore.py) is behind on ``device`` from
        ``offset``: its queued logged messages come back as this position, not as copies."""
        self._behind(session, device, offset)
        self.lagging.add(session)

    def forget(self, session: Session) -> None:
        """The session ended: drop its cursors."""
        session.lag.clear()
        session.lag_behind = 0
        self.lagging.discard(session)

    def gauges(self) -> dict[str, int]:
        """meshmq_sessions_lagging and meshmq_lag_messages (computed at scrape time)."""
        total = sum(sum(self.lag_of(s).values()) for s in self.lagging)
        return {"sessions_lagging": len(self.lagging), "lag_messages": total}

    def lag_of(self, session: Session) -> dict[str, int]:
        """Messages behind the log end, per device the session is behind on (for a log
        another router owns: behind its end when it last answered)."""
        out = {}
        for device, c in session.lag.items():
            if not c.live:
                if c.high_watermark >= 0:
                    out[device] = max(0, c.high_watermark - c.next)
                    continue
                start, end = self.store.log_range(device)
                out[device] = max(0, end - max(c.next, start))
        return out

    # -- internals ------------------------------------------------------------------------
    def _resume(self, session: Session) -> None:
        self._scheduled.discard(session)
        self.pump(session)

    def _behind(self, session: Session, device: str, offset: int) -> None:
        c = session.lag.get(device)
        if c is None:
            session.lag[device] = LagCursor(offset)
            session.lag_behind += 1
        elif c.live:  # caught up earlier; behind again from here
            c.live = False
            c.next = offset
            c.buffer = None
            session.lag_behind += 1
        elif offset < c.next:
            c.next = offset
            c.buffer = None  # read from the old position: the next read starts here

    def _compact_queue(self, session: Session) -> None:
        """Turn queued live logged deliveries into cursors: the log holds them already."""
        queue = session.queue
        kept: list[Delivery] = []
        for d in queue:
            msg = d.msg
            if d.live and d.group is None and msg.device is not None:
                self._behind(session, msg.device, msg.offset)
            else:
                kept.append(d)
        if len(kept) != len(queue):
            queue.clear()
            queue.extend(kept)

    def _skip(self, session: Session, device: str, c: LagCursor, start: int, end: int) -> None:
        """The cursor is outside the log: retention deleted what it had to read."""
        lost = max(0, start - c.next)
        log.warning("a lagging session fell behind retention; skipping ahead",
                    extra={"client_id": session.client_id, "device": device,
                           "from": c.next, "to": start})
        self.stats.dropped(DropReason.EXPIRED, lost)
        c.next = start if start > c.next else end

    def _deliver_record(self, session: Session, rec: Record, remote: bool = False) -> None:
        """What ``Router.route`` would have sent this session for ``rec``, now. ``remote``:
        read from another router's log (a copy here, never a position; see match_record)."""
        got = match_record(session, rec, remote)
        if got is None:
            return
        msg, qos, rap, ids, position = got
        msg.remote = remote
        if msg.expiry_at is not None and msg.expired(time.monotonic()):
            self.stats.dropped(DropReason.EXPIRED)
            return
        self._deliver(session, msg, qos, rap and msg.retain, ids, position)


def match_record(session: Session, rec: Record, remote: bool = False
                 ) -> tuple[Message, int, bool, tuple[int, ...] | None, bool] | None:
    """The delivery ``Router.route`` would have made to ``session`` for a stored record: (the
    message, granted QoS, retain as published, subscription ids, log position wanted), or None
    when none of its subscriptions takes it (same merge: one copy, highest QoS, every id).

    A record stored by another router (``remote``) carries that router's clock, compared with
    a subscription's start on ours: the comparison allows ``CLOCK_SKEW_US``, so skew between
    routers can deliver a message a little older than a subscription, never lose a newer one."""
    topic = rec.topic
    ts = rec.timestamp_us + (CLOCK_SKEW_US if remote else 0)
    qos = -1
    rap = False
    ids: list[int] = []
    position = False
    origin: str | None = None
    msg: Message | None = None
    for sub in session.subscriptions.values():
        if sub.group is not None or sub.since_us > ts:
            continue  # shares are picked at routing time; a newer subscription never saw it
        replay = sub.replay
        if replay is not None and not replay.live:
            continue  # that subscription's own replay cursor reads this log
        if not topic_matches(sub.filter, topic):
            continue
        if sub.no_local:
            if msg is None:
                msg = record_message(rec, Message)
                origin = msg.origin
            if origin == session.client_id:
                continue
        if sub.qos > qos:
            qos = sub.qos
        rap = rap or sub.retain_as_published
        if sub.sub_id:
            ids.append(sub.sub_id)
        position = position or replay is not None
    if qos < 0:
        return None
    if msg is None:
        msg = record_message(rec, Message)
    return msg, qos, rap, tuple(ids) or None, position
