"""Retained messages sent on SUBSCRIBE, paced by the subscriber's window instead of dropped.

A new subscriber to ``devices/+/state`` over thousands of devices expects every retained
message. Sent at once, they all went through ``deliver``: the first ``window`` QoS 1 ones into
flight, up to ``mqtt.max_queued_messages`` into the bounded queue, and the rest dropped as
``queue_full`` (1,032 of 5,000 arrived; QoS 0 ones past a full socket buffer were dropped as
``slow_consumer``). Mosquitto drops the same way; EMQX's retainer has flow control: it sends
retained messages in batches as the subscriber's inflight window frees. So does this engine:

* On SUBSCRIBE the matching retained messages are taken as a list of references to the
  stored messages (what the topic tree walk already returns: no copy of a payload, 8 bytes a
  message while its turn has not come; released as it is sent).
* ``pump(session)`` delivers from that list while the session can take a message *now*:
  connected, its socket not congested, nothing queued ahead, and for QoS 1/2 a free slot in
  its window. Called when an ack frees the window (``_window_freed``), when the socket drains
  (``writable``), when a persistent session comes back (its pending retained messages then
  continue), and once after the SUBACK. A socket congested only by this tick's unflushed
  writes gets one more try on the next tick (after the flush).
* Nothing pending is dropped for the queue's room: the session's queue is not used for them.
  They go with the session if it ends (or moves to another router in a cluster), like its
  queue. A re-SUBSCRIBE to the same filter replaces what that filter was still owed (it asks
  for the retained messages again), and ``mqtt.max_retained_pending`` bounds what one session
  may be owed at once (a client sending SUBSCRIBE after SUBSCRIBE without reading would grow
  it otherwise): past it the rest of that SUBSCRIBE's are dropped, counted
  (``reason="retained_pending"``, ``limit="max_retained_pending"``) and logged.

Metrics: ``meshmq_retained_pending`` (messages waiting for their turn, over all sessions) and
``meshmq_retained_paced_sessions``. Precedent: EMQX's ``retainer.flow_control``
(``batch_deliver_number``), and MQTT 5 4.9 (the server must not send QoS>0 PUBLISH beyond the
client's Receive Maximum).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.stats import DropReason

if TYPE_CHECKING:
    from broker.message import Message
    from broker.port import RouterPort
    from broker.session import Session


class _Batch:
    """One subscription's retained messages still to send."""

    __slots__ = ("key", "qos", "ids", "messages", "next")

    def __init__(self, key: str, qos: int, ids: tuple[int, ...] | None,
                 messages: list[Message]) -> None:
        self.key = key  # the filter as subscribed: a re-SUBSCRIBE replaces the batch
        self.qos = qos
        self.ids = ids
        self.messages = messages
        self.next = 0


class RetainedPacer:
    """Per-session lists of retained messages owed on SUBSCRIBE, sent as room frees."""

    def __init__(self, router: RouterPort) -> None:
        self.router = router
        self.pending: dict[Session, deque[_Batch]] = {}
        self._retry: set[Session] = set()  # pumps scheduled for the next tick

    def add(self, session: Session, key: str, qos: int, ids: tuple[int, ...] | None,
            messages: list[Message]) -> None:
        """Owe ``session`` the retained messages of its subscription ``key`` (in order, after
        what it is owed already; replacing what ``key`` was still owed)."""
        work = self.pending.get(session)
        if work is not None:
            for old in [b for b in work if b.key == key]:
                work.remove(old)
        if not messages:
            return
        owed = sum(len(b.messages) - b.next for b in work) if work else 0
        room = self.router.settings.mqtt.max_retained_pending - owed
        if len(messages) > room:
            dropped = len(messages) - max(room, 0)
            messages = messages[:max(room, 0)]
            self.router.stats.dropped(DropReason.RETAINED_PENDING, dropped)
            self.router.limits.hit(
                "max_retained_pending", f"{dropped} retained messages of a SUBSCRIBE dropped: "
                "the session is owed mqtt.max_retained_pending already (raise it, or have the "
                "client read before subscribing again)",
                client_id=session.client_id, filter=key)
            if not messages:
                return
        if work is None:
            work = self.pending[session] = deque()
        work.append(_Batch(key, qos, ids, messages))

    def forget(self, session: Session) -> None:
        self.pending.pop(session, None)
        self._retry.discard(session)

    def waiting(self) -> int:
        """Retained messages still owed, over all sessions (a gauge)."""
        return sum(len(b.messages) - b.next for q in self.pending.values() for b in q)

    def pump(self, session: Session) -> None:
        """Send what ``session`` can take now (see the module docstring)."""
        work = self.pending.get(session)
        if work is None:
            return
        conn = session.conn
        if conn is None or conn.closing:
            return  # resumes when the session is back (handle_connect pumps it)
        router = self.router
        inflight = session.own_inflight()  # filled below: not the shared empty map
        now = time.monotonic()
        while work:
            batch = work[0]
            messages = batch.messages
            i = batch.next
            while i < len(messages):
                if conn.congested:
                    batch.next = i
                    if not conn.write_paused:  # only this tick's writes: retry after the flush
                        self._later(session)
                    return  # else writable() pumps again when the socket drains
                msg = messages[i]
                if min(msg.qos, batch.qos) and (session.queue
                                                or len(inflight) >= session.window):
                    batch.next = i
                    return  # an ack frees the window: _window_freed pumps again
                i += 1
                if msg.expired(now):
                    continue
                router.deliver(session, msg, batch.qos, True, batch.ids)
            work.popleft()
        del self.pending[session]

    def _later(self, session: Session) -> None:
        if session in self._retry:
            return
        self._retry.add(session)

        def again(s: Any = session) -> None:
            self._retry.discard(s)
            self.pump(s)

        self.router.loop.call_soon(again)
