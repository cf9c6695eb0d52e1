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
  it records a ``LogCursor`` at the message's offset and stops copying. From then on every live
  logged delivery to it is left to the log ("lag mode"), and the logged deliveries still in its
  queue are turned into cursors too, so its memory is a cursor per device, not a copy per message.
- ``pump`` reads each cursor's device log from its offset, at the pace the window and socket
  allow, and rebuilds what live routing would have sent this session from the session's own
  subscriptions (same merge as ``Router.route``: one copy, highest granted QoS, every
  subscription id, No Local, Retain As Published). Per-device order is log order.
- At the log end a cursor goes *live*: it keeps its next offset until the next live message of
  that device arrives, so a message routed after the read found it (or before) is delivered
  exactly once; then it is dropped. That is the replay cursor's seam (``cursors.LogCursor``).

Not covered (they keep the bounded queue and its policy, documented in config.example.toml):
unlogged topics (``log = false`` rules, ``$`` topics), shared subscriptions (a share is chosen
per message at routing time; a member that falls behind hands shares to other members instead),
retained messages sent on SUBSCRIBE, and sessions past ``mqtt.max_lagging_devices``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.auth import topic_matches
from broker.cursors import LogCursor
from broker.devicelogs import record_message
from broker.message import Message, new_message
from broker.stats import DropReason

if TYPE_CHECKING:
    from broker.cursors import LogSource
    from broker.message import Delivery
    from broker.session import Session
    from broker.stats import BrokerStats
    from commitlog.record import Record

log = logging.getLogger("broker.catchup")

_STEP = 5_000  # records examined per session per loop turn before yielding to other work
CLOCK_SKEW_US = 1_000_000  # tolerated between routers' clocks (match_record)


# ``DeliveryRoom.deliver``: (session, msg, granted qos, retain flag, subscription ids, group,
# position, live) -> None, called positionally (a keyword call, or a wrapper, cost more per
# record: issue 25's catch-up path)
Deliver = Callable[["Session", Message, int, bool, "tuple[int, ...] | None", None, bool, bool],
                   None]


class LogCatchUp:
    """Falls sessions behind onto their device logs and feeds them back from there (through
    the router's ``LogSource``, ``broker/cursors.py``: this router's store, or the log's
    leader over the mesh, with its one retry policy)."""

    kind = "catch-up"
    chunk = 256  # records read per device per step

    def __init__(self, source: LogSource, stats: BrokerStats, deliver: Deliver,
                 max_queued: tuple[int, int], max_devices: int, call_soon: Callable) -> None:
        self.source = source
        self.store = source.store
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
        # Set by the router: ``deliver(session, msg, 1, False, sub_ids, None, False, False)``
        # for each of a run of plain QoS 1 messages read from this router's log that the
        # session's window has room for, as (session, its connection, messages, sub_ids)
        # (broker/loggedrun.py)
        self.deliver_run: Callable[[Session, Any, list[Message], tuple[int, ...] | None],
                                   None] | None = None

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
        lag = session.lag  # (lag_behind: the session's own map already)
        # its own, not the shared empty one (broker/session.py NO_ENTRIES): the deliveries
        # below go into this dict, and a local bound to the shared one would stay empty
        inflight = session.own_inflight()
        window = session.window
        source = self.source
        deliver = self._deliver
        deliver_run = self.deliver_run
        stats = self.stats
        # The session's subscriptions cannot change while this runs (nothing in it awaits),
        # so which of them take a topic is the same for every record no subscription is
        # newer than: matched once per topic (a device's records carry a handful), unless a
        # No Local subscription makes the answer depend on each record's publisher.
        subs = session.subscriptions.values()
        newest = max([sub.since_us for sub in subs], default=0)
        memo: dict[str, tuple | bool] | None = (
            None if any([sub.no_local for sub in subs]) else {})
        budget = _STEP
        while budget > 0:
            moved = False
            for c in list(lag.values()):
                if c.live:
                    continue
                # (session.queue read each time: the first delivery queued makes the session
                # its own queue, broker/session.py NO_QUEUE)
                if session.queue or len(inflight) >= window or conn.congested:
                    return  # resumed by acks (_window_freed) or the socket draining (writable)
                chunk = min(self.chunk, max(16, window - len(inflight)))
                records = source.take(session, c, chunk, self)
                if records is None:
                    continue  # caught up, or a read of the owner is out (its answer pumps)
                moved = True
                remote = c.owner is not None
                skew = CLOCK_SKEW_US if remote else 0
                # Plain QoS 1 records (no header, not retained) of one plan, this router's
                # log: collected and handed to the window as one (``deliver_run``, one
                # write), up to the room the window has; the rest one by one as below
                room = 0 if remote or deliver_run is None else window - len(inflight)
                run: list[Message] = []
                run_plan: tuple | None = None
                while records:
                    rec = records.popleft()
                    budget -= 1
                    if rec.offset > c.next:  # offsets lost to a corrupt record (quarantined)
                        stats.dropped(DropReason.CORRUPT, rec.offset - c.next)
                    c.next = rec.offset + 1
                    # what Router.route would have sent this session for rec (inline: a call
                    # per record less, as for the deliver call below)
                    if memo is not None and rec.timestamp_us + skew >= newest:
                        plan = memo.get(rec.topic)
                        if plan is None:
                            got = match_record(session, rec, remote)
                            memo[rec.topic] = False if got is None else got
                        elif plan is False:
                            got = None
                        elif room and rec.attrs == 1 and not rec.headers and plan[1] \
                                and not plan[4]:
                            if plan is not run_plan:
                                if run:
                                    deliver_run(session, conn, run, run_plan[3])
                                    run = []
                                run_plan = plan
                            msg = new_message(rec.topic, bytes(rec.payload), 1, False, None,
                                              None, None)
                            msg.device = rec.key
                            msg.offset = rec.offset
                            run.append(msg)
                            room -= 1
                            if not room:
                                break  # the window is full
                            continue
                        else:
                            got = (record_message(rec, new_message), *plan[1:])
                    else:
                        got = match_record(session, rec, remote)
                    if run:  # before this record: log order
                        deliver_run(session, conn, run, run_plan[3])
                        run = []
                    if got is not None:
                        msg = got[0]
                        if msg.expiry_at is not None and msg.expired(time.monotonic()):
                            stats.dropped(DropReason.EXPIRED)
                        else:
                            # remote: read from another router's log (a copy here, never a
                            # position; see match_record)
                            msg.remote = remote
                            deliver(session, msg, got[1], got[2] and msg.retain, got[3], None,
                                    got[4], False)
                    if session.queue or len(inflight) >= window or conn.congested:
                        break
                    if room:
                        room = window - len(inflight)
                if run:
                    deliver_run(session, conn, run, run_plan[3])
            if not session.lag_behind:
                self._all_caught_up(session)
                return
            if not moved:
                return
        if session not in self._scheduled:  # more to do: yield to other work first
            self._scheduled.add(session)
            self._call_soon(self._resume, session)

    # -- what broker/cursors.py's LogSource asks (its Reader) -----------------------------------
    def wants(self, session: Session, c: LogCursor) -> bool:
        return session.lag.get(c.device) is c and not c.live

    def went_live(self, session: Session, c: LogCursor) -> None:
        """At the log end (past a quarantined gap, if any): live delivery takes over."""
        session.lag_behind -= 1
        if not session.lag_behind:
            self._all_caught_up(session)

    def resume(self, session: Session) -> None:
        self.pump(session)

    def _all_caught_up(self, session: Session) -> None:
        if session in self.lagging:
            self.lagging.discard(session)
            log.info("session caught up with the device logs; live delivery again",
                     extra={"client_id": session.client_id})

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
        source = self.source
        return {device: source.lag(c) for device, c in session.lag.items() if not c.live}

    # -- internals ------------------------------------------------------------------------
    def _resume(self, session: Session) -> None:
        self._scheduled.discard(session)
        self.pump(session)

    def _behind(self, session: Session, device: str, offset: int) -> None:
        c = session.lag.get(device)
        if c is None:
            session.own_lag()[device] = LogCursor(device, offset, self.source.owner_of)
            session.lag_behind += 1
        elif c.live:  # caught up earlier; behind again from here
            c.live = False
            c.next = offset
            c.buffer.clear()
            session.lag_behind += 1
        elif offset < c.next:
            c.next = offset
            c.buffer.clear()  # read from the old position: the next read starts here

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
        if len(kept) != len(queue):  # (a queue that held something is the session's own)
            queue.clear()
            queue.extend(kept)


