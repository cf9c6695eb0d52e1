"""A small blocking MQTT 5 publisher for the sink: QoS 0/1 PUBLISH, pipelined, acks awaited.

Why our own and not paho-mqtt: the sink needs exactly one thing, "these rows are acknowledged,
or this call raises", from a Spark worker that must not leave threads behind. paho's network
thread, its silent reconnects and its in-memory retry queue are built for long-lived devices and
make that guarantee hard to state. A pipelined window (send up to ``Receive Maximum`` publishes,
then read acks) keeps the socket full without a per-row round trip, like Kafka's producer
``max.in.flight.requests.per.connection``.

Any PUBACK with a reason code >= 0x80 (not authorised, quota exceeded, ...), a lost connection or
a silent server within the timeout raises ``PublishError``: the Spark task fails and its batch is
not committed, so nothing unacknowledged is reported as written. Rows acknowledged before the
failure are published again when Spark retries: at-least-once.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_connector.options import HttpAuth

__all__ = ["Publisher", "PublishError", "OutgoingMessage"]

# (topic, payload, qos, retain, user properties or None)
OutgoingMessage = tuple[str, bytes, int, bool, Mapping[str, str] | None]

_PROP_SIZES = {  # MQTT 5 property id -> fixed size, or a kind for variable-length ones
    0x01: 1, 0x17: 1, 0x19: 1, 0x24: 1, 0x25: 1, 0x28: 1, 0x29: 1, 0x2A: 1,
    0x13: 2, 0x21: 2, 0x22: 2, 0x23: 2,
    0x02: 4, 0x11: 4, 0x18: 4, 0x27: 4,
    0x0B: "varint",
    0x03: "str", 0x08: "str", 0x12: "str", 0x15: "str", 0x1A: "str", 0x1C: "str", 0x1F: "str",
    0x09: "str", 0x16: "str",
    0x26: "pair",
}
_RECEIVE_MAXIMUM = 0x21
_MAXIMUM_QOS = 0x24
_REASON_STRING = 0x1F


class PublishError(ConnectionError):
    """The batch cannot be confirmed: refused, connection lost or no ack in time."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    if len(b) > 0xFFFF:
        raise PublishError(f"string of {len(b)} bytes is too long for MQTT")
    return struct.pack(">H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _varint(len(body)) + body


def encode_connect(client_id: str, username: str | None, password: str | None,
                   keepalive: int = 0) -> bytes:
    # keepalive 0: a task may pause between rows while Spark computes them; the sink's socket
    # timeout, not the server's keepalive timer, decides when a silent peer is dead.
    flags = 0x02  # clean start: the sink keeps no session between tasks
    payload = _str(client_id)
    if username is not None:
        flags |= 0x80
        payload += _str(username)
    if password is not None:
        flags |= 0x40
        payload += _str(password)
    var = _str("MQTT") + bytes((5, flags)) + struct.pack(">H", keepalive) + b"\x00"
    return _packet(0x10, var + payload)


def encode_publish(topic: str, payload: bytes, qos: int, retain: bool, packet_id: int,
                   user_properties: Mapping[str, str] | None) -> bytes:
    props = b""
    if user_properties:
        props = b"".join(b"\x26" + _str(k) + _str(v) for k, v in user_properties.items())
    body = _str(topic)
    if qos:
        body += struct.pack(">H", packet_id)
    body += _varint(len(props)) + props + payload
    return _packet(0x30 | (qos << 1) | (1 if retain else 0), body)


def _parse_props(data: bytes, pos: int) -> tuple[dict[int, object], int]:
    """(properties, position after them); skips what it does not need."""
    length, pos = _read_varint(data, pos)
    end = pos + length
    props: dict[int, object] = {}
    while pos < end:
        pid = data[pos]
        pos += 1
        kind = _PROP_SIZES.get(pid)
        if kind is None:
            raise PublishError(f"server sent unknown MQTT property 0x{pid:02x}")
        if isinstance(kind, int):
            props[pid] = int.from_bytes(data[pos:pos + kind], "big")
            pos += kind
        elif kind == "varint":
            props[pid], pos = _read_varint(data, pos)
        else:
            for _ in range(2 if kind == "pair" else 1):
                n = struct.unpack_from(">H", data, pos)[0]
                props[pid] = data[pos + 2:pos + 2 + n].decode("utf-8", "replace")
                pos += 2 + n
    return props, end


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 21:
            raise PublishError("malformed variable byte integer from server")


class Publisher:
    """One connection to the first server of ``servers`` that accepts it."""

    def __init__(self, servers: tuple[tuple[str, int], ...], client_id: str,
                 username: str | None = None, password: str | None = None,
                 timeout_s: float = 30.0, max_inflight: int = 32,
                 tls: HttpAuth | None = None) -> None:
        self.timeout_s = timeout_s
        self._tls = tls  # TLS to the listener (caFile, insecure), None: plain TCP
        self._buf = bytearray()
        self._sock = self._connect(servers, client_id, username, password)
        self.window = min(max_inflight, self._receive_maximum)
        self.acked = 0

    def _connect(self, servers: tuple[tuple[str, int], ...], client_id: str,
                 username: str | None, password: str | None) -> socket.socket:
        errors: list[str] = []
        for host, port in servers:
            try:
                sock = socket.create_connection((host, port), timeout=self.timeout_s)
            except OSError as exc:
                errors.append(f"{host}:{port} {exc!r}")
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                if self._tls is not None:
                    sock = self._wrap(sock, host)
                sock.sendall(encode_connect(client_id, username, password))
                first, body = self._read_packet(sock)
                if first >> 4 != 2 or len(body) < 2:
                    raise PublishError(f"{host}:{port} is not an MQTT server (answered "
                                       f"packet type {first >> 4})")
                if body[1] in (0x86, 0x87):  # bad user name or password, not authorized
                    who = f"user {username!r}" if username else "no credentials"
                    raise PublishError(f"{host}:{port}: authentication failed for {who} "
                                       f"(CONNACK 0x{body[1]:02x}): set the sink's options "
                                       "username and password (an MQTT user of the node's "
                                       "auth.password_file)")
                if body[1] >= 0x80:
                    raise PublishError(f"{host}:{port} refused the connection: reason code "
                                       f"0x{body[1]:02x}")
                props, _ = _parse_props(body, 2)
                self._receive_maximum = int(props.get(_RECEIVE_MAXIMUM, 65535))  # type: ignore
                self._maximum_qos = int(props.get(_MAXIMUM_QOS, 2))  # type: ignore[arg-type]
                return sock
            except (OSError, PublishError, IndexError, struct.error) as exc:
                sock.close()
                errors.append(f"{host}:{port} {exc}")
        raise PublishError("no MQTT server accepted the sink's connection: " + "; ".join(errors))

    def _wrap(self, sock: socket.socket, host: str) -> socket.socket:
        """TLS to the MQTT listener (``listener.tls``): verified against ``caFile`` (or the
        system's CAs), or not at all with ``insecure``."""
        import ssl

        assert self._tls is not None
        ctx = ssl.create_default_context(cafile=self._tls.cafile)
        if self._tls.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx.wrap_socket(sock, server_hostname=host)

    def _read_packet(self, sock: socket.socket) -> tuple[int, bytes]:
        buf = self._buf
        while True:
            if len(buf) >= 2:
                try:
                    length, pos = _read_varint(bytes(buf[1:5]), 0)
                    complete = len(buf) >= 1 + pos + length
                except IndexError:
                    complete = False
                if complete:
                    first = buf[0]
                    body = bytes(buf[1 + pos:1 + pos + length])
                    del buf[:1 + pos + length]
                    return first, body
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise PublishError(f"no answer from the MQTT server within "
                                   f"{self.timeout_s:g}s") from None
            except OSError as exc:
                raise PublishError(f"connection to the MQTT server lost: {exc!r}") from None
            if not chunk:
                raise PublishError("the MQTT server closed the connection before every "
                                   "publish was acknowledged")
            buf += chunk

    def publish_all(self, messages: Iterable[OutgoingMessage]) -> int:
        """Publish every message; return when all QoS 1 ones are acknowledged (count of
        messages sent). Raises PublishError otherwise."""
        inflight: set[int] = set()
        out = bytearray()
        next_id = 1
        sent = 0
        for topic, payload, qos, retain, props in messages:
            if qos not in (0, 1):
                raise PublishError(f"qos {qos} for topic {topic!r}: the sink publishes with "
                                   "QoS 0 or 1 only")
            if qos > self._maximum_qos:
                raise PublishError(f"the server's Maximum QoS is {self._maximum_qos}; a row "
                                   f"asks for QoS {qos}")
            pid = 0
            if qos:
                while len(inflight) >= self.window:
                    self._flush(out)
                    self._read_ack(inflight)
                while next_id in inflight:
                    next_id = next_id % 0xFFFF + 1
                pid = next_id
                next_id = next_id % 0xFFFF + 1
                inflight.add(pid)
            out += encode_publish(topic, payload, qos, retain, pid, props)
            sent += 1
            if len(out) >= 65536:
                self._flush(out)
        self._flush(out)
        while inflight:
            self._read_ack(inflight)
        return sent

    def _flush(self, out: bytearray) -> None:
        if out:
            try:
                self._sock.sendall(out)
            except OSError as exc:
                raise PublishError(f"connection to the MQTT server lost: {exc!r}") from None
            out.clear()

    def _read_ack(self, inflight: set[int]) -> None:
        first, body = self._read_packet(self._sock)
        kind = first >> 4
        if kind == 4:  # PUBACK
            pid = struct.unpack_from(">H", body, 0)[0]
            if len(body) > 2 and body[2] >= 0x80:
                reason = ""
                if len(body) > 3:
                    props, _ = _parse_props(body, 3)
                    reason = f" ({props.get(_REASON_STRING)})" if _REASON_STRING in props else ""
                raise PublishError(f"the server refused a publish: reason code "
                                   f"0x{body[2]:02x}{reason}")
            inflight.discard(pid)
            self.acked += 1
        elif kind == 14:  # DISCONNECT from the server
            code = body[0] if body else 0
            raise PublishError(f"the MQTT server disconnected the sink: reason 0x{code:02x}")
        # anything else (PINGRESP) is ignored

    def close(self) -> None:
        try:
            self._sock.sendall(b"\xe0\x00")
        except OSError:
            pass
        self._sock.close()
