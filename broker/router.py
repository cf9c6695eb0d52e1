"""The router: one per process, the single owner of sessions, subscriptions, retained and wills.

Connections hand it whole batches of packets (one call per socket read) and it answers by queueing
bytes on connections, which flush once per loop tick. Nothing here awaits per message: the only
awaits are CONNECT authentication with a password file (scrypt runs in a worker thread) and
shutdown.
The router never imports the cluster: the node wiring will hand it a forwarder (rumqttd's
router/link split; see docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from broker.auth import Authenticator
from broker.authgate import THROTTLED, THROTTLED_WHY, PasswordCheckGate, refusal_text
from broker.catchup import LogCatchUp
from broker.clientid import ClientIdPolicy
from broker.connection import Connection, fail_client, guarded
from broker.devicelogs import (
    DeviceLogs,
    PendingPublish,
    offset_request,
    wants_ack_offsets,
)
from broker.forwarding import Forwarder, OwnerNotStored, RemotePublishes, RemoteSessions
from broker.limits import RouterLimits, too_many_levels
from broker.lograte import RateLimitedLog
from broker.logrules import LogRules
from broker.message import Delivery, Message, aliased_parts
from broker.positions import DeliveredPositions
from broker.protocol.errors import ProtocolError, UnsupportedProtocolVersion
from broker.protocol.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from broker.protocol.properties import Prop
from broker.protocol.reasons import SUBACK_FAILURE_V3, Reason, v3_connack_code
from broker.protocol.topics import has_wildcards, is_valid_topic_filter, parse_shared
from broker.replay import RemoteReplays, pump_replays
from broker.retained import RetainedStore
from broker.session import NEVER, Session, Subscription, delivery_bytes
from broker.sessionstore import NO_PERSISTENCE, SessionHooks
from broker.settings import BrokerSettings, QueueFullPolicy
from broker.shared import SharedDelivery
from broker.stats import BrokerStats, DropReason
from broker.trie import SharedGroup, SubscriptionTrie
from commitlog.groupcommit import GroupCommitter
from commitlog.store import LogWriteError

log = logging.getLogger("broker.router")

_SWEEP_INTERVAL = 0.5  # seconds between keepalive / expiry sweeps
# Inside one long read, write what is routed so far once this much time has passed (checked every
# _FLUSH_CHECK packets): it bounds how long a subscriber's message waits behind the rest of the
# read, while a short read still costs one write per connection per tick.
FLUSH_AFTER_S = 0.002
_FLUSH_CHECK = 15  # mask: every 16 packets
# Properties a subscriber receives unchanged [MQTT-3.3.2-*]: the rest are per hop.
_FORWARDED = (
    Prop.PAYLOAD_FORMAT_INDICATOR, Prop.CONTENT_TYPE, Prop.RESPONSE_TOPIC, Prop.CORRELATION_DATA,
    Prop.USER_PROPERTY,
)
_PUBLISH = PacketType.PUBLISH
_PUBACK = PacketType.PUBACK
_PUBREC = PacketType.PUBREC
_PUBCOMP = PacketType.PUBCOMP
_HELD_TYPES = (PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE)
# Fixed headers of the 4-byte acks (reason 0, no properties: the short form in v5 as well).
_ACK_HEAD = {_PUBACK: b"\x40\x02", _PUBREC: b"\x50\x02", _PUBCOMP: b"\x70\x02"}
# Publishes waiting for the disk beyond which publishers' sockets stop being read: a fast QoS 0
# publisher cannot grow memory faster than fsync drains it (v5 Receive Maximum bounds QoS>0 too).
_HELD_LIMIT = 50_000
_NOT_STORED = "message not stored: the commit log cannot write (disk full or failing?)"


def _forwarded_properties(props: dict | None) -> dict | None:
    if not props:
        return None
    out = {k: v for k, v in props.items() if k in _FORWARDED}
    return out or None


class Router:
    def __init__(
        self,
        settings: BrokerSettings,
        stats: BrokerStats,
        authenticator: Authenticator | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        committer: GroupCommitter | None = None,
        log_rules: LogRules | None = None,
    ) -> None:
        self.settings = settings
        self.mqtt = settings.mqtt
        self.stats = stats
        self.auth = authenticator
        self._acl = authenticator if settings.auth.acl_file else None
        self._slow_auth = bool(settings.auth.password_file)
        self.clientids = ClientIdPolicy(settings.auth.clientid_rule,
                                        settings.auth.clientid_pattern)
        self.loop = loop or asyncio.get_event_loop()
        self.limits = RouterLimits(stats, settings)
        self._gate = PasswordCheckGate.for_logins(self.loop, authenticator, settings.auth)
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self.trie = SubscriptionTrie()
        self.retained = RetainedStore(expired=lambda msg, now: msg.expired(now))
        # (deadline, seq, kind, session): session expiry and delayed wills
        self._timers: list[tuple[float, int, str, Session]] = []
        self._seq = itertools.count()
        self._sweep_handle: asyncio.TimerHandle | None = None
        # Connections with bytes queued, flushed together: once per loop tick (one call_soon
        # for the whole tick, not one per connection, which matters at 1 -> 1000 fan-out) and
        # every FLUSH_AFTER_S inside a long read.
        self._dirty: list[Connection] = []
        self._flush_handle: asyncio.Handle | None = None
        self.accepting = True
        self._connected = 0  # connections past CONNACK (for the peak gauge)
        self.logs: DeviceLogs | None = None
        self.catchup: LogCatchUp | None = None
        self.persist: SessionHooks = NO_PERSISTENCE  # broker/sessionstore.attach replaces it
        if committer is not None:
            self.logs = DeviceLogs(committer, log_rules or LogRules(), self._on_durable, self.loop)
            self.catchup = LogCatchUp(committer.store, stats, self._deliver_from_log,
                                      (self.mqtt.max_queued_messages,
                                       self.mqtt.max_queued_bytes),
                                      self.mqtt.max_lagging_devices, self.loop.call_soon,
                                      self._remote_logs, self.loop.call_later)
        self.positions = DeliveredPositions(self.sessions, self.catchup, stats,
                                            self.mqtt.max_lagging_devices)
        self._paused_publishers: set[Connection] = set()
        self.forwarder: Forwarder | None = None  # set by the node wiring in a cluster
        self.remote = RemotePublishes(self)
        self.sessions_remote = RemoteSessions(self)
        self.remote_replays = RemoteReplays(self)
        self.shared = SharedDelivery(self)
        self._log_no_connect = RateLimitedLog(log, logging.INFO,
                                              "connections closed for sending no CONNECT",
                                              burst=10, window=5.0)
        # A full disk refuses every publish: one ERROR line a second, then a count.
        self._log_not_stored = RateLimitedLog(log, logging.ERROR,
                                              "publishes refused as not stored",
                                              burst=1, window=1.0)
        self._replaying: set[Session] = set()  # sessions with a cursor still reading history
        self._handlers: dict[int, Callable[[Connection, Any], None]] = {
            PacketType.PUBREC: self._on_pubrec,
            PacketType.PUBREL: self._on_pubrel,
            PacketType.PUBCOMP: self._on_pubcomp,
            PacketType.SUBSCRIBE: self._on_subscribe,
            PacketType.UNSUBSCRIBE: self._on_unsubscribe,
            PacketType.PINGREQ: self._on_pingreq,
            PacketType.DISCONNECT: self._on_disconnect,
            PacketType.AUTH: self._on_auth,
        }

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._sweep_handle = self.loop.call_later(_SWEEP_INTERVAL, self._sweep)

    async def drain(self, timeout: float = 5.0) -> None:
        """SIGTERM: tell every client we are going (v5 0x8B), flush, and wait for the sockets."""
        self.accepting = False
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        if self._gate is not None:
            self._gate.close()
        for conn in list(self.connections):
            conn.close(Reason.SERVER_SHUTTING_DOWN)
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.abort()

    def gauges(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "subscriptions": len(self.trie),
            "retained_messages": len(self.retained),
            "connections": len(self.connections),
            "queued_messages": sum(len(s.queue) for s in self.sessions.values()),
            "inflight_messages": sum(len(s.inflight) for s in self.sessions.values()),
            "retained_bytes": self.retained.payload_bytes(),
            **(self.catchup.gauges() if self.catchup is not None else {}),
            "offline_sessions": len(self.limits.offline),
        }

    # -- connection events ----------------------------------------------------------------------
    def connection_made(self, conn: Connection) -> None:
        if not self.accepting:
            conn.abort()
            return
        if self.limits.admit(conn, len(self.connections)):
            self.connections.add(conn)

    def protocol_error(self, conn: Connection, err: ProtocolError) -> None:
        self.stats.protocol_errors += 1
        conn.close_reason = f"protocol error: {err.message}"
        log.info(
            "closing connection on protocol error: %s", err.message,
            extra={"client_id": conn.client_id, "peer": conn.peer, "reason_code": err.reason_code},
        )
        if conn.session is None:
            conn.listener.rejected += 1
            self.limits.first_packet_refused(conn, err)
            if isinstance(err, UnsupportedProtocolVersion):
                # [MQTT-3.1.2-2]: answer CONNACK 0x01 (0x84 for v5 framing), then close.
                conn.write(err.connack)
            elif conn.proto.protocol_level == 5:
                conn.level = 5
                conn.send(Connack(reason_code=err.reason_code))
            conn.close()
            return
        conn.close(err.reason_code, drain=True)  # the client may still be writing (connection.py)

    def connection_lost(self, conn: Connection) -> None:
        self.connections.discard(conn)
        session = conn.session
        if session is not None:
            self._connected -= 1
            reason = conn.close_reason or ("client disconnected" if conn.clean_disconnect
                                           else "connection lost")
            log.info("client disconnected: %s", reason, extra={
                "client_id": conn.client_id, "peer": conn.peer,
                "duration_s": round(time.monotonic() - conn.accepted_at, 3),
                "bytes_in": conn.bytes_in, "bytes_out": conn.bytes_out})
        if session is None or session.conn is not conn:
            # never connected, or taken over (the takeover already handled will and session)
            return
        session.conn = None
        self._connection_closed(session, conn, abnormal=not conn.clean_disconnect)

    def writable(self, conn: Connection) -> None:
        session = conn.session
        if session is not None:
            if session.queue:
                self._pump(session)
            self._pump_replays(session)
            if session.lag_behind:
                self.catchup.pump(session)

    # -- writing ------------------------------------------------------------------------------
    def want_flush(self, conn: Connection) -> None:
        """``conn`` has bytes queued: write them at the end of this tick at the latest."""
        self._dirty.append(conn)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush_tick)

    def _flush_tick(self) -> None:
        self._flush_handle = None
        self.flush_writes()

    def flush_writes(self) -> None:
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for conn in dirty:
                conn.flush()

    # -- packet dispatch ----------------------------------------------------------------------
    def handle_packets(self, conn: Connection, packets: list[Packet]) -> None:
        try:  # one client's packet that raises closes that client only (fail_client)
            self._handle_packets(conn, packets)
        except Exception as exc:  # noqa: BLE001 - isolation boundary, logged with traceback
            fail_client(self.stats, conn, exc)

    def _handle_packets(self, conn: Connection, packets: list[Packet]) -> None:
        packets_in = self.stats.packets_in
        handlers = self._handlers
        flush_at = 0.0
        long_read = False
        freed: Session | None = None  # a QoS 1 ack made window room: refill once, after the read
        for i, packet in enumerate(packets):
            if conn.closing:
                return
            if i & _FLUSH_CHECK == _FLUSH_CHECK:
                # A read after a stall can hold thousands of packets (uvloop reads up to
                # 256 KiB): without this, every subscriber's first message would wait until
                # the whole read is processed, tens of milliseconds at ~8 us a message.
                now = time.monotonic()
                if not flush_at:
                    flush_at = now + FLUSH_AFTER_S
                elif now >= flush_at:
                    flush_at = now + FLUSH_AFTER_S
                    if not long_read:
                        long_read = True
                        self.stats.long_reads += 1
                    self.flush_writes()
            ptype = packet.type
            packets_in[ptype] += 1
            if ptype == _PUBLISH:
                self._on_publish(conn, packet)
            elif ptype == _PUBACK:
                # A subscriber acks in batches: one _pump moving 100 queued messages after the
                # read is cheaper than 100 pumps moving one each, and sends them in one write.
                if self._settle_puback(conn, packet):
                    freed = conn.session
            elif ptype in _HELD_TYPES and conn.unsettled:
                # A client's packets take effect in the order it sent them: a SUBSCRIBE after
                # a publish still waiting for the disk waits too, with all that follows it (a
                # retained publish then a subscribe gets the message as retained, as on
                # Mosquitto). Publishers that never subscribe never wait here.
                self._hold(conn, packets[i:])
                break
            elif ptype == PacketType.CONNECT:
                if conn.session is None and conn.pending is None:
                    self._on_connect(conn, packet, packets[i + 1:])
                    return
                self.protocol_error(conn, ProtocolError(Reason.PROTOCOL_ERROR, "second CONNECT"))
                return
            else:
                handlers[ptype](conn, packet)
        if freed is not None and not conn.closing:
            self._window_freed(freed)

    # -- CONNECT ------------------------------------------------------------------------------
    def _hold(self, conn: Connection, packets: list[Packet]) -> None:
        conn.pending = list(packets)
        conn.transport.pause_reading()

    def _release_held(self, conn: Connection) -> None:
        pending, conn.pending = conn.pending or [], None
        if conn.closing or conn.session is None:
            return
        conn.transport.resume_reading()
        self.handle_packets(conn, pending)

    def _on_connect(self, conn: Connection, pkt: Connect, rest: list[Packet]) -> None:
        conn.level = pkt.protocol_level
        conn.username = pkt.username
        conn.client_id = pkt.client_id or None  # for log lines about a refused CONNECT
        if not self.accepting:
            self._refuse(conn, Reason.SERVER_UNAVAILABLE, "server is shutting down")
            return
        gate = self._gate
        if gate is not None and pkt.password is not None:
            # scrypt (~50 ms) off the loop, through the gate (bounded, lockouts: authgate.py)
            conn.pending = list(rest)
            conn.transport.pause_reading()
            code = gate.submit(conn.peer_host, pkt.username, pkt.password,
                               lambda c: guarded(self.stats, conn, self._connect_authenticated,
                                                 conn, pkt, c),
                               lambda: not conn.closing)
            if code is not None:  # locked out: refused without a password check
                conn.pending = None
                self._finish_connect(conn, pkt, code)
            return
        code = self.auth.authenticate(pkt.username, pkt.password) if self.auth else 0
        if self.forwarder is not None and not code and self.sessions_remote.claim(conn, pkt, rest):
            return  # the client id's other routers answer first (broker/forwarding.py)
        self._finish_connect(conn, pkt, code)
        if rest and conn.session is not None:
            self.handle_packets(conn, rest)

    def _connect_authenticated(self, conn: Connection, pkt: Connect, code: int) -> None:
        if conn.closing:
            return
        pending, conn.pending = conn.pending or [], None
        if self.forwarder is not None and not code and self.sessions_remote.claim(conn, pkt,
                                                                                 pending):
            return
        self._finish_connect(conn, pkt, code)
        if conn.session is not None and not conn.closing:
            conn.transport.resume_reading()
            if pending:
                self.handle_packets(conn, pending)

    def _refuse(self, conn: Connection, reason: int, why: str) -> None:
        conn.listener.rejected += 1
        # what was tried, never the password
        log.info("connection refused: %s", why,
                 extra={"client_id": conn.client_id, "username": conn.username,
                        "peer": conn.peer, "reason_code": reason})
        if conn.level == 5:
            conn.send(Connack(reason_code=reason, properties={Prop.REASON_STRING: why}))
        else:
            conn.send(Connack(reason_code=v3_connack_code(reason)))
        conn.close()

    def _finish_connect(self, conn: Connection, pkt: Connect, auth_code: int) -> None:
        mqtt = self.mqtt
        v5 = pkt.protocol_level == 5
        props = pkt.properties or {}
        if auth_code:
            self.stats.auth_failures += 1
            if auth_code == THROTTLED:
                self.limits.hit("max_failures", THROTTLED_WHY, peer=conn.peer,
                                username=pkt.username)
            self._refuse(conn, auth_code, refusal_text(auth_code))
            return
        if Prop.AUTHENTICATION_METHOD in props:
            self._refuse(conn, Reason.BAD_AUTHENTICATION_METHOD,
                         "enhanced authentication is not supported")
            return
        will = pkt.will
        if will is not None and will.qos > mqtt.max_qos:
            # [MQTT-3.2.2-12]
            self._refuse(conn, Reason.QOS_NOT_SUPPORTED,
                         f"will QoS {will.qos} is above the server maximum {mqtt.max_qos}")
            return
        if will is not None and will.retain and not mqtt.retain_available:
            # [MQTT-3.2.2-13]
            self._refuse(conn, Reason.RETAIN_NOT_SUPPORTED, "retained wills are not available")
            return
        if will is not None and too_many_levels(will.topic, mqtt.max_topic_levels):
            self._refuse(conn, Reason.TOPIC_NAME_INVALID,
                         "will " + self.limits.deep_topic(conn, will.topic))
            return
        client_id = pkt.client_id
        ack_props: dict[int, Any] = {}
        if not client_id and (named := self.clientids.default_id(pkt.username)):
            client_id = named
            if v5:
                ack_props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        if not client_id:
            if not mqtt.allow_zero_length_client_id or (not v5 and not pkt.clean_start):
                # [MQTT-3.1.3-8]: 3.1.1 empty id with clean session 0 → return code 2
                self._refuse(conn, Reason.CLIENT_IDENTIFIER_NOT_VALID,
                             "an empty client id needs clean start")
                return
            client_id = "auto-" + uuid.uuid4().hex
            if v5:
                ack_props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        conn.client_id = client_id
        # auth.clientid_rule; with passwords, a session is taken only by its own user (clientid.py)
        refused = self.clientids.connect_refusal(client_id, pkt.username, self.sessions,
                                                 self._slow_auth)
        if refused is None and will is not None and self._acl is not None \
                and not self._acl.can_publish(pkt.username, client_id, will.topic):
            # A will is a PUBLISH made on the client's behalf later: authorised now, as Mosquitto
            # does, so a refused will fails the CONNECT instead of vanishing when it is due.
            refused = (Reason.NOT_AUTHORIZED, f"not authorised to publish the will topic "
                                              f"{will.topic!r}")
        if refused is not None:
            self.stats.auth_failures += 1
            self._refuse(conn, *refused)
            return

        # Session expiry: v5 property (default 0); 3.1.1 clean session 0 means "keep forever".
        if v5:
            expiry = props.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
        else:
            expiry = 0 if pkt.clean_start else NEVER
        if mqtt.max_session_expiry and (expiry == NEVER or expiry > mqtt.max_session_expiry):
            expiry = mqtt.max_session_expiry
            if v5:
                ack_props[Prop.SESSION_EXPIRY_INTERVAL] = expiry

        keepalive = pkt.keepalive
        if mqtt.max_keepalive and (keepalive == 0 or keepalive > mqtt.max_keepalive):
            keepalive = mqtt.max_keepalive
            if v5:
                ack_props[Prop.SERVER_KEEP_ALIVE] = keepalive
        conn.keepalive = keepalive

        # Takeover [MQTT-3.1.4-3]: the old connection is told (v5 0x8E) and closed.
        session = self.sessions.get(client_id)
        # A session whose expiry is 0 (3.1.1 CleanSession=1) ends with its connection: a takeover
        # must not resume it [MQTT-3.1.2-6], [MQTT-3.2.2-2], v5 3.1.2.11.2.
        ends = session is not None and (pkt.clean_start or session.expiry_interval == 0)
        if session is not None and session.conn is not None:
            old = session.conn
            session.conn = None
            log.info("session taken over", extra={"client_id": client_id, "peer": conn.peer,
                                                    "old_peer": old.peer})
            old.close_reason = f"session taken over by {conn.peer}"
            if old.will is not None and (old.will_delay == 0 or ends):
                self._publish_will(old.will)
            old.will = None
            old.close(Reason.SESSION_TAKEN_OVER)

        session_present = False
        if ends:
            self._end_session(session)
            session = None
        if session is None:
            session = Session(client_id, pkt.protocol_level)
            self.sessions[client_id] = session
        else:
            session_present = True
            # within the will delay: cancelled; after it (not swept yet): published
            if (due := session.resume_will(time.monotonic())) is not None:
                self._publish_will(due)
        session.level = pkt.protocol_level
        session.username = pkt.username
        session.expiry_interval = expiry
        session.expires_at = None
        session.window = min(mqtt.max_inflight, props.get(Prop.RECEIVE_MAXIMUM, 65535))
        session.max_packet_size = props.get(Prop.MAXIMUM_PACKET_SIZE, 0)
        session.alias_max = props.get(Prop.TOPIC_ALIAS_MAXIMUM, 0)
        conn.out_aliases = {} if session.alias_max else None
        if pkt.will is not None:
            conn.will = pkt.will
            conn.will_delay = (pkt.will.properties or {}).get(Prop.WILL_DELAY_INTERVAL, 0)
        conn.session = session
        session.conn = conn
        self._connected += 1
        if self._connected > self.stats.clients_connected_max:
            self.stats.clients_connected_max = self._connected
        conn.ack_offsets = v5 and wants_ack_offsets(props, mqtt.ack_offsets)
        self.limits.offline.back(session)
        self.persist.connected(session)

        if v5:
            ack_props[Prop.RECEIVE_MAXIMUM] = mqtt.receive_maximum
            ack_props[Prop.MAXIMUM_PACKET_SIZE] = mqtt.max_packet_size
            ack_props[Prop.TOPIC_ALIAS_MAXIMUM] = mqtt.topic_alias_maximum
            if mqtt.max_qos < 2:
                ack_props[Prop.MAXIMUM_QOS] = mqtt.max_qos
            if not mqtt.retain_available:
                ack_props[Prop.RETAIN_AVAILABLE] = 0
            if not mqtt.wildcard_subscriptions:
                ack_props[Prop.WILDCARD_SUBSCRIPTION_AVAILABLE] = 0
            if not mqtt.shared_subscriptions:
                ack_props[Prop.SHARED_SUBSCRIPTION_AVAILABLE] = 0
        conn.send(Connack(session_present=session_present, reason_code=0,
                          properties=ack_props or None))
        # INFO like Mosquitto's "New client connected": who, from where, how. "protocol_level",
        # not "level": JSON logs use that key for the log level.
        log.info("client connected", extra={
            "client_id": client_id, "username": pkt.username, "peer": conn.peer,
            "protocol_level": pkt.protocol_level, "keepalive": keepalive,
            "clean_start": pkt.clean_start, "session_present": session_present})
        if session_present:
            self._resend_inflight(session, conn)
            self._pump(session)
            self._pump_replays(session)
            if session.lag_behind:
                self.catchup.pump(session)

    # -- PUBLISH from a client ------------------------------------------------------------------
    def _on_publish(self, conn: Connection, pkt: Publish) -> None:
        session = conn.session
        if session is None:
            return
        qos = pkt.qos
        mqtt = self.mqtt
        if qos > mqtt.max_qos:
            self.protocol_error(conn, ProtocolError(Reason.QOS_NOT_SUPPORTED,
                                                    f"QoS {qos} above the server maximum"))
            return
        if pkt.retain and not mqtt.retain_available:
            self.protocol_error(conn, ProtocolError(Reason.RETAIN_NOT_SUPPORTED,
                                                    "retain is not available"))
            return
        if qos == 2 and pkt.packet_id in session.incoming_qos2:
            # a resent QoS 2 PUBLISH we already own: acknowledge again (once stored), deliver
            # nothing new [MQTT-4.3.3-10]
            if session.incoming_qos2[pkt.packet_id]:
                conn.send(PubRec(pkt.packet_id))
            return
        if qos and conn.level == 5:
            # Receive Maximum is enforced for QoS 2 only, whose state we keep until PUBREL. A
            # QoS 1 publisher that pipelines past it (MQTT.js, paho with a raised max_inflight)
            # is served, as by Mosquitto, which acks QoS 1 at once: our acks wait for fsync,
            # and memory stays bounded by _HELD_LIMIT pausing publishers' sockets.
            conn.inbound_unacked += 1
            if qos == 2 and len(session.incoming_qos2) >= mqtt.receive_maximum:
                self.protocol_error(conn, ProtocolError(Reason.RECEIVE_MAXIMUM_EXCEEDED,
                                                        "receive maximum exceeded"))
                return
        if too_many_levels(pkt.topic, mqtt.max_topic_levels):
            self._refuse_deep_publish(conn, pkt)
            return
        acl = self._acl
        if acl is not None and not self._allowed(
                "publish", acl.can_publish(conn.username, conn.client_id, pkt.topic)):
            self.stats.dropped(DropReason.NOT_AUTHORIZED)
            log.info("publish denied by ACL", extra={"client_id": conn.client_id,
                                                     "topic": pkt.topic})
            self._ack_publish(conn, pkt.qos, pkt.packet_id,
                              Reason.NOT_AUTHORIZED if conn.level == 5 else 0)
            return
        self.stats.messages_in += 1
        self.stats.messages_in_qos[qos] += 1
        props = pkt.properties
        expiry_at = None
        if props:
            interval = props.get(Prop.MESSAGE_EXPIRY_INTERVAL)
            if interval is not None:
                expiry_at = time.monotonic() + interval
            props = _forwarded_properties(props)
        msg = Message(pkt.topic, pkt.payload, qos, pkt.retain, props, expiry_at, conn.client_id)
        logs = self.logs
        if logs is not None:
            key = logs.key_for(pkt.topic, pkt.retain)
            if key is not None:
                owner = self.forwarder.owner_of(key) if self.forwarder is not None else None
                if owner is not None:
                    self.remote.append_at_owner(owner, key, msg, conn, pkt.packet_id,
                                                interval if expiry_at else None)
                    return
                self._append(logs, key, msg, conn, pkt, interval if expiry_at else None)
                return
        if pkt.retain:
            self._retain(msg)
        self.route(msg)
        self._ack_publish(conn, pkt.qos, pkt.packet_id, 0)

    def _refuse_deep_publish(self, conn: Connection, pkt: Publish) -> None:
        """Over max_topic_levels: nothing stored or routed (codes: broker/limits.py)."""
        why = self.limits.deep_topic(conn, pkt.topic)
        self.stats.dropped(DropReason.TOPIC_LEVELS)
        if conn.level == 5 and pkt.qos:
            self._ack_publish(conn, pkt.qos, pkt.packet_id, Reason.TOPIC_NAME_INVALID,
                              {Prop.REASON_STRING: why})
            return
        self.protocol_error(conn, ProtocolError(Reason.TOPIC_NAME_INVALID, why))

    def _append(self, logs: DeviceLogs, key: str, msg: Message, conn: Connection,
                pkt: Publish, expiry: int | None) -> None:
        """Store, and hold routing and the ack until the batch is durable (see devicelogs)."""
        try:
            logs.append(key, msg, conn, pkt.packet_id, expiry)
        except LogWriteError as err:
            self._not_stored(conn, pkt.packet_id, pkt.qos, err)
            return
        conn.unsettled += 1
        if pkt.qos == 2:
            conn.session.incoming_qos2[pkt.packet_id] = False
        if logs.held > _HELD_LIMIT and conn not in self._paused_publishers:
            conn.transport.pause_reading()
            self._paused_publishers.add(conn)

    def _on_durable(self, batch: list[PendingPublish], exc: BaseException | None) -> None:
        """A batch is on disk (or failed): route it and answer its publishers, in log order."""
        settled: list[Connection] = []
        for conn, packet_id, msg in batch:
            if conn is None and packet_id is not None:  # stored for a peer router
                self.remote.stored(packet_id, msg, exc)
                continue
            if conn is not None:
                conn.unsettled -= 1
                if not conn.unsettled and conn.pending is not None:
                    settled.append(conn)
                if msg.qos == 2 and conn.closing and conn.session is not None:
                    # its resumed session must not keep the id pending forever
                    self.remote.settle_resumed_qos2(conn.session, packet_id, exc)
            try:
                if exc is not None:
                    self._not_stored(conn, packet_id, msg.qos, exc)
                    continue
                if msg.retain:
                    self._retain(msg)
                self.route(msg)
                if msg.qos and conn is not None and not conn.closing and conn.session is not None:
                    ack_props = ({Prop.USER_PROPERTY: msg.log_position()} if conn.ack_offsets
                                 else None)
                    self._ack_publish(conn, msg.qos, packet_id, 0, ack_props)
            except Exception as err:  # noqa: BLE001 - stored; its publisher closed, unacked,
                fail_client(self.stats, conn, err)  # resends; the rest of the batch goes on
        for conn in settled:  # their held SUBSCRIBE/UNSUBSCRIBE, now after the acks above
            self._release_held(conn)
        if self._paused_publishers and self.logs is not None \
                and self.logs.held <= _HELD_LIMIT // 2:
            for paused in self._paused_publishers:
                if not paused.closing:
                    paused.partial_since = None  # packet_timeout counts from the resume
                    paused.transport.resume_reading()
            self._paused_publishers.clear()

    def _not_stored(self, conn: Connection | None, packet_id: int | None, qos: int,
                    err: BaseException) -> None:
        """Never acknowledge what was not stored: v5 gets a failure reason, 3.x a closed socket."""
        self.stats.dropped(DropReason.NOT_STORED)
        # at another router (its log's owner): its text says which and why, not our disk
        remote = isinstance(err, OwnerNotStored)
        self._log_not_stored("%s: %s (counted in meshmq_messages_dropped_total"
                             "{reason=\"not_stored\"})", "message not stored" if remote
                             else _NOT_STORED, err)
        if qos == 2 and conn is not None and conn.session is not None:
            # the id is the client's again, whatever its level: a 3.x client (closed below)
            # resends after reconnecting, and a pending id would swallow that resend for good
            conn.session.incoming_qos2.pop(packet_id, None)
        if conn is None or conn.closing or qos == 0:
            return
        if conn.level == 5:
            conn.inbound_unacked -= 1
            why = {Prop.REASON_STRING: str(err) if remote else _NOT_STORED}
            if qos == 1:
                conn.send(PubAck(packet_id, Reason.UNSPECIFIED_ERROR, why))
            else:
                conn.send(PubRec(packet_id, Reason.UNSPECIFIED_ERROR, why))
        else:
            conn.close()  # 3.x has no negative PUBACK: the client retries after reconnecting

    def _send_ack(self, conn: Connection, ptype: int, packet_id: int) -> None:
        """A success ack without properties: 4 fixed bytes, no encoder call on the hot path."""
        self.stats.packets_out[ptype] += 1
        conn.write(_ACK_HEAD[ptype] + packet_id.to_bytes(2, "big"))

    def _ack_publish(self, conn: Connection, qos: int, packet_id: int | None, reason: int,
                     props: dict | None = None) -> None:
        """Answer an inbound QoS 1/2 PUBLISH. [MQTT-3.3.4-7]: QoS 1 frees its receive-maximum
        slot at PUBACK, QoS 2 only at PUBCOMP (see _on_pubrel) unless refused here."""
        if qos == 1:
            conn.inbound_unacked -= conn.level == 5
            if reason or props:
                conn.send(PubAck(packet_id, reason, props))
            else:
                self._send_ack(conn, _PUBACK, packet_id)
        elif qos == 2:
            if reason < 0x80:
                conn.session.incoming_qos2[packet_id] = True
            else:
                conn.inbound_unacked -= conn.level == 5
            if reason or props:  # once the session owning the packet id is stored
                self.persist.stored(conn.session, conn.send, PubRec(packet_id, reason, props))
            else:
                self.persist.stored(conn.session, self._send_ack, conn, _PUBREC, packet_id)

    def _allowed(self, action: str, allowed: bool) -> bool:
        self.stats.acl(action, allowed)
        return allowed

    def publish_internal(self, msg: Message) -> None:
        """A message the broker itself publishes ($SYS): retained if flagged, routed, not
        logged (``$`` topics never are)."""
        if msg.retain:
            self._retain(msg)
        self.route(msg)

    def _retain(self, msg: Message) -> None:
        self.remote.keep_retained(msg)  # already in #retained with its publish (devicelogs)
        if self.forwarder is not None:
            self.forwarder.retained(msg)

    # -- routing ------------------------------------------------------------------------------
    def route(self, msg: Message, forward: bool = True) -> None:
        """Deliver to every matching session: one copy per session, at the best granted QoS;
        then to peer routers (``forward``: False for a message that came from one)."""
        match = self.trie.match(msg.topic)
        subs = match.subs
        sessions = self.sessions
        if len(subs) == 1:
            cid, sub = subs[0]
            replay = sub.replay
            if not (sub.no_local and cid == msg.origin) and (
                    replay is None or replay.accept_live(msg)):
                session = sessions[cid]
                ids = (sub.sub_id,) if sub.sub_id else None
                self._deliver(session, msg, sub.qos, sub.retain_as_published and msg.retain, ids,
                              position=replay is not None, live=True)
        elif subs:
            merged: dict[str, list] = {}
            for cid, sub in subs:
                if sub.no_local and cid == msg.origin:
                    continue
                if sub.replay is not None and not sub.replay.accept_live(msg):
                    continue
                entry = merged.get(cid)
                if entry is None:
                    merged[cid] = [sub.qos, sub.retain_as_published, [sub.sub_id],
                                   sub.replay is not None]
                else:  # overlapping filters: one copy, max QoS, every subscription id
                    if sub.qos > entry[0]:
                        entry[0] = sub.qos
                    entry[1] = entry[1] or sub.retain_as_published
                    if sub.sub_id not in entry[2]:  # each identifier once [MQTT-3.3.4-3]
                        entry[2].append(sub.sub_id)
                    entry[3] = entry[3] or sub.replay is not None
            for cid, (qos, rap, ids, position) in merged.items():
                sub_ids = tuple(i for i in ids if i) or None
                self._deliver(sessions[cid], msg, qos, rap and msg.retain, sub_ids,
                              position=position, live=True)
        groups = match.groups
        if self.forwarder is not None:  # the first router to route a message picks the members
            groups = self.forwarder.share(msg, groups) if forward else ()
        for group in groups:
            self.shared.deliver(group, msg)
        if forward and self.forwarder is not None:
            self.forwarder.forward(msg)

    def _deliver(
        self,
        session: Session,
        msg: Message,
        granted: int,
        retain: bool,
        sub_ids: tuple[int, ...] | None,
        group: SharedGroup | None = None,
        position: bool = False,
        live: bool = False,
    ) -> None:
        """``live``: routed from a just-stored (or unlogged) publish; a logged one may then be
        left to the log when the session is behind (broker/catchup.py)."""
        acl = self._acl
        if acl is not None and not self._allowed(
                "deliver", acl.can_deliver(session.username, session.client_id, msg.topic)):
            # A wildcard subscription may cover a topic whose read is denied (Mosquitto checks
            # read access per message for the same reason).
            self.stats.dropped(DropReason.NOT_AUTHORIZED)
            return
        qos = msg.qos if msg.qos < granted else granted  # [MQTT-3.3.5-1]
        if live and session.lag and group is None and msg.device is not None \
                and self.catchup.divert(session, msg, qos):
            return
        conn = session.conn
        if qos == 0:
            if conn is None:
                return  # QoS 0 is not queued for offline sessions (Mosquitto's default too)
            if conn.congested:
                self.stats.dropped(DropReason.SLOW_CONSUMER)
                return
            self._write_publish(session, conn, Delivery(msg, 0, retain, sub_ids, None, position))
            return
        if group is None and msg.device is not None and not position:
            positions = session.positions  # where a restart or move resumes (broker/positions)
            at = positions.get(msg.device)
            if at is None:
                if len(positions) >= self.positions.max_devices:
                    self.positions.full(session)
                positions[msg.device] = msg.offset + 1
            elif msg.offset >= at:  # never back: a retained message sent on SUBSCRIBE is old
                positions[msg.device] = msg.offset + 1
        delivery = Delivery(msg, qos, retain, sub_ids, group, position)
        if conn is not None and not session.queue and len(session.inflight) < session.window:
            self._send_inflight(session, conn, delivery)
            return
        if live and group is None and msg.device is not None and self.catchup is not None:
            # (no commit log here, in a cluster: a peer's logged message is queued as a copy)
            catchup = self.catchup
            if catchup.must_fall_behind(session) and catchup.fall_behind(session, msg):
                return  # the log holds it: the session reads it from there, no copy kept
            delivery.live = True
        self._enqueue(session, delivery)

    def _remote_logs(self) -> tuple | None:
        """(owner_of, fetch) in a cluster: catch-up reads logs other routers own from them."""
        fw = self.forwarder
        return None if fw is None else (fw.owner_of, fw.fetch)

    def _deliver_from_log(self, session: Session, msg: Message, granted: int, retain: bool,
                          sub_ids: tuple[int, ...] | None, position: bool) -> None:
        self._deliver(session, msg, granted, retain, sub_ids, position=position)

    def _enqueue(self, session: Session, delivery: Delivery) -> None:
        queue = session.queue
        mqtt = self.mqtt
        size = delivery_bytes(delivery)
        over_bytes = self.limits.queue_bytes_full(session, size)
        if len(queue) >= mqtt.max_queued_messages or over_bytes:
            policy = mqtt.queue_full_policy
            self.stats.dropped(DropReason.QUEUE_FULL)
            if policy is QueueFullPolicy.DROP_OLDEST:
                if not queue.make_room(size, mqtt.max_queued_bytes, self.stats):
                    return  # larger than the whole bound: only the new one can go
            elif policy is QueueFullPolicy.DROP_NEW:
                return
            else:
                if session.conn is not None:
                    log.warning("disconnecting client: queue full",
                                extra={"client_id": session.client_id})
                    session.conn.close(Reason.QUOTA_EXCEEDED)
                return
        queue.append(delivery)

    def _send_inflight(self, session: Session, conn: Connection, delivery: Delivery) -> None:
        delivery.pid = session.allocate_pid()
        delivery.state = Delivery.SENT
        session.inflight[delivery.pid] = delivery
        if not self._write_publish(session, conn, delivery):
            # too large for this client: "treated as if sent" [MQTT-3.1.2-25], never retried
            del session.inflight[delivery.pid]

    def _write_publish(self, session: Session, conn: Connection, d: Delivery,
                       dup: bool = False) -> bool:
        msg = d.msg
        v5 = conn.level == 5
        aliases = conn.out_aliases
        if aliases is not None:
            head, tail = aliased_parts(d, aliases, session.alias_max)
        else:
            head, tail = msg.parts(v5, d.qos, d.retain, d.sub_ids, d.position)
        size = len(head) + len(tail) + (2 if d.qos else 0)
        if session.max_packet_size and size > session.max_packet_size:
            self.stats.dropped(DropReason.TOO_LARGE)
            return False
        if dup:
            head = bytes((head[0] | 0x08,)) + head[1:]
        if d.qos:
            conn.write(head + d.pid.to_bytes(2, "big") + tail)
        else:
            conn.write(head + tail)
        self.stats.packets_out[_PUBLISH] += 1
        self.stats.messages_out += 1
        self.stats.messages_out_qos[d.qos] += 1
        return True

    def _pump(self, session: Session) -> None:
        """Move queued deliveries into the window while the client can take them."""
        conn = session.conn
        if conn is None:
            return
        queue = session.queue
        inflight = session.inflight
        window = session.window
        now = time.monotonic()
        while queue and len(inflight) < window and not conn.congested:
            delivery = queue.popleft()
            if delivery.msg.expiry_at is not None and delivery.msg.expired(now):
                self.stats.dropped(DropReason.EXPIRED)
                continue
            self._send_inflight(session, conn, delivery)

    def _resend_inflight(self, session: Session, conn: Connection) -> None:
        """[MQTT-4.4.0-1]: on a resumed session, resend unacked PUBLISH (DUP=1) and PUBREL."""
        for delivery in list(session.inflight.values()):
            if delivery.state == Delivery.RELEASED:
                conn.send(PubRel(delivery.pid))
            elif not self._write_publish(session, conn, delivery, dup=True):
                del session.inflight[delivery.pid]

    # -- acks from subscribers -----------------------------------------------------------------
    def _settle_puback(self, conn: Connection, pkt: PubAck) -> bool:
        """End a QoS 1 flow; True when it freed window room (the caller refills the window)."""
        session = conn.session
        if session is None:
            return False
        delivery = session.inflight.get(pkt.packet_id)
        if delivery is not None and delivery.qos == 1:
            del session.inflight[pkt.packet_id]
            return True
        return False

    def _window_freed(self, session: Session) -> None:
        """An ack ended a flow: refill the window from the queue, then from replay cursors."""
        if session.queue:
            self._pump(session)
        # max(1, ...): with Receive Maximum 1, window // 2 is 0 and replay never resumed.
        if session in self._replaying and len(session.queue) < max(1, session.window // 2):
            self._pump_replays(session)
        if session.lag_behind:
            self.catchup.pump(session)

    def _on_pubrec(self, conn: Connection, pkt: PubRec) -> None:
        session = conn.session
        if session is None:
            return
        delivery = session.inflight.get(pkt.packet_id)
        if delivery is None or delivery.qos != 2:
            if conn.level == 5:
                conn.send(PubRel(pkt.packet_id, Reason.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if pkt.reason_code >= 0x80:  # the subscriber refused it: the flow ends here
            del session.inflight[pkt.packet_id]
            self._window_freed(session)
            return
        delivery.state = Delivery.RELEASED
        conn.send(PubRel(pkt.packet_id))

    def _on_pubrel(self, conn: Connection, pkt: PubRel) -> None:
        session = conn.session
        if session is None:
            return
        if session.incoming_qos2.get(pkt.packet_id):
            del session.incoming_qos2[pkt.packet_id]
            conn.inbound_unacked -= conn.level == 5
            self.persist.stored(session, self._send_ack, conn, _PUBCOMP, pkt.packet_id)
        else:
            conn.send(PubComp(pkt.packet_id,
                              Reason.PACKET_IDENTIFIER_NOT_FOUND if conn.level == 5 else 0))

    def _on_pubcomp(self, conn: Connection, pkt: PubComp) -> None:
        session = conn.session
        if session is None:
            return
        delivery = session.inflight.get(pkt.packet_id)
        if delivery is not None and delivery.state == Delivery.RELEASED:
            del session.inflight[pkt.packet_id]
            self._window_freed(session)

    # -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------------
    def _on_subscribe(self, conn: Connection, pkt: Subscribe) -> None:
        session = conn.session
        if session is None:
            return
        mqtt = self.mqtt
        v5 = conn.level == 5
        sub_id = None
        if pkt.properties:
            ids = pkt.properties.get(Prop.SUBSCRIPTION_IDENTIFIER)
            if ids:
                sub_id = ids[0]
        codes: list[int] = []
        retained_out: list[tuple[Subscription, list[Message]]] = []
        replays: list[Subscription] = []
        reasons: list[str] = []
        resolving: list[tuple[int, str, Subscription, Subscription | None]] = []
        offset_req, reset = offset_request(pkt.properties)
        for flt, opts in pkt.subscriptions:
            sub_offset = offset_req
            if flt.startswith("$replay/"):
                # 3.1.1 has no user properties: "$replay/{offset}/{filter}" asks the same thing
                _, sub_offset, flt = (flt.split("/", 2) + ["", ""])[:3]
                key_flt = "$replay/" + sub_offset + "/" + flt
            else:
                key_flt = flt
            group, real = parse_shared(flt)
            if not is_valid_topic_filter(flt):
                if not v5 or not flt:
                    # 3.1.1: a protocol violation closes the connection [MQTT-4.8.0-1]; an empty
                    # filter is malformed in v5 too [MQTT-4.7.3-1], not merely not allowed (0x8F)
                    self.protocol_error(conn, ProtocolError(
                        Reason.PROTOCOL_ERROR if v5 else Reason.TOPIC_FILTER_INVALID,
                        f"invalid topic filter {flt!r}"))
                    return
                codes.append(Reason.TOPIC_FILTER_INVALID)
                continue
            if group is not None and opts.no_local:
                # [MQTT-3.8.3-4]: No Local on a shared subscription is a protocol error
                self.protocol_error(conn, ProtocolError(Reason.PROTOCOL_ERROR,
                                                        "no local on a shared subscription"))
                return
            if too_many_levels(real, mqtt.max_topic_levels):
                reasons.append("filter: " + self.limits.deep_topic(conn, real))
                codes.append(Reason.TOPIC_FILTER_INVALID if v5 else SUBACK_FAILURE_V3)
                continue
            if group is not None and not mqtt.shared_subscriptions:
                codes.append(Reason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if v5 else SUBACK_FAILURE_V3)
                continue
            if not mqtt.wildcard_subscriptions and has_wildcards(real):
                codes.append(Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED if v5
                             else SUBACK_FAILURE_V3)
                continue
            acl = self._acl
            if acl is not None and not self._allowed(
                    "subscribe", acl.can_subscribe(conn.username, conn.client_id, real)):
                log.info("subscribe denied by ACL", extra={"client_id": conn.client_id,
                                                           "filter": flt})
                codes.append(Reason.NOT_AUTHORIZED if v5 else SUBACK_FAILURE_V3)
                continue
            granted = min(opts.qos, mqtt.max_qos)
            sub = Subscription(real, granted, opts.no_local, opts.retain_as_published,
                               opts.retain_handling, sub_id, group)
            if sub_offset is not None:
                cursor, why = (self.logs.open_cursor(real, group, sub_offset, reset)
                               if self.logs is not None else
                               (None, "offset replay needs the commit log, which is disabled"))
                if cursor is None:
                    reasons.append(why)
                    codes.append(Reason.IMPLEMENTATION_SPECIFIC_ERROR if v5
                                 else SUBACK_FAILURE_V3)
                    continue
                sub.replay = cursor
                replays.append(sub)
            old = session.subscriptions.get(key_flt)
            if sub.replay is not None and sub.replay.owner is not None:
                resolving.append((len(codes), key_flt, sub, old))
            is_new = old is None
            if old is not None:
                sub.since_us = old.since_us  # a resubscribe keeps what the session is owed
            session.has_no_local = session.has_no_local or opts.no_local
            session.subscriptions[key_flt] = sub
            self.trie.add(real, session.client_id, sub, group)
            codes.append(granted)
            if sub.replay is not None:
                continue  # history comes from the log, not from the retained store
            # [MQTT-3.3.1-9..11]: retained messages on subscribe, per Retain Handling; never
            # for shared subscriptions [MQTT-3.8.4-? / v5 4.8.2].
            if group is None and (opts.retain_handling == 0
                                  or (opts.retain_handling == 1 and is_new)):
                found = self.retained.match(real)
                if found:
                    retained_out.append((sub, found))
        if resolving:  # offset replays of logs other routers own: they say where each starts
            self.remote_replays.resolve(conn, session, resolving, codes, reasons, replays,
                                        lambda: self._suback(conn, session, pkt.packet_id, codes,
                                                             reasons, retained_out, replays))
            return
        self._suback(conn, session, pkt.packet_id, codes, reasons, retained_out, replays)

    def _suback(self, conn: Connection, session: Session, packet_id: int, codes: list[int],
                reasons: list[str], retained_out: list[tuple[Subscription, list[Message]]],
                replays: list[Subscription]) -> None:
        props = ({Prop.REASON_STRING: "; ".join(reasons)} if reasons and conn.level == 5
                 else None)
        self.persist.stored(session, self._subscribed, conn, session,
                            Suback(packet_id, codes, props), retained_out, replays)

    def _subscribed(self, conn: Connection, session: Session, suback: Suback,
                    retained_out: list[tuple[Subscription, list[Message]]],
                    replays: list[Subscription]) -> None:
        """SUBACK (once a persistent session's subscriptions are stored), then retained."""
        conn.send(suback)
        for sub, messages in retained_out:
            ids = (sub.sub_id,) if sub.sub_id else None
            for msg in messages:
                self._deliver(session, msg, sub.qos, True, ids)
        if replays:
            self._replaying.add(session)
            self._pump_replays(session)

    _pump_replays = pump_replays  # broker/replay.py: offset replay, paced by the window

    def _on_unsubscribe(self, conn: Connection, pkt: Unsubscribe) -> None:
        session = conn.session
        if session is None:
            return
        for flt in pkt.topic_filters:
            if not is_valid_topic_filter(flt):
                # [MQTT-4.7.3-1], [MQTT-4.7.1-2]: malformed; 3.1.1 closes [MQTT-4.8.0-1], v5
                # sends DISCONNECT 0x82 (a well-formed filter is never refused here).
                self.protocol_error(conn, ProtocolError(
                    Reason.PROTOCOL_ERROR, f"invalid topic filter {flt!r} in UNSUBSCRIBE"))
                return
        codes = []
        for flt in pkt.topic_filters:
            sub = session.subscriptions.pop(flt, None)
            if sub is None:
                codes.append(Reason.NO_SUBSCRIPTION_EXISTED)
                continue
            self.trie.remove(sub.filter, session.client_id, sub.group)
            codes.append(Reason.SUCCESS)
            if sub.group is not None:
                self.shared.redispatch(session, only_group=sub)
        self.persist.stored(session, conn.send,
                            Unsuback(pkt.packet_id, codes if conn.level == 5 else []))

    def _on_pingreq(self, conn: Connection, _pkt: Packet) -> None:
        conn.send(PingResp())

    def _on_auth(self, conn: Connection, _pkt: Packet) -> None:
        self.protocol_error(conn, ProtocolError(Reason.PROTOCOL_ERROR,
                                                "AUTH without enhanced authentication"))

    def _on_disconnect(self, conn: Connection, pkt: Disconnect) -> None:
        session = conn.session
        if session is None:
            return
        if conn.level == 5 and pkt.properties:
            expiry = pkt.properties.get(Prop.SESSION_EXPIRY_INTERVAL)
            if expiry is not None:
                if session.expiry_interval == 0 and expiry != 0:
                    # [MQTT-3.14.2-2]
                    self.protocol_error(conn, ProtocolError(
                        Reason.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0"))
                    return
                if self.mqtt.max_session_expiry and expiry > self.mqtt.max_session_expiry:
                    expiry = self.mqtt.max_session_expiry
                session.expiry_interval = expiry
        # 0x04 "disconnect with will message" keeps the will; anything else discards it.
        conn.clean_disconnect = pkt.reason_code != Reason.DISCONNECT_WITH_WILL
        conn.close_reason = f"client sent DISCONNECT (reason 0x{pkt.reason_code:02X})"
        if conn.clean_disconnect:
            conn.will = None
        conn.close()

    # -- session end, wills, timers ---------------------------------------------------------------
    def _connection_closed(self, session: Session, conn: Connection, abnormal: bool) -> None:
        now = time.monotonic()
        if conn.will is not None and abnormal:
            delay = conn.will_delay
            if delay <= 0 or session.expiry_interval == 0:
                self._publish_will(conn.will)
            else:
                session.will = conn.will
                due = now + min(delay, session.expiry_interval)
                session.will_due = due
                heapq.heappush(self._timers, (due, next(self._seq), "will", session))
            conn.will = None
        if session.expiry_interval == 0:
            self._end_session(session)
            return
        for old in self.limits.went_offline(session):
            self._end_session(old)
        if session.conn is not None or self.sessions.get(session.client_id) is not session:
            return  # ended just now (max_offline_sessions = 0)
        self.persist.went_offline(session)  # (written with this tick's batch)
        # a shared subscriber going offline: its unacked shares go to members still online
        self.shared.redispatch(session)
        if session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
            heapq.heappush(self._timers, (session.expires_at, next(self._seq), "expiry", session))

    def _end_session(self, session: Session) -> None:
        self._replaying.discard(session)
        self.persist.ended(session)
        if self.catchup is not None:
            self.catchup.forget(session)
        self.limits.offline.back(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        for sub in session.subscriptions.values():
            self.trie.remove(sub.filter, session.client_id, sub.group)
        self.shared.redispatch(session)
        if session.will is not None:  # the session ends before the will delay ran out
            self._publish_will(session.will)
            session.will = None
        session.subscriptions.clear()
        session.inflight.clear()
        session.queue.clear()

    def _publish_will(self, will: Will) -> None:
        props = will.properties or {}
        interval = props.get(Prop.MESSAGE_EXPIRY_INTERVAL)
        expiry_at = time.monotonic() + interval if interval is not None else None
        msg = Message(will.topic, will.payload, will.qos, will.retain,
                      _forwarded_properties(props), expiry_at, None)
        logs = self.logs
        if logs is not None:
            key = logs.key_for(will.topic, will.retain)
            owner = self.forwarder.owner_of(key) if self.forwarder and key else None
            if owner is not None:
                self.remote.append_at_owner(owner, key, msg, None, None, interval)
                return
            if key is not None:
                # stored first, like any logged publish: _on_durable routes it once durable
                try:
                    logs.append(key, msg, None, None, interval)
                except LogWriteError as err:
                    self._not_stored(None, None, will.qos, err)
                return
        if will.retain:
            self._retain(msg)
        self.route(msg)

    def _sweep(self) -> None:
        """Keepalive, connect timeout, delayed wills and session expiry, twice a second."""
        now = time.monotonic()
        connect_timeout = self.mqtt.connect_timeout
        for conn in list(self.connections):
            if conn.closing:
                continue
            if conn.session is None:
                if conn.pending is None and now - conn.accepted_at > connect_timeout:
                    self._log_no_connect("closing connection: no CONNECT within %.0f s",
                                         connect_timeout, extra={"peer": conn.peer})
                    conn.listener.rejected += 1
                    conn.abort()
            elif conn.keepalive and now - conn.last_rx > conn.keepalive * 1.5 \
                    and conn.pending is None and conn not in self._paused_publishers:
                # (not while we hold its packets and do not read: its PINGREQs wait unread)
                # [MQTT-3.1.2-24]: 1.5 × keepalive without a packet → disconnect (will is sent)
                conn.close_reason = f"keepalive timeout (nothing for 1.5 x {conn.keepalive} s)"
                conn.close(Reason.KEEP_ALIVE_TIMEOUT)
            elif conn not in self._paused_publishers and self.limits.packet_overdue(conn, now):
                conn.abort()  # mid-packet: nothing we write could be read as a packet anyway
        self._log_no_connect.tick()
        self._log_not_stored.tick()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, session = heapq.heappop(timers)
            if kind == "will":
                due = session.will_due
                if session.will is not None and due is not None and due <= now:
                    will, session.will, session.will_due = session.will, None, None
                    self._publish_will(will)
            elif session.conn is None and session.expires_at is not None \
                    and session.expires_at <= now:
                log.debug("session expired", extra={"client_id": session.client_id})
                self._end_session(session)
        self._sweep_handle = self.loop.call_later(_SWEEP_INTERVAL, self._sweep)
