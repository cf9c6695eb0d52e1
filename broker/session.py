"""Per-client session state that outlives a network connection.

Everything the MQTT spec says survives a reconnect lives here (subscriptions, the outgoing QoS 1/2
window and queue, inbound QoS 2 packet ids) so that a persistent session is simply a
``Session`` whose ``conn`` is ``None`` for a while. The router owns every session;
connections only point at one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.cursors import LogCursor
from broker.message import Delivery
from broker.protocol.packets import Will
from broker.stats import DropReason

if TYPE_CHECKING:
    from broker.connection import Connection

NEVER = 0xFFFFFFFF  # v5 session expiry interval meaning "does not expire"


def delivery_bytes(d: Delivery) -> int:
    """What a queued delivery costs, for ``mqtt.max_queued_bytes``: its topic and payload."""
    msg = d.msg
    return len(msg.topic) + len(msg.payload)


class DeliveryQueue(deque):
    """A session's queue that knows how many bytes it holds (``mqtt.max_queued_bytes``).

    A deque subclass so every way the router adds and removes deliveries keeps the count right
    without the router doing bookkeeping at each site. The queue is only used while a
    subscriber's window is full or it is offline, never on the direct delivery path, so the
    Python-level append/popleft cost lands on the slow-consumer path only.
    """

    __slots__ = ("nbytes",)

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def append(self, d: Delivery) -> None:
        self.nbytes += delivery_bytes(d)
        super().append(d)

    def appendleft(self, d: Delivery) -> None:
        self.nbytes += delivery_bytes(d)
        super().appendleft(d)

    def extend(self, items: Iterable[Delivery]) -> None:
        for d in items:
            self.append(d)

    def popleft(self) -> Delivery:
        d = super().popleft()
        self.nbytes -= delivery_bytes(d)
        return d

    def pop(self) -> Delivery:  # type: ignore[override]
        d = super().pop()
        self.nbytes -= delivery_bytes(d)
        return d

    def clear(self) -> None:
        super().clear()
        self.nbytes = 0

    def make_room(self, size: int, limit: int, stats: Any) -> bool:
        """drop_oldest for a delivery of ``size`` bytes: drop the oldest (one for the message
        bound, more while the byte bound needs it, each counted); False when ``size`` alone is
        over ``limit`` (then only the new one can go)."""
        if size > limit:
            return False
        if self:
            self.popleft()
        while self and self.nbytes + size > limit:
            self.popleft()
            stats.dropped(DropReason.QUEUE_FULL)
        return True


class _NoQueue(DeliveryQueue):
    """The one empty queue every session shares until it queues its first delivery.

    A deque allocates its first 64-slot block when it is made: 768 bytes per session with the
    subclass, most of it for sessions that never queue anything (an idle client, a subscriber
    that keeps up). Reads (``len``, truth, iteration, ``nbytes``, ``popleft`` on empty) behave
    as an empty queue's, at C speed on the hot path's ``if session.queue`` checks; adding goes
    through ``Session.own_queue()``, and adding to the shared one directly raises instead of
    leaking a delivery into every session (issue 25).
    """

    __slots__ = ()

    def append(self, d: Delivery) -> None:
        raise RuntimeError("a delivery added to the shared empty queue: "
                           "use Session.own_queue() to add")

    appendleft = append


NO_QUEUE: DeliveryQueue = _NoQueue()


class _NoEntries(dict):  # type: ignore[type-arg]
    """The one empty dict every session shares for each of its maps (subscriptions, inflight,
    incoming QoS 2 ids, lag cursors, log positions) until it writes its first entry there.

    An empty dict is 64 bytes, five per session, and an idle client writes none of them
    (issue 25). Reads are a dict's own (C speed: ``len``, ``in``, ``get``, iteration);
    writing goes through the session's ``own_*()`` methods, and writing to the shared one
    directly raises instead of putting an entry into every session at once.
    """

    __slots__ = ()

    def _refuse(self, *_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("written to the shared empty map: use the Session's own_*() "
                           "method to add")

    __setitem__ = setdefault = update = __ior__ = _refuse


NO_ENTRIES: dict[Any, Any] = _NoEntries()


class Subscription:
    __slots__ = ("filter", "qos", "no_local", "retain_as_published", "retain_handling", "sub_id",
                 "group", "replay", "since_us")

    def __init__(
        self,
        flt: str,
        qos: int,
        no_local: bool,
        retain_as_published: bool,
        retain_handling: int,
        sub_id: int | None,
        group: str | None,
    ) -> None:
        self.filter = flt  # the real filter, without "$share/group/"
        self.qos = qos  # granted maximum QoS
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling
        self.sub_id = sub_id
        self.group = group
        self.replay: LogCursor | None = None  # set when the subscriber asked for an offset
        # When it was made (wall clock, the records' timestamp scale): a session fed from the
        # log skips records older than the subscription, as live routing would have.
        self.since_us = time.time_ns() // 1000


class Session:
    __slots__ = (
        "client_id", "conn", "level", "expiry_interval", "subscriptions", "inflight", "queue",
        "next_pid", "incoming_qos2", "window", "max_packet_size", "alias_max", "expires_at",
        "will", "will_due", "username", "lag", "lag_behind", "has_no_local", "positions",
        "epoch", "publisher_key",
    )

    def __init__(self, client_id: str, level: int) -> None:
        self.client_id = client_id
        self.conn: Connection | None = None
        self.level = level
        self.expiry_interval = 0  # seconds after disconnect; NEVER = keep forever
        # The maps below start as the shared NO_ENTRIES and become the session's own on the
        # first write (own_subscriptions() ...): an idle client holds none of them.
        # key: the filter as subscribed (including "$share/g/" prefix) -> Subscription
        self.subscriptions: dict[str, Subscription] = NO_ENTRIES
        self.inflight: dict[int, Delivery] = NO_ENTRIES  # packet id -> delivery, oldest first
        # the shared empty queue until the first delivery is queued (own_queue)
        self.queue: DeliveryQueue = NO_QUEUE
        self.next_pid = 1
        # PUBLISH QoS 2 received and PUBREL not yet: packet id -> PUBREC sent (False while the
        # message waits for the commit log, so a resend then is not acknowledged early)
        self.incoming_qos2: dict[int, bool] = NO_ENTRIES
        self.window = 65535  # min(max_inflight, client's Receive Maximum)
        self.max_packet_size = 0  # client's Maximum Packet Size; 0 = protocol limit
        self.alias_max = 0  # client's Topic Alias Maximum (outbound aliases we may use)
        self.expires_at: float | None = None  # monotonic deadline while offline
        self.will: Will | None = None  # pending delayed will (v5 Will Delay Interval)
        self.will_due: float | None = None
        self.username: str | None = None  # for per-message read ACL checks
        # device -> LogCursor while this session is fed from the logs (broker/catchup.py);
        # lag_behind counts the cursors not yet caught up.
        self.lag: dict[str, LogCursor] = NO_ENTRIES
        self.lag_behind = 0
        self.has_no_local = False  # holds a No Local subscription: its publishes keep an origin
        # device -> the offset after the last logged QoS>0 message handed to this session (in
        # its window, queue or acked): where a restart, a move or a link that came back
        # resumes reading that device's log (broker/positions.py)
        self.positions: dict[str, int] = NO_ENTRIES
        # Which incarnation of this client id's session this is, kept in its publishes'
        # records (broker/pubdedupe.py): random for a clean start, 0 ("not known here") for a
        # session resumed or restored; and its records' publisher prefix, computed once
        self.epoch = 0
        self.publisher_key = b""

    @property
    def v5(self) -> bool:
        return self.level == 5

    def resume_will(self, now: float) -> Will | None:
        """The client is back (a reconnect here, or its session claimed by another router):
        its pending delayed will is settled, exactly once. Returned when already due (the
        twice-a-second sweep had not fired it yet: it must be published now [MQTT-3.1.3-9]),
        cancelled otherwise (back within the Will Delay Interval, v5 3.1.3.2.2); either way
        the session holds none afterwards, so the sweep cannot fire it again."""
        will, due = self.will, self.will_due
        self.will = None
        self.will_due = None
        if will is not None and due is not None and due <= now:
            return will
        return None

    def own_queue(self) -> DeliveryQueue:
        """This session's queue, to add to: made on first use (``queue`` is the shared empty
        ``NO_QUEUE`` until then, to read only)."""
        q = self.queue
        if q is NO_QUEUE:
            q = self.queue = DeliveryQueue()
        return q

    # The session's own maps, to write to: each made on its first write (NO_ENTRIES until then)
    def own_subscriptions(self) -> dict[str, Subscription]:
        d = self.subscriptions
        if d is NO_ENTRIES:
            d = self.subscriptions = {}
        return d

    def own_inflight(self) -> dict[int, Delivery]:
        d = self.inflight
        if d is NO_ENTRIES:
            d = self.inflight = {}
        return d

    def own_incoming_qos2(self) -> dict[int, bool]:
        d = self.incoming_qos2
        if d is NO_ENTRIES:
            d = self.incoming_qos2 = {}
        return d

    def own_lag(self) -> dict[str, LogCursor]:
        d = self.lag
        if d is NO_ENTRIES:
            d = self.lag = {}
        return d

    def own_positions(self) -> dict[str, int]:
        d = self.positions
        if d is NO_ENTRIES:
            d = self.positions = {}
        return d

    def allocate_pid(self) -> int:
        """Next free packet id; the window (≤ 65535) guarantees one exists."""
        pid = self.next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid + 1 if pid < 65535 else 1
        self.next_pid = pid + 1 if pid < 65535 else 1
        return pid
