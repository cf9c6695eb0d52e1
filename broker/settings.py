"""Typed settings the broker room receives from the node wiring.

The broker never reads TOML or the environment itself: ``meshmq.config`` parses and validates the
file once and hands each room only what it needs (see ``docs/architecture.md``).
Defaults follow Mosquitto/EMQX where they agree, and the comment says where they come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class QueueFullPolicy(StrEnum):
    """What a session's queue does at its bound: never silent, always counted in a metric."""

    DROP_OLDEST = "drop_oldest"  # EMQX mqueue behaviour
    DROP_NEW = "drop_new"  # Mosquitto behaviour for max_queued_messages
    DISCONNECT = "disconnect"  # close the slow client with v5 0x97 Quota exceeded


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    tcp_bind: str | None = "0.0.0.0:1883"  # None disables
    tls_bind: str | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cafile: str | None = None  # when set, clients must present a certificate signed by it
    ws_bind: str | None = None
    ws_path: str = "/mqtt"
    # Connections one listener holds at once, 0 = only mqtt.max_connections applies (Mosquitto's
    # per-listener max_connections, EMQX's listeners.*.max_connections).
    tcp_max_connections: int = 0
    tls_max_connections: int = 0
    ws_max_connections: int = 0
    # SO_REUSEPORT on every listening socket: set only for the routers of a cluster node
    # (meshmq/config.py), which share the node's MQTT ports and let the kernel spread new
    # connections across them. Off on a single node, so a second broker started by mistake on
    # the same port fails with EADDRINUSE instead of silently taking half the clients.
    reuse_port: bool = False


class DedupeMode(StrEnum):
    """Where publisher dedupe (broker/pubdedupe.py) runs: its record header costs the single
    node's hot path about 0.35 us a publish (measured: store append + flush), so a single node
    pays it only when asked."""

    CLUSTER = "cluster"  # with [cluster] only: a resend after a failover is stored once
    ON = "on"  # also on a single node (a resend after a lost connection or a restart)
    OFF = "off"  # never: resends are stored again (at least once)


@dataclass(frozen=True, slots=True)
class MqttSettings:
    # EMQX and Mosquitto both cap packets; 1 MiB is EMQX's default max_packet_size.
    max_packet_size: int = 1_048_576
    # Outgoing QoS 1/2 window per session (EMQX max_inflight 32; Mosquitto 20).
    max_inflight: int = 32
    # Inbound QoS 1/2 the server accepts unacknowledged (v5 Receive Maximum it announces). Above
    # Mosquitto's 20 / EMQX's 32 because our acks wait for fsync: a batch of publishes is in
    # flight per group commit, as Kafka producers keep several batches in flight.
    receive_maximum: int = 1024
    # Bound of a session's queue of messages waiting for the window or for the client to return
    # (Mosquitto max_queued_messages 1000; EMQX max_mqueue_len 1000). Logged messages past it
    # are not dropped: the session reads them from the log (broker/catchup.py).
    max_queued_messages: int = 1000
    queue_full_policy: QueueFullPolicy = QueueFullPolicy.DROP_OLDEST
    # v5 PUBACK/PUBREC carry the stored message's `device` and `offset` user properties for
    # clients that do not say (CONNECT user property `ack-offsets`): off, a 4-byte ack is what
    # clients and metered links expect.
    ack_offsets: bool = False
    # Seconds between $SYS/broker/... updates (Mosquitto's sys_interval, default 10); 0 = off.
    sys_interval: int = 10
    # Device logs one session may be behind on (one small cursor each); past it, logged messages
    # fall back to the queue above and its policy.
    max_lagging_devices: int = 100_000
    # Retained messages one session may be owed on SUBSCRIBE, waiting for its window (a
    # reference each, broker/retainpace.py); past it the rest of that SUBSCRIBE's are dropped.
    max_retained_pending: int = 100_000
    # Upper bound on a client's requested session expiry, seconds; 0 = no cap.
    max_session_expiry: int = 0
    # Keepalive above this is answered with v5 Server Keep Alive; 0 = accept what the client asks.
    max_keepalive: int = 0
    topic_alias_maximum: int = 10  # Mosquitto max_topic_alias default
    retain_available: bool = True
    wildcard_subscriptions: bool = True
    shared_subscriptions: bool = True
    max_qos: int = 2
    # Bytes queued on one socket before its subscriber counts as slow: QoS 0 to it is dropped and
    # counted; QoS>0 waits in the session queue. Keeps a stalled reader from growing memory.
    write_buffer_limit: int = 1_048_576
    allow_zero_length_client_id: bool = True
    connect_timeout: float = 10.0  # seconds to wait for CONNECT after accept (and for TLS)
    # Topic levels a PUBLISH topic, a will topic or a SUBSCRIBE filter may have (EMQX
    # max_topic_levels 128). Deeper ones are refused with v5 0x90/0x8F (EMQX's codes).
    max_topic_levels: int = 128
    # Connections the node holds at once, all listeners together; one more is closed at accept.
    max_connections: int = 10_000
    # Largest first packet (the CONNECT, sent before anyone is authenticated), bytes.
    max_connect_packet_size: int = 65_536
    # Seconds a started packet may take to arrive in full; then the connection is closed.
    packet_timeout: float = 30.0
    # Sessions kept for clients that are offline; beyond it the longest-offline one is ended.
    max_offline_sessions: int = 10_000
    # Bytes (topic + payload) a session may queue; beyond it queue_full_policy applies.
    max_queued_bytes: int = 16_777_216
    # Retained messages and persistent sessions survive restarts (Mosquitto's `persistence`,
    # default off there; on here: the commit log already fsyncs every batch). Needs the commit
    # log; see broker/sessionstore.py and broker/retainstore.py.
    persistence: bool = True
    # Seconds between checkpoints of persistent sessions' delivery progress (Kafka's consumer
    # auto.commit.interval.ms is 5 s): after kill -9, logged messages since the checkpoint may
    # come again (never lost); unlogged queued messages since it are lost.
    persistence_interval: float = 5.0
    # Publisher dedupe (broker/pubdedupe.py): where it runs, and how many of a device log's
    # newest records its leader reads back for a publish that may be a resend (DUP=1, or a
    # meshmq-message-id user property) before appending it.
    publisher_dedupe: DedupeMode = DedupeMode.CLUSTER
    dedupe_window: int = 4096


@dataclass(frozen=True, slots=True)
class AuthSettings:
    allow_anonymous: bool = True
    password_file: str | None = None
    acl_file: str | None = None
    # Which client ids a user may take (see broker/clientid.py): "any", "username", "pattern".
    clientid_rule: str = "any"
    clientid_pattern: str = "%u"  # for "pattern": %u = the username, * = any characters
    # Password checks (scrypt) running at once; the rest wait in arrival order (authgate.py).
    max_concurrent_checks: int = 2
    # Failed logins for one username from one address within failure_window seconds after
    # which further attempts are refused at once (EMQX flapping detection: 15 in 1 min)...
    max_failures: int = 15
    failure_window: float = 60.0
    # ...and from one address, whatever the usernames (issue 27: never a username alone)
    max_address_failures: int = 100


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    node_id: str = "meshmq-1"
    listeners: ListenerSettings = field(default_factory=ListenerSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
