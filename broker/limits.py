"""Resource limits a client cannot grow past, and the rate-limited log line each one writes.

Every resource a client controls is bounded by a documented config key; when a limit is hit the
broker refuses or closes the one client involved, counts it in ``meshmq_limit_hits_total`` with
the key's name as the label, and writes a log line, at most one per limit every few seconds, so a
flood of refusals cannot flood the log too (Mosquitto logs every refusal; EMQX rate-limits its
"flapping" and "overload" warnings the same way).

The checks are small pure functions and counters; the router and listener call them through one
line each (router.py stays a router, not a policy file).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from broker.stats import BrokerStats

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.session import Session
    from broker.settings import BrokerSettings, ListenerSettings

log = logging.getLogger("broker.limits")

#: The label values of ``meshmq_limit_hits_total``: the config key of each limit. Listed up front
#: so every series exists at zero (a series that appears only on its first hit breaks alerting).
LIMIT_NAMES = (
    "max_topic_levels",
    "max_connections",
    "listener.max_connections",
    "max_connect_packet_size",
    "packet_timeout",
    "max_offline_sessions",
    "max_queued_bytes",
    "max_queued_messages",  # a session's queue by count (unlogged topics, QoS 0, the bridge)
    "max_failures",
    "max_lagging_devices",  # a session's log positions (broker/positions.py)
    "max_retained_pending",  # retained messages owed on SUBSCRIBE (broker/retainpace.py)
)

_LOG_EVERY_S = 10.0  # at most one log line per limit in this many seconds


def too_many_levels(topic: str, max_levels: int) -> bool:
    """Whether ``topic`` (a name or filter) has more than ``max_levels`` levels.

    One C-level ``str.count`` per PUBLISH: the cost on the hot path is a few tens of
    nanoseconds for ordinary topics. EMQX's default of 128 levels is far above any real topic
    design and far below the ~1,000 levels that used to overflow the recursive trie walks.
    """
    return topic.count("/") >= max_levels


class LimitLog:
    """Count a limit hit and log it, at most once per limit every ``_LOG_EVERY_S`` seconds.

    The line carries how many hits were not logged since the last one, so an operator reading
    the log still sees the rate; the exact count is in the metric.
    """

    def __init__(self, stats: BrokerStats) -> None:
        self._stats = stats
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def hit(self, limit: str, message: str, **extra: object) -> None:
        self._stats.limit_hit(limit)
        now = time.monotonic()
        last = self._last.get(limit)
        if last is not None and now - last < _LOG_EVERY_S:
            self._quiet[limit] = self._quiet.get(limit, 0) + 1
            return
        self._last[limit] = now
        suppressed = self._quiet.pop(limit, 0)
        log.warning("limit %s hit: %s%s", limit, message,
                    f" ({suppressed} more hits since the last line)" if suppressed else "",
                    extra={"limit": limit, **extra})


def listener_caps(listeners: ListenerSettings) -> dict[str, int]:
    """Per-listener ``max_connections`` by listener name (0 = no cap of its own)."""
    return {"tcp": listeners.tcp_max_connections, "tls": listeners.tls_max_connections,
            "ws": listeners.ws_max_connections}


def connection_limit(total: int, max_total: int, listener_current: int,
                     listener_cap: int) -> str | None:
    """The limit a new connection would break (its config key), or None.

    ``total`` counts the connections already held; ``listener_current`` includes the new one.
    Checked at accept, before any byte is read: the cheapest point to say no (Mosquitto and
    EMQX close the socket there too; there is no CONNECT yet to answer with a CONNACK).
    """
    if total >= max_total:
        return "max_connections"
    if listener_cap and listener_current > listener_cap:
        return "listener.max_connections"
    return None


class OfflineSessions:
    """Sessions whose client is offline, oldest first, bounded by ``mqtt.max_offline_sessions``.

    Each offline session keeps its subscriptions and a queue (bounded by max_queued_messages and
    max_queued_bytes); without a cap, clients connecting once each with a new client id and
    clean session 0 grow memory without end. Past the cap the session offline the longest is
    ended, like an LRU cache: its client is the least likely to come back.
    """

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._order: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._order)

    def went_offline(self, session: Session) -> list[Session]:
        """Track ``session``; return the sessions to end to stay within the cap."""
        order = self._order
        order.pop(session.client_id, None)
        order[session.client_id] = session
        evicted = []
        while len(order) > self._cap:
            evicted.append(order.pop(next(iter(order))))
        return evicted

    def back(self, session: Session) -> None:
        """The session's client is back, or the session ended."""
        if self._order.get(session.client_id) is session:
            del self._order[session.client_id]


