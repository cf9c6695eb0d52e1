"""Plain-integer counters the hot path bumps; the metrics endpoint reads them at scrape time.

prometheus-client counters take a lock and do float maths on every ``inc()``; at 100k+ messages a
second that is measurable, so the broker counts in plain ints and ``meshmq.metrics`` exposes them
through a custom collector (the pattern prometheus-client documents for "proxy" metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Index = MQTT packet type (1..15); 0 unused. Names for metric labels.
PACKET_NAMES = (
    "", "connect", "connack", "publish", "puback", "pubrec", "pubrel", "pubcomp", "subscribe",
    "suback", "unsubscribe", "unsuback", "pingreq", "pingresp", "disconnect", "auth",
)


class DropReason:
    """Why a message did not reach a subscriber; each is a label of ``messages_dropped_total``."""

    QUEUE_FULL = "queue_full"  # session queue at max_queued_messages (policy decides which)
    SLOW_CONSUMER = "slow_consumer"  # QoS 0 to a socket over write_buffer_limit
    EXPIRED = "expired"  # v5 message expiry interval passed while queued
    TOO_LARGE = "too_large"  # bigger than the client's Maximum Packet Size
    NOT_AUTHORIZED = "not_authorized"  # ACL denied the publish or its delivery
    NOT_STORED = "not_stored"  # the commit log failed to write it: refused, never acknowledged
    TOPIC_LEVELS = "topic_levels"  # topic deeper than mqtt.max_topic_levels: refused (v5 0x90)
    # a peer router sent a shared-subscription share here and the group had no member left
    SHARE_UNCLAIMED = "share_unclaimed"
    # a replay from an offset skipped records a corrupt record took (quarantined by the log)
    CORRUPT = "corrupt"
    # retained messages a SUBSCRIBE was owed past mqtt.max_retained_pending (broker/retainpace)
    RETAINED_PENDING = "retained_pending"


# Why a TLS listener's handshake failed (the label of meshmq_tls_handshake_failures_total).
TLS_HANDSHAKE_FAILURES = ("client_certificate", "server_certificate", "not_tls", "timeout",
                          "closed", "tls_error")


@dataclass(slots=True)
class ListenerStats:
    name: str  # "tcp", "tls", "ws"
    connections_current: int = 0
    connections_total: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    rejected: int = 0  # connections closed before CONNACK 0 (bad CONNECT, auth, TLS-on-plain)
    # TLS listener: handshakes that failed, by reason (TLS_HANDSHAKE_FAILURES); these never
    # became connections, so they are not in ``rejected``.
    tls_handshake_failures: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class BrokerStats:
    packets_in: list[int] = field(default_factory=lambda: [0] * 16)
    packets_out: list[int] = field(default_factory=lambda: [0] * 16)
    messages_in: int = 0  # PUBLISH accepted from clients
    messages_out: int = 0  # PUBLISH written to subscribers
    messages_in_qos: list[int] = field(default_factory=lambda: [0, 0, 0])  # by QoS
    messages_out_qos: list[int] = field(default_factory=lambda: [0, 0, 0])
    # ACL decisions: (action, "allow" | "deny") -> count; action publish, subscribe, deliver
    acl_decisions: dict[tuple[str, str], int] = field(default_factory=dict)
    clients_connected_max: int = 0  # peak of clients past CONNACK since start
    messages_dropped: dict[str, int] = field(default_factory=dict)
    protocol_errors: int = 0
    auth_failures: int = 0
    # Reads whose packets took longer than the router's mid-read flush interval to route: the
    # node was handed a backlog (a rising rate means it is falling behind its input).
    long_reads: int = 0
    # Sessions behind on mqtt.max_lagging_devices logs that had a logged message queued in memory
    # instead (broker/catchup.py): the queue's policy then applies to them.
    lag_limit_hits: int = 0
    # Reads of another router's device log (offset replay, catch-up) that failed and were
    # tried again (broker/cursors.py: the one retry policy).
    log_read_retries: int = 0
    # Connections closed because handling their packet raised (a broker bug or an input the
    # broker did not foresee): the client is closed, every other flow goes on.
    client_errors: int = 0
    # Times a configured resource limit refused or closed something, by limit (the config key's
    # name: "max_topic_levels", "max_connections", ...); see broker/limits.py.
    limit_hits: dict[str, int] = field(default_factory=dict)
    listeners: dict[str, ListenerStats] = field(default_factory=dict)

    def acl(self, action: str, allowed: bool) -> None:
        key = (action, "allow" if allowed else "deny")
        self.acl_decisions[key] = self.acl_decisions.get(key, 0) + 1

    def dropped(self, reason: str, n: int = 1) -> None:
        self.messages_dropped[reason] = self.messages_dropped.get(reason, 0) + n

    def limit_hit(self, limit: str) -> None:
        self.limit_hits[limit] = self.limit_hits.get(limit, 0) + 1

    def listener(self, name: str) -> ListenerStats:
        stats = self.listeners.get(name)
        if stats is None:
            stats = self.listeners[name] = ListenerStats(name)
        return stats