# A lagging session matches every record it reads against its filters, and a device's records
# carry a handful of topics: the answer per (filter, topic) is cached (C lru_cache: one hash
# of two strs instead of two splits and a Python loop, ~1 us, per record; issue 25). Bounded
# in entries, and only topics up to _CACHED_TOPIC_LEN characters are kept, so a client's
# 64 KiB topics cannot make the cache large.
_CACHED_TOPIC_LEN = 256
_cached_matches = functools.lru_cache(maxsize=4096)(topic_matches)


def match_record(session: Session, rec: Record, remote: bool = False
                 ) -> tuple[Message, int, bool, tuple[int, ...] | None, bool] | None:
    """The delivery ``Router.route`` would have made to ``session`` for a stored record: (the
    message, granted QoS, retain as published, subscription ids, log position wanted), or None
    when none of its subscriptions takes it (same merge: one copy, highest QoS, every id).

    A record stored by another router (``remote``) carries that router's clock, compared with
    a subscription's start on ours: the comparison allows ``CLOCK_SKEW_US``, so skew between
    routers can deliver a message a little older than a subscription, never lose a newer one."""
    topic = rec.topic
    short = len(topic) <= _CACHED_TOPIC_LEN
    ts = rec.timestamp_us + CLOCK_SKEW_US if remote else rec.timestamp_us
    qos = -1
    rap = False
    ids: list[int] | None = None  # (made for the first subscription id only: most have none)
    position = False
    msg: Message | None = None
    for sub in session.subscriptions.values():
        if sub.group is not None or sub.since_us > ts:
            continue  # shares are picked at routing time; a newer subscription never saw it
        replay = sub.replay
        if replay is not None and not replay.live:
            continue  # that subscription's own replay cursor reads this log
        flt = sub.filter
        if not (_cached_matches(flt, topic) if short and len(flt) <= _CACHED_TOPIC_LEN
                else topic_matches(flt, topic)):
            continue
        if sub.no_local:
            if msg is None:
                msg = record_message(rec, new_message)
            if msg.origin == session.client_id:
                continue
        if sub.qos > qos:
            qos = sub.qos
        if sub.retain_as_published:
            rap = True
        if replay is not None:
            position = True
        if sub.sub_id:
            if ids is None:
                ids = [sub.sub_id]
            elif sub.sub_id not in ids:  # each identifier once [MQTT-3.3.4-3], as route()
                ids.append(sub.sub_id)  # (one SUBSCRIBE's filters share its identifier)
    if qos < 0:
        return None
    if msg is None:
        msg = record_message(rec, new_message)
    return msg, qos, rap, None if ids is None else tuple(ids), position
