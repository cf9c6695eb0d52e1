"""The router: one per process, the single owner of sessions, subscriptions, retained and wills.

Connections hand it whole batches of packets (one call per socket read) and it answers by queueing
bytes on connections, which flush once per loop tick. Nothing here awaits per message: the only
awaits are CONNECT authentication with a password file (scrypt runs in a worker thread) and
shutdown.
The router never imports the cluster: the node wiring will hand it a forwarder (rumqttd's
router/link split; see docs/architecture.md).

This file keeps the router's state, its packet dispatch and the per-tick write flush; the rest
of the router lives in rooms, mixins of ``Router`` named for what they do (rumqttd's router keeps
routing, logs, scheduling and iobufs apart; Mosquitto has one ``handle_*.c`` per packet):

| room | what |
|---|---|
| ``handle_connect.py`` | CONNECT (auth, takeover, claim, CONNACK), PINGREQ, AUTH, DISCONNECT |
| ``handle_publish.py`` | a client's PUBLISH: the checks, then ingest or the owner router |
| ``publishrun.py`` | a run of plain QoS 0 publishes on one topic, routed once |
| ``handle_acks.py`` | PUBACK, PUBREC, PUBCOMP from subscribers, PUBREL from publishers |
| ``handle_subscribe.py`` | SUBSCRIBE (retained, offset replays), UNSUBSCRIBE |
| ``ingest.py`` | log or route, append, settle once durable, publisher acks, wills |
| ``delivery.py`` | route, deliver, queue, window pump, writes |
| ``sessionend.py`` | connection closed, session end, timers, the sweep |

Calls go down that table (handlers -> ingest -> delivery; session end -> ingest), never up. A
room's methods run with the router as ``self``, so a room is the router's own implementation
and may use its private names; mixins rather than objects holding the router because the hot
calls (dispatch -> ``_on_publish`` -> ``route`` -> ``deliver`` -> ``_write_publish``) then stay
one bound-method call each, as before the split. Everything else reaches the router through the
public port, ``broker/port.py`` (``tests/test_lint.py`` keeps it so).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from broker.auth import Authenticator
from broker.authgate import PasswordCheckGate
from broker.catchup import LogCatchUp
from broker.clientid import ClientIdPolicy
from broker.connection import Connection, fail_client
from broker.cursors import LogSource
from broker.delivery import DeliveryRoom
from broker.devicelogs import DeviceLogs
from broker.forwarding import Forwarder, RemotePublishes, RemoteSessions
from broker.gatehold import HeldPublishes
from broker.handle_acks import AckRoom
from broker.handle_connect import ConnectRoom
from broker.handle_publish import PublishRoom
from broker.handle_subscribe import SubscribeRoom
from broker.ingest import IngestRoom
from broker.limits import RouterLimits
from broker.loggedrun import LoggedRunRoom
from broker.lograte import RateLimitedLog
from broker.logrules import LogRules
from broker.positions import DeliveredPositions
from broker.protocol.errors import ProtocolError, UnsupportedProtocolVersion
from broker.protocol.packets import Connack, Packet, PacketType
from broker.protocol.reasons import Reason
from broker.pubdedupe import for_router
from broker.publishrun import PublishRunRoom
from broker.replay import Replays
from broker.retained import RetainedStore
from broker.retainpace import RetainedPacer
from broker.session import Session
from broker.sessionend import SWEEP_INTERVAL, SessionEndRoom
from broker.sessionstore import NO_PERSISTENCE, SessionHooks
from broker.settings import BrokerSettings
from broker.shared import SharedDelivery
from broker.stats import BrokerStats
from broker.trie import SubscriptionTrie
from commitlog.groupcommit import GroupCommitter

log = logging.getLogger("broker.router")

# Inside one long read, write what is routed so far once this much time has passed (checked every
# _FLUSH_EVERY packets): it bounds how long a subscriber's message waits behind the rest of the
# read, while a short read still costs one write per connection per tick.
FLUSH_AFTER_S = 0.002
_FLUSH_EVERY = 16
_PUBLISH = PacketType.PUBLISH
_PUBACK = PacketType.PUBACK
_HELD_TYPES = (PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE)


class Router(ConnectRoom, PublishRoom, PublishRunRoom, LoggedRunRoom, AckRoom, SubscribeRoom,
             IngestRoom, DeliveryRoom, SessionEndRoom):
    """State, dispatch and flush; the rooms (mixins, see the module docstring) do the rest."""

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
        self.replays = Replays(self)  # offset replay (broker/replay.py)
        if committer is not None:
            self.logs = DeviceLogs(committer, log_rules or LogRules(), self._on_durable, self.loop)
            # on a single node only when asked (mqtt.publisher_dedupe); the node wiring
            # makes one for a cluster (broker/pubdedupe.py)
            self.logs.dedupe = for_router(committer, self.mqtt, clustered=False)
            # one reader of device logs, here or at their leader (broker/cursors.py)
            self.replays.source = source = LogSource(committer.store, stats, self.loop,
                                                     self._forwarder)
            self.catchup = LogCatchUp(source, stats, self.deliver,
                                      (self.mqtt.max_queued_messages,
                                       self.mqtt.max_queued_bytes),
                                      self.mqtt.max_lagging_devices, self.loop.call_soon)
            self.catchup.deliver_run = self._deliver_read
        self.positions = DeliveredPositions(self.sessions, self.catchup, self.replays, stats,
                                            self.mqtt.max_lagging_devices)
        self._paused_publishers: set[Connection] = set()
        # Connections with a retained publish on an unlogged topic waiting for the disk
        # (broker/ingest.py _append): their later publishes wait behind it (see _handle_packets)
        self._retain_waits: set[Connection] = set()
        self.forwarder: Forwarder | None = None  # set by the node wiring in a cluster
        # None, or a callable answering None or why QoS>=1 publishes to device logs are
        # refused now (broker/writegate.py; a cluster router's leader lease, cluster/lease.py)
        self.write_gate: Callable[[], Any] | None = None
        # QoS>=1 publishes waiting for that gate to open again (a Raft election), in order
        self.gate_held = HeldPublishes(self.release_held, 10_000)
        self.remote = RemotePublishes(self)
        self.sessions_remote = RemoteSessions(self)
        self.registry: Any = None  # broker.registry.RegisteredSessions (set by the wiring)
        self._pump_replays = self.replays.pump  # bound once: called per ack and drain
        self._replaying = self.replays.replaying  # the same set, read per ack
        self.shared = SharedDelivery(self)
        # retained messages owed on SUBSCRIBE, sent as the window frees (broker/retainpace.py)
        self.retained_pacer = RetainedPacer(self)
        self._retained_owed = self.retained_pacer.pending  # read per ack
        self._log_no_connect = RateLimitedLog(log, logging.INFO,
                                              "connections closed for sending no CONNECT",
                                              burst=10, window=5.0)
        # A full disk refuses every publish: one ERROR line a second, then a count.
        self._log_not_stored = RateLimitedLog(log, logging.ERROR,
                                              "publishes refused as not stored",
                                              burst=1, window=1.0)
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
        self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL, self._sweep)

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
            "retained_pending": self.retained_pacer.waiting(),
            "retained_paced_sessions": len(self.retained_pacer.pending),
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
        self._retain_waits.discard(conn)
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
            if session in self._retained_owed:
                self.retained_pacer.pump(session)

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
        # Before no_run a run (broker/publishrun.py) was looked for and refused, so those go
        # one by one without looking again; all of them where an ACL rules runs out (no
        # per-packet look at all).
        no_run = 0 if self._acl is None else len(packets)
        last = len(packets) - 1
        check_at = _FLUSH_EVERY - 1  # (a run moves i past several at once)
        walk = enumerate(packets)
        retain_waits = self._retain_waits  # almost always empty: one truth test a publish
        for i, packet in walk:
            if conn.closing:
                return
            if i >= check_at:
                check_at = i + _FLUSH_EVERY
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
                if retain_waits and conn in retain_waits:
                    # A retained publish on an unlogged topic is routed once its retained
                    # record is durable; what this client publishes after it would be routed
                    # at once, ahead of it: [MQTT-4.6.0-6] wants its subscribers to see one
                    # topic's messages in the order sent. So the rest waits, as a SUBSCRIBE
                    # behind unsettled publishes does (released when all are settled, by
                    # whichever path settles the last one).
                    if conn.unsettled:
                        packets_in[ptype] -= 1
                        self._hold(conn, packets[i:])
                        break
                    retain_waits.discard(conn)
                if i >= no_run and i < last and packet.qos < 2:
                    # a run of QoS 0 publishes routed once, or of QoS 1 ones stored once
                    end = (self._logged_run(conn, packets, i) if packet.qos else
                           self._publish_run(conn, packets, i))
                    if end > 0:  # up to end: step over them (itertools' consume)
                        skip = end - i - 1
                        next(itertools.islice(walk, skip, skip), None)
                        continue
                    no_run = -end
                self._on_publish(conn, packet)
            elif ptype == _PUBACK:
                # A subscriber acks in batches: one _pump moving 100 queued messages after the
                # read is cheaper than 100 pumps moving one each, and sends them in one write.
                # The ack ends its QoS 1 flow here, inline (AckRoom's PUBACK, the subscriber's
                # answer to every QoS 1 delivery: a method call per message saved, issue 25);
                # a PUBACK for no flow, or for a QoS 2 one, is ignored.
                session = conn.session
                if session is not None:
                    inflight = session.inflight
                    delivery = inflight.get(packet.packet_id)
                    if delivery is not None and delivery.qos == 1:
                        del inflight[packet.packet_id]
                        freed = session
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

    # -- held packets and the ACL counter (used by several rooms) -------------------------------
    def _hold(self, conn: Connection, packets: list[Packet]) -> None:
        """Stop reading ``conn`` and keep ``packets`` until its publishes are settled."""
        conn.pending = list(packets)
        conn.transport.pause_reading()

    def release_held(self, conn: Connection) -> None:
        """``conn``'s publishes are all settled: process the packets held behind them."""
        pending, conn.pending = conn.pending or [], None
        if conn.closing or conn.session is None:
            return
        conn.transport.resume_reading()
        self.handle_packets(conn, pending)

    def _allowed(self, action: str, allowed: bool) -> bool:
        """Count an ACL decision (meshmq_acl_checks_total) and pass it through."""
        self.stats.acl(action, allowed)
        return allowed