class RouterLimits(LimitLog):
    """The router's limit checks, each one call from the router (which stays a router).

    Deep topics (``mqtt.max_topic_levels``) are refused by the router itself with the codes
    of ``_refuse_deep_publish`` (broker/handle_publish.py): v5 QoS 1/2 PUBACK/PUBREC 0x90
    (Topic Name invalid, "not malformed, but not accepted by this Server"; the connection stays
    usable), v5 QoS 0 DISCONNECT 0x90 (no ack can carry it; EMQX disconnects with 0x90 for
    every such PUBLISH), 3.1.1 a closed connection (no negative ack exists); wills CONNACK 0x90
    (3.1.1: 3, EMQX's mapping); SUBSCRIBE per-filter 0x8F (3.1.1: 0x80).
    """

    def __init__(self, stats: BrokerStats, settings: BrokerSettings) -> None:
        super().__init__(stats)
        self.mqtt = settings.mqtt
        self._caps = listener_caps(settings.listeners)
        self.offline = OfflineSessions(settings.mqtt.max_offline_sessions)

    def admit(self, conn: Connection, held: int) -> bool:
        """mqtt.max_connections / listener.*.max_connections at accept; False = aborted."""
        lst = conn.listener
        over = connection_limit(held, self.mqtt.max_connections, lst.connections_current,
                                self._caps.get(lst.name, 0))
        if over is None:
            return True
        self.hit(over, f"connection from {conn.peer} closed at accept on listener {lst.name} "
                 f"({held} held)", peer=conn.peer)
        lst.rejected += 1
        conn.abort()
        return False

    def deep_topic(self, conn: Connection, topic: str) -> str:
        """Count and log a topic over max_topic_levels; returns the reason string."""
        limit = self.mqtt.max_topic_levels
        self.hit("max_topic_levels", f"topic with {topic.count('/') + 1} levels refused "
                 f"(max_topic_levels {limit})", client_id=conn.client_id, peer=conn.peer,
                 topic=topic[:100])
        return f"topic has more than max_topic_levels ({limit}) levels"

    def went_offline(self, session: Session) -> list[Session]:
        """Track an offline session; the sessions max_offline_sessions says to end."""
        evicted = self.offline.went_offline(session)
        for old in evicted:
            self.hit("max_offline_sessions", "ended the session offline the longest",
                     client_id=old.client_id)
        return evicted

    def packet_overdue(self, conn: Connection, now: float) -> bool:
        """mqtt.packet_timeout: True (counted, logged) when conn's unfinished packet is late."""
        since = conn.partial_since
        if since is None or now - since <= self.mqtt.packet_timeout:
            return False
        self.hit("packet_timeout", f"a packet started {now - since:.0f} s ago is still "
                 f"unfinished; closing", client_id=conn.client_id, peer=conn.peer)
        return True

    def first_packet_refused(self, conn: Connection, err: Exception) -> None:
        """Count a CONNECT refused by mqtt.max_connect_packet_size (0x95 before CONNECT)."""
        if getattr(err, "reason_code", None) == 0x95 and conn.proto.protocol_level is None:
            self.hit("max_connect_packet_size", f"first packet refused: {err}", peer=conn.peer)

    def queue_full(self, session: Session) -> None:
        """A session's queue holds mqtt.max_queued_messages: counted and logged (rate-limited),
        so an operator sees which session drops, not only a counter (a bridge's session
        $bridge/<name> holds a bridge's unlogged outbound topics while its remote is away)."""
        self.hit("max_queued_messages", f"session queue holds {len(session.queue)} messages; "
                 f"{self.mqtt.queue_full_policy.value} (max_queued_messages "
                 f"{self.mqtt.max_queued_messages})", client_id=session.client_id)

    def queue_bytes_full(self, session: Session, size: int) -> bool:
        """Whether queueing ``size`` more bytes breaks mqtt.max_queued_bytes (counted, logged)."""
        queued = session.queue.nbytes
        if queued + size <= self.mqtt.max_queued_bytes:
            return False
        self.hit("max_queued_bytes", f"session queue holds {queued} bytes; "
                 f"{self.mqtt.queue_full_policy.value} (max_queued_bytes "
                 f"{self.mqtt.max_queued_bytes})", client_id=session.client_id)
        return True
