"""A client connection: a thin I/O shell around the sans-I/O protocol.

In the spirit of rumqttd's links, a connection does no MQTT logic: it turns each socket read into a
*batch* of packets for the router (one call per read, however many packets it holds), and collects
everything the router writes to it into a single ``transport.write``: the router flushes every
connection it wrote to once per loop tick, and every 2 ms inside a long read
(``Router.handle_packets``). There is no task, ``await`` or ``drain()`` per message: asyncio's
Protocol callbacks are the cheapest path uvloop offers. Flow control comes from the transport's
write-buffer watermarks: past ``write_buffer_limit`` the connection reports itself congested and
the router stops feeding it (QoS 0 is dropped and counted; QoS>0 waits in the session queue).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from broker.protocol.connection import ServerProtocol
from broker.protocol.errors import ProtocolError
from broker.protocol.packets import Disconnect, Packet, Will
from broker.stats import BrokerStats, ListenerStats

log = logging.getLogger("broker.connection")

_TLS_HANDSHAKE = 0x16  # first byte of a TLS record carrying a ClientHello
# How long a server-side close after a protocol error keeps reading what the client still sends
# (``Connection.close(drain=True)``): long enough for a client to read the DISCONNECT and close,
# short enough that a client that never closes holds its socket only briefly.
DRAIN_S = 2.0


class ConnectionOwner(Protocol):
    """What a connection needs of its router (``broker/router.py`` implements it): declared
    here, at the bottom of the import graph, so this module imports nothing above it (the
    connection is the transport under the router, as a link is under the mesh)."""

    settings: Any  # broker.settings.BrokerSettings
    loop: asyncio.AbstractEventLoop

    def connection_made(self, conn: Connection) -> None: ...
    def handle_packets(self, conn: Connection, packets: list[Packet]) -> None: ...
    def protocol_error(self, conn: Connection, err: ProtocolError) -> None: ...
    def writable(self, conn: Connection) -> None: ...
    def connection_lost(self, conn: Connection) -> None: ...
    def want_flush(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    # Slots, not a __dict__: a broker holds one of these per client, most of them idle, and
    # with ~35 attributes the instance dict (a split-keys dict past its 30-key limit) cost
    # 1,584 bytes per connection against ~330 for the slots (issue 25: RSS per idle
    # connection; Mosquitto's ``struct mosquitto`` is one flat allocation for the same reason).
    # An attribute set from outside must be declared here (an AttributeError otherwise).
    __slots__ = (
        "router", "listener", "stats", "proto", "write_limit", "transport", "peer", "_peer_host",
        "partial_since", "session", "client_id", "username", "level", "keepalive",
        "accepted_at", "last_rx", "will", "will_delay", "pending", "out_aliases",
        "inbound_unacked", "unsettled", "bytes_in", "bytes_out", "close_reason", "ack_offsets",
        "closing", "clean_disconnect", "trusted", "claimed", "_first", "_out", "_out_bytes",
        "_queued", "_write_paused",
    )

    def __init__(self, router: ConnectionOwner, listener: ListenerStats,
                 stats: BrokerStats) -> None:
        settings = router.settings.mqtt
        # An in-process client the node itself opened (the MQTT bridge's own session on this
        # broker, meshmq/bridge.py): its CONNECT skips the password check, as Mosquitto's
        # bridge's local side does. A listener never sets it; the ACL still applies (client
        # $bridge/<name>).
        self.trusted = False
        # The CONNECT is being claimed cluster-wide (broker/registry.py, broker/forwarding.py)
        self.claimed = False
        self.router = router
        self.listener = listener
        self.stats = stats
        self.proto = ServerProtocol(settings.max_packet_size, settings.topic_alias_maximum,
                                    settings.max_connect_packet_size)
        self.write_limit = settings.write_buffer_limit
        self.transport: asyncio.BaseTransport | Any = None
        self.peer = "?"
        self._peer_host: str | None = None  # see peer_host
        # when the unfinished packet the parser holds was started (mqtt.packet_timeout), or None
        self.partial_since: float | None = None
        # broker.session.Session once CONNECT succeeded; the session module sits above this
        # one (a session holds its connection), so the type is named, not imported
        self.session: Any = None
        self.client_id: str | None = None
        self.username: str | None = None
        self.level = 4
        self.keepalive = 0
        self.accepted_at = time.monotonic()
        self.last_rx = self.accepted_at
        self.will: Will | None = None
        self.will_delay = 0
        # Packets that arrived while CONNECT was still being authenticated (password hashing runs
        # in a worker thread), or behind a SUBSCRIBE held until earlier publishes are settled;
        # replayed in order once the CONNACK is sent / the publishes are settled.
        self.pending: list[Packet] | None = None
        self.out_aliases: dict[str, int] | None = None
        self.inbound_unacked = 0  # QoS>0 PUBLISH received and not yet acknowledged (v5 Receive Max)
        # Publishes appended to the log and not yet settled (stored or refused): a SUBSCRIBE
        # after them waits in ``pending`` until they are (the router's ordering rule).
        self.unsettled = 0
        self.bytes_in = 0  # for the disconnect log line (Mosquitto logs the same on close)
        self.bytes_out = 0
        self.close_reason: str | None = None  # why we closed it, for that line
        self.ack_offsets = False  # v5 PUBACK/PUBREC carry device/offset (opt-in, see router)
        self.closing = False
        self.clean_disconnect = False  # DISCONNECT 0x00 received: the will is discarded
        self._first = True
        # what the router wrote since the last flush: None while nothing (most connections,
        # most of the time: an empty list per idle connection is 56 bytes, issue 25)
        self._out: list[bytes] | None = None
        self._out_bytes = 0
        self._queued = False  # in the router's list of connections to flush
        self._write_paused = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"{peer[0]}:{peer[1]}"
        set_limits = getattr(transport, "set_write_buffer_limits", None)
        if set_limits is not None:
            set_limits(high=self.write_limit)
        self.listener.connections_current += 1
        self.listener.connections_total += 1
        self.router.connection_made(self)

    def data_received(self, data: bytes) -> None:
        self.listener.bytes_in += len(data)
        self.bytes_in += len(data)
        self.last_rx = time.monotonic()
        if self._first:
            self._first = False
            if data and data[0] == _TLS_HANDSHAKE:
                log.warning(
                    "closing connection: the client is speaking TLS to a plain MQTT port; "
                    "point it at the TLS listener or disable TLS in the client",
                    extra={"peer": self.peer, "listener": self.listener.name},
                )
                self.listener.rejected += 1
                self.abort()
                return
        if self.closing:
            return
        try:
            self._received(data)
        except Exception as exc:  # noqa: BLE001 - never let one client's bytes escape to uvloop
            # ("Fatal error on transport" and a torn-down socket with no log of which client)
            fail_client(self.stats, self, exc)

    def _received(self, data: bytes) -> None:
        try:
            packets = self.proto.receive_data(data)
        except ProtocolError as err:
            # Valid packets that arrived ahead of the bad bytes are still handled: a QoS 1
            # publish before garbage is stored and acknowledged, not silently lost.
            if err.packets and self.pending is None:
                self.router.handle_packets(self, err.packets)
            self.router.protocol_error(self, err)
            return
        if self.proto.buffered:
            # a packet is unfinished: its deadline runs from the read that started it (a read
            # that completed packets started a new one; a read that did not continues it)
            if packets or self.partial_since is None:
                self.partial_since = self.last_rx
        else:
            self.partial_since = None
        if not packets:
            return
        if self.pending is not None:
            self.pending.extend(packets)
            return
        self.router.handle_packets(self, packets)

    def eof_received(self) -> bool:
        return False  # close our side too; the router treats it as an abrupt close

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self.router.writable(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.connections_current -= 1
        self._out = None
        self.closing = True
        self.router.connection_lost(self)

    @property
    def peer_host(self) -> str:
        """The address alone, for what is per address (the failed-login lockout): ``peer``
        without its port, computed when asked (only a CONNECT with a password asks) instead of
        a second string held per connection; unless set (the bridge names its own)."""
        host = self._peer_host
        if host is None:
            host = self.peer.rpartition(":")[0] or self.peer  # IPv6 too: "::1:1883" -> "::1"
        return host

    @peer_host.setter
    def peer_host(self, host: str) -> None:
        self._peer_host = host

    @property
    def write_paused(self) -> bool:
        """The transport asked us to stop writing (its buffer is past the high-water mark):
        ``writable`` comes when it drains. (``congested`` also counts this tick's unflushed
        bytes, which the next flush clears without any callback.)"""
        return self._write_paused

    # -- writing ------------------------------------------------------------------------------
    @property
    def congested(self) -> bool:
        return self._write_paused or self._out_bytes > self.write_limit

    def write(self, data: bytes) -> None:
        """Queue bytes for the router's next flush (one ``transport.write`` for all of them)."""
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self._out_bytes += len(data)
        if not self._queued and not self.closing:
            self._queued = True
            self.router.want_flush(self)

    def write_run(self, datas: list[bytes], nbytes: int) -> int:
        """Queue a run of QoS 0 packets (``nbytes`` in all) as ``write`` would one by one,
        each only while the connection is not ``congested`` before it; returns how many were
        taken (the rest are the caller's slow-consumer drops). One call per subscriber per
        run instead of a congestion check and a ``write`` per message (broker/publishrun.py)."""
        if self._write_paused:
            return 0
        out_bytes = self._out_bytes
        limit = self.write_limit
        take = len(datas)
        if out_bytes + nbytes - len(datas[-1]) > limit:  # the bound falls inside the run
            take = 0
            for data in datas:
                if out_bytes > limit:
                    break
                out_bytes += len(data)
                take += 1
            if not take:
                return 0
            datas = datas[:take]
        else:
            out_bytes += nbytes
        out = self._out
        if out is None:
            self._out = list(datas)
        else:
            out.extend(datas)
        self._out_bytes = out_bytes
        if not self._queued and not self.closing:
            self._queued = True
            self.router.want_flush(self)
        return take

    def send(self, packet: Packet) -> None:
        data = self.proto.send(packet)
        self.stats.packets_out[packet.type] += 1
        self.write(data)

    def flush(self) -> None:
        """Write everything queued, in one ``transport.write`` (called by the router)."""
        self._queued = False
        out = self._out
        if out is None or self.closing:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        self._out = None
        self._out_bytes = 0
        self.listener.bytes_out += len(data)
        self.bytes_out += len(data)
        self.transport.write(data)

    def close(self, reason: int | None = None, drain: bool = False) -> None:
        """Graceful close: optional v5 DISCONNECT, flush what is queued, then close.

        ``drain``: for a client that is likely still writing (a protocol error in the middle
        of its stream, such as a Receive Maximum violation): half-close instead, so the
        DISCONNECT is followed by a FIN, and read and discard what still arrives until the
        client closes its side or ``DRAIN_S`` passes. Closing a socket with unread bytes in
        its receive buffer (or receiving bytes after the close) makes the kernel send a TCP
        RST, and a client that is reset may never read the reason code it was sent (nginx's
        ``lingering_close`` exists for the same reason).
        """
        if self.closing:
            return
        if self.close_reason is None:
            self.close_reason = (f"closed by the server (reason 0x{reason:02X})"
                                 if reason is not None else "closed by the server")
        if reason is not None and self.level == 5 and self.session is not None:
            self.send(Disconnect(reason_code=reason))
        self.flush()
        self.closing = True  # data_received discards from now on: that is the drain
        if drain and self._half_close():
            return
        self.transport.close()

    def _half_close(self) -> bool:
        """Send FIN after what is queued and keep reading until the client closes (our
        ``eof_received`` then closes the transport) or ``DRAIN_S`` runs out. False where the
        transport cannot half-close (TLS, WebSocket): the caller closes at once."""
        transport = self.transport
        try:
            if not transport.can_write_eof():
                return False
            transport.write_eof()
            transport.resume_reading()  # a paused reader would leave bytes unread: the RST
        except (AttributeError, NotImplementedError, RuntimeError, OSError):
            return False
        self.router.loop.call_later(DRAIN_S, self._drained)
        return True

    def _drained(self) -> None:
        """The client did not close its side within DRAIN_S: close ours (a no-op if it did)."""
        self.transport.close()

    def abort(self) -> None:
        self.closing = True
        self.transport.abort()

    def __repr__(self) -> str:
        return f"<Connection {self.client_id!r} {self.peer}>"


def fail_client(stats: BrokerStats, conn: Connection | None, exc: BaseException) -> None:
    """Handling this client's input raised: log it at ERROR with the client id and traceback,
    count it, and close that client only (issue 11). The exception must not leave through
    ``data_received`` (uvloop then reports "Fatal error on transport" with no client named) or
    through another client's callback or the rest of a durable batch. A ``try`` costs nothing
    until it raises, so the boundaries sit on the per-read and per-batch paths for free."""
    stats.client_errors += 1
    log.error("closing client: handling its packet raised %s: %s", type(exc).__name__, exc,
              exc_info=exc, extra={"client_id": conn.client_id if conn else None,
                                   "peer": conn.peer if conn else None})
    if conn is not None and not conn.closing:
        conn.close(0x80)  # v5 DISCONNECT Unspecified error


def guarded(stats: BrokerStats, conn: Connection, fn: Callable[..., None], *args: Any) -> None:
    """Call ``fn(*args)`` for ``conn`` as a callback (e.g. a password check's result) behind the
    same boundary as ``data_received``: an exception closes ``conn`` only (fail_client)."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - isolation boundary, logged with traceback
        fail_client(stats, conn, exc)
