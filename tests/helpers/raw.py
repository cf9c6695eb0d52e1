"""A tiny raw-socket MQTT client for precise wire checks and malformed input.

It encodes and decodes the packets the behaviour tests need by hand, from the MQTT 3.1, 3.1.1 and
5.0 specifications, so the tests do not depend on the broker's own codec. Nothing here is clever:
every byte is written where the specification puts it.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

# Packet types (fixed header, high nibble).
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

PACKET_NAMES = {
    1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL",
    7: "PUBCOMP", 8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK",
    12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH",
}

# v5 property identifiers (MQTT 5.0 section 2.2.2.2) and their wire types.
PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

_BYTE, _INT2, _INT4, _VARINT, _STR, _BIN, _PAIR = range(7)
PROPERTY_TYPES = {
    PAYLOAD_FORMAT_INDICATOR: _BYTE,
    MESSAGE_EXPIRY_INTERVAL: _INT4,
    CONTENT_TYPE: _STR,
    RESPONSE_TOPIC: _STR,
    CORRELATION_DATA: _BIN,
    SUBSCRIPTION_IDENTIFIER: _VARINT,
    SESSION_EXPIRY_INTERVAL: _INT4,
    ASSIGNED_CLIENT_IDENTIFIER: _STR,
    SERVER_KEEP_ALIVE: _INT2,
    AUTHENTICATION_METHOD: _STR,
    AUTHENTICATION_DATA: _BIN,
    REQUEST_PROBLEM_INFORMATION: _BYTE,
    WILL_DELAY_INTERVAL: _INT4,
    REQUEST_RESPONSE_INFORMATION: _BYTE,
    RESPONSE_INFORMATION: _STR,
    SERVER_REFERENCE: _STR,
    REASON_STRING: _STR,
    RECEIVE_MAXIMUM: _INT2,
    TOPIC_ALIAS_MAXIMUM: _INT2,
    TOPIC_ALIAS: _INT2,
    MAXIMUM_QOS: _BYTE,
    RETAIN_AVAILABLE: _BYTE,
    USER_PROPERTY: _PAIR,
    MAXIMUM_PACKET_SIZE: _INT4,
    WILDCARD_SUBSCRIPTION_AVAILABLE: _BYTE,
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: _BYTE,
    SHARED_SUBSCRIPTION_AVAILABLE: _BYTE,
}
# Properties that may appear more than once; decoded into a list.
REPEATABLE = {USER_PROPERTY, SUBSCRIPTION_IDENTIFIER}


class MalformedError(ValueError):
    """The bytes do not form a packet this decoder understands."""


# --------------------------------------------------------------------------------------------
# Primitive encoders
# --------------------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Variable Byte Integer (3.1.1 section 2.2.3, 5.0 section 1.5.5)."""
    if not 0 <= value <= 268_435_455:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """Return (value, new position). Raises MalformedError on more than 4 bytes."""
    value = 0
    mult = 1
    for i in range(4):
        if pos + i >= len(data):
            raise MalformedError("truncated varint")
        byte = data[pos + i]
        value += (byte & 0x7F) * mult
        if not byte & 0x80:
            return value, pos + i + 1
        mult *= 128
    raise MalformedError("varint longer than 4 bytes")


def encode_string(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return struct.pack("!H", len(raw)) + raw


encode_binary = encode_string


def encode_properties(props: dict[int, Any] | list[tuple[int, Any]] | None) -> bytes:
    """Encode a v5 property block. A list of (id, value) keeps order and allows repeats; in a
    dict, a list value of a repeatable property is written once per element."""
    items: list[tuple[int, Any]] = []
    if props:
        pairs = props.items() if isinstance(props, dict) else props
        for pid, value in pairs:
            if pid in REPEATABLE and isinstance(value, list):
                items.extend((pid, v) for v in value)
            else:
                items.append((pid, value))
    body = bytearray()
    for pid, value in items:
        kind = PROPERTY_TYPES[pid]
        body += encode_varint(pid)
        if kind == _BYTE:
            body.append(value)
        elif kind == _INT2:
            body += struct.pack("!H", value)
        elif kind == _INT4:
            body += struct.pack("!I", value)
        elif kind == _VARINT:
            body += encode_varint(value)
        elif kind in (_STR, _BIN):
            body += encode_string(value)
        else:
            key, val = value
            body += encode_string(key) + encode_string(val)
    return encode_varint(len(body)) + bytes(body)


def decode_properties(data: bytes, pos: int) -> tuple[dict[int, Any], int]:
    length, pos = decode_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise MalformedError("property block runs past the packet")
    props: dict[int, Any] = {}
    while pos < end:
        pid, pos = decode_varint(data, pos)
        kind = PROPERTY_TYPES.get(pid)
        if kind is None:
            raise MalformedError(f"unknown property id 0x{pid:02x}")
        if kind == _BYTE:
            value: Any = data[pos]
            pos += 1
        elif kind == _INT2:
            (value,) = struct.unpack_from("!H", data, pos)
            pos += 2
        elif kind == _INT4:
            (value,) = struct.unpack_from("!I", data, pos)
            pos += 4
        elif kind == _VARINT:
            value, pos = decode_varint(data, pos)
        elif kind == _STR:
            value, pos = _read_str(data, pos)
        elif kind == _BIN:
            value, pos = _read_bin(data, pos)
        else:
            key, pos = _read_str(data, pos)
            val, pos = _read_str(data, pos)
            value = (key, val)
        if pid in REPEATABLE:
            props.setdefault(pid, []).append(value)
        elif pid in props:
            raise MalformedError(f"property 0x{pid:02x} appears twice")
        else:
            props[pid] = value
    if pos != end:
        raise MalformedError("property block length mismatch")
    return props, end


def _read_bin(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 2 > len(data):
        raise MalformedError("truncated length prefix")
    (n,) = struct.unpack_from("!H", data, pos)
    if pos + 2 + n > len(data):
        raise MalformedError("truncated string")
    return bytes(data[pos + 2 : pos + 2 + n]), pos + 2 + n


def _read_str(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _read_bin(data, pos)
    return raw.decode("utf-8"), pos


def fixed_header(ptype: int, flags: int, remaining: int) -> bytes:
    return bytes([(ptype << 4) | (flags & 0x0F)]) + encode_varint(remaining)


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return fixed_header(ptype, flags, len(body)) + body


# --------------------------------------------------------------------------------------------
# Packet encoders (client -> server)
# --------------------------------------------------------------------------------------------


@dataclass
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: dict[int, Any] | None = None


def connect(
    client_id: str = "",
    *,
    version: int = 4,
    clean: bool = True,
    keepalive: int = 60,
    username: str | None = None,
    password: bytes | str | None = None,
    will: Will | None = None,
    properties: dict[int, Any] | list[tuple[int, Any]] | None = None,
    protocol_name: str | None = None,
    reserved_flag: bool = False,
) -> bytes:
    """CONNECT. version: 3 (MQTT 3.1, "MQIsdp"), 4 (3.1.1) or 5."""
    name = protocol_name if protocol_name is not None else ("MQIsdp" if version == 3 else "MQTT")
    flags = 0
    if reserved_flag:
        flags |= 0x01
    if clean:
        flags |= 0x02
    if will is not None:
        flags |= 0x04 | (will.qos << 3)
        if will.retain:
            flags |= 0x20
    if password is not None:
        flags |= 0x40
    if username is not None:
        flags |= 0x80
    body = encode_string(name) + bytes([version, flags]) + struct.pack("!H", keepalive)
    if version == 5:
        body += encode_properties(properties)
    body += encode_string(client_id)
    if will is not None:
        if version == 5:
            body += encode_properties(will.properties)
        body += encode_string(will.topic) + encode_binary(will.payload)
    if username is not None:
        body += encode_string(username)
    if password is not None:
        body += encode_binary(password.encode() if isinstance(password, str) else password)
    return packet(CONNECT, 0, body)


def publish(
    topic: str | bytes,
    payload: bytes | str = b"",
    *,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    version: int = 4,
    properties: dict[int, Any] | list[tuple[int, Any]] | None = None,
) -> bytes:
    """PUBLISH. ``topic`` may be raw bytes to send an ill-formed topic name."""
    flags = (0x08 if dup else 0) | ((qos & 0x03) << 1) | (0x01 if retain else 0)
    body = encode_string(topic)
    if qos > 0:
        if packet_id is None:
            raise ValueError("packet_id required for QoS > 0")
        body += struct.pack("!H", packet_id)
    if version == 5:
        body += encode_properties(properties)
    body += payload.encode() if isinstance(payload, str) else payload
    return packet(PUBLISH, flags, body)


def _ack(ptype: int, flags: int, packet_id: int, reason_code: int | None,
         properties: dict[int, Any] | None) -> bytes:
    body = struct.pack("!H", packet_id)
    if reason_code is not None or properties:
        body += bytes([reason_code or 0])
        if properties:
            body += encode_properties(properties)
    return packet(ptype, flags, body)


def puback(packet_id: int, reason_code: int | None = None,
           properties: dict[int, Any] | None = None) -> bytes:
    return _ack(PUBACK, 0, packet_id, reason_code, properties)


def pubrec(packet_id: int, reason_code: int | None = None,
           properties: dict[int, Any] | None = None) -> bytes:
    return _ack(PUBREC, 0, packet_id, reason_code, properties)


def pubrel(packet_id: int, reason_code: int | None = None,
           properties: dict[int, Any] | None = None, flags: int = 0x02) -> bytes:
    return _ack(PUBREL, flags, packet_id, reason_code, properties)


def pubcomp(packet_id: int, reason_code: int | None = None,
            properties: dict[int, Any] | None = None) -> bytes:
    return _ack(PUBCOMP, 0, packet_id, reason_code, properties)


def sub_options(qos: int = 0, no_local: bool = False, retain_as_published: bool = False,
                retain_handling: int = 0) -> int:
    """v5 Subscription Options byte (section 3.8.3.1)."""
    return (qos & 0x03) | (0x04 if no_local else 0) | (0x08 if retain_as_published else 0) | (
        (retain_handling & 0x03) << 4
    )


def subscribe(
    packet_id: int,
    filters: list[tuple[str | bytes, int]] | str,
    qos: int = 0,
    *,
    version: int = 4,
    properties: dict[int, Any] | None = None,
    flags: int = 0x02,
) -> bytes:
    """SUBSCRIBE. ``filters`` is a list of (filter, options byte); for 3.x the options byte is the
    requested QoS. A bare string subscribes to one filter at ``qos``."""
    if isinstance(filters, str):
        filters = [(filters, qos)]
    body = struct.pack("!H", packet_id)
    if version == 5:
        body += encode_properties(properties)
    for flt, opts in filters:
        body += encode_string(flt) + bytes([opts])
    return packet(SUBSCRIBE, flags, body)


def unsubscribe(packet_id: int, filters: list[str] | str, *, version: int = 4,
                properties: dict[int, Any] | None = None) -> bytes:
    if isinstance(filters, str):
        filters = [filters]
    body = struct.pack("!H", packet_id)
    if version == 5:
        body += encode_properties(properties)
    for flt in filters:
        body += encode_string(flt)
    return packet(UNSUBSCRIBE, 0x02, body)


def pingreq() -> bytes:
    return b"\xc0\x00"


def disconnect(reason_code: int | None = None, properties: dict[int, Any] | None = None) -> bytes:
    body = b""
    if reason_code is not None or properties:
        body = bytes([reason_code or 0])
        if properties:
            body += encode_properties(properties)
    return packet(DISCONNECT, 0, body)


# --------------------------------------------------------------------------------------------
# Decoding (server -> client)
# --------------------------------------------------------------------------------------------


@dataclass
class Packet:
    type: int
    flags: int
    raw: bytes  # the whole packet, fixed header included
    packet_id: int | None = None
    reason_code: int | None = None
    reason_codes: list[int] = field(default_factory=list)
    properties: dict[int, Any] = field(default_factory=dict)
    session_present: bool = False
    # PUBLISH
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False

    @property
    def name(self) -> str:
        return PACKET_NAMES.get(self.type, f"TYPE{self.type}")

    def __repr__(self) -> str:
        parts = [self.name, f"flags=0x{self.flags:x}"]
        if self.type == PUBLISH:
            parts += [f"topic={self.topic!r}", f"qos={self.qos}", f"retain={self.retain}",
                      f"dup={self.dup}", f"payload={self.payload[:40]!r}"]
        if self.packet_id is not None:
            parts.append(f"pid={self.packet_id}")
        if self.reason_code is not None:
            parts.append(f"rc=0x{self.reason_code:02x}")
        if self.reason_codes:
            parts.append("rcs=[" + ",".join(f"0x{c:02x}" for c in self.reason_codes) + "]")
        if self.type == CONNACK:
            parts.append(f"sp={int(self.session_present)}")
        if self.properties:
            parts.append(f"props={self.properties!r}")
        return "<" + " ".join(parts) + ">"


def split_packet(buf: bytes | bytearray) -> tuple[bytes, bytes] | None:
    """Return (one whole packet, rest) or None if ``buf`` holds no whole packet yet."""
    if len(buf) < 2:
        return None
    try:
        length, pos = decode_varint(bytes(buf[1:5]), 0)
    except MalformedError as exc:
        if len(buf) >= 5:
            raise
        if "truncated" in str(exc):
            return None
        raise
    end = 1 + pos + length
    if len(buf) < end:
        return None
    return bytes(buf[:end]), bytes(buf[end:])


def decode_packet(raw: bytes, version: int = 4) -> Packet:
    """Decode one whole packet the server sent. ``version`` selects 3.x or 5 layouts."""
    first = raw[0]
    ptype, flags = first >> 4, first & 0x0F
    length, pos = decode_varint(raw, 1)
    body = raw[pos : pos + length]
    if len(body) != length:
        raise MalformedError("truncated packet")
    pkt = Packet(type=ptype, flags=flags, raw=bytes(raw))
    v5 = version == 5
    if ptype == CONNACK:
        if len(body) < 2:
            raise MalformedError("short CONNACK")
        pkt.session_present = bool(body[0] & 0x01)
        if body[0] & 0xFE:
            raise MalformedError("CONNACK reserved flag bits set [MQTT-3.2.2-1]")
        pkt.reason_code = body[1]
        if v5 and len(body) > 2:
            pkt.properties, _ = decode_properties(body, 2)
    elif ptype == PUBLISH:
        pkt.qos = (flags >> 1) & 0x03
        pkt.retain = bool(flags & 0x01)
        pkt.dup = bool(flags & 0x08)
        pkt.topic, p = _read_str(body, 0)
        if pkt.qos > 0:
            (pkt.packet_id,) = struct.unpack_from("!H", body, p)
            p += 2
        if v5:
            pkt.properties, p = decode_properties(body, p)
        pkt.payload = bytes(body[p:])
    elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK, SUBACK):
        (pkt.packet_id,) = struct.unpack_from("!H", body, 0)
        p = 2
        if ptype in (SUBACK, UNSUBACK):
            if v5:
                pkt.properties, p = decode_properties(body, p)
            pkt.reason_codes = list(body[p:])
        else:
            if len(body) > 2:
                pkt.reason_code = body[2]
                if v5 and len(body) > 3:
                    pkt.properties, _ = decode_properties(body, 3)
            else:
                pkt.reason_code = 0 if v5 else None
    elif ptype in (DISCONNECT, AUTH):
        if body:
            pkt.reason_code = body[0]
            if len(body) > 1:
                pkt.properties, _ = decode_properties(body, 1)
        else:
            pkt.reason_code = 0
    elif ptype == PINGRESP:
        if body:
            raise MalformedError("PINGRESP with a body")
    else:
        raise MalformedError(f"unexpected packet type {ptype} from the server")
    return pkt


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


class RawClient:
    """A blocking socket that speaks MQTT one packet at a time.

    All waits are bounded: ``recv`` raises ``TimeoutError`` with a clear message.
    """

    def __init__(self, host: str, port: int, *, version: int = 4, timeout: float = 10.0,
                 rcvbuf: int | None = None, sock: socket.socket | None = None) -> None:
        self.version = version
        self.timeout = timeout
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if rcvbuf is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.settimeout(timeout)
            sock.connect((host, port))
        self.sock = sock
        self.buf = bytearray()
        self.closed = False
        self.received: list[Packet] = []
        # Packets passed over by ``expect(..., skip=...)``; ``recv`` returns them first.
        self.pending: list[Packet] = []

    # -- sending ------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def try_send(self, data: bytes) -> bool:
        """Send, returning False instead of raising when the server already closed."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    # -- receiving ----------------------------------------------------------------------------
    def _fill(self, deadline: float) -> bool:
        """Read more bytes; False on EOF/reset. Raises TimeoutError at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise
        except OSError:
            self.closed = True
            return False
        if not chunk:
            self.closed = True
            return False
        self.buf += chunk
        return True

    def recv(self, timeout: float | None = None) -> Packet:
        """Next packet from the server. Raises TimeoutError or ConnectionError (closed)."""
        if self.pending:
            return self.pending.pop(0)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            got = split_packet(self.buf)
            if got is not None:
                raw, rest = got
                self.buf = bytearray(rest)
                pkt = decode_packet(raw, self.version)
                self.received.append(pkt)
                return pkt
            if self.closed:
                raise ConnectionError("server closed the connection")
            try:
                if not self._fill(deadline):
                    if not self.buf:
                        raise ConnectionError("server closed the connection")
            except TimeoutError:
                raise TimeoutError(
                    f"no packet from the server within {timeout or self.timeout}s"
                ) from None

    def expect(self, ptype: int, timeout: float | None = None, *, skip: tuple[int, ...] = ()
               ) -> Packet:
        """Next packet, which must be ``ptype``. Packets of types in ``skip`` that arrive first
        are kept (in order) for later ``recv``/``expect`` calls, not lost."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        skipped: list[Packet] = []
        candidates = list(self.pending)
        self.pending.clear()
        try:
            while True:
                if candidates:
                    pkt = candidates.pop(0)
                else:
                    remaining = max(0.01, deadline - time.monotonic())
                    try:
                        pkt = self.recv(remaining)
                    except TimeoutError:
                        raise AssertionError(
                            f"expected {PACKET_NAMES[ptype]} within "
                            f"{timeout or self.timeout}s, got nothing"
                            + (f" (passed over: {skipped!r})" if skipped else "")
                        ) from None
                    except ConnectionError:
                        raise AssertionError(
                            f"expected {PACKET_NAMES[ptype]}, but the server closed the "
                            f"connection" + (f" (passed over: {skipped!r})" if skipped else "")
                        ) from None
                if pkt.type == ptype:
                    return pkt
                if pkt.type in skip:
                    skipped.append(pkt)
                    continue
                raise AssertionError(f"expected {PACKET_NAMES[ptype]}, got {pkt!r}")
        finally:
            self.pending = skipped + candidates + self.pending

    def expect_none(self, wait: float = 1.0, *, ignore: tuple[int, ...] = (PINGRESP,)) -> None:
        """Assert no packet (other than ``ignore``d ones) arrives within ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                pkt = self.recv(remaining)
            except TimeoutError:
                return
            except ConnectionError:
                raise AssertionError("the server closed the connection unexpectedly") from None
            if pkt.type not in ignore:
                raise AssertionError(f"expected no packet, got {pkt!r}")

    def wait_closed(self, timeout: float = 10.0) -> list[Packet]:
        """Wait until the server closes the connection; return the packets it sent first.

        Raises AssertionError if the connection is still open at the timeout."""
        got: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"the server did not close the connection within {timeout}s "
                    f"(received meanwhile: {got!r})"
                )
            try:
                got.append(self.recv(remaining))
            except ConnectionError:
                return got
            except TimeoutError:
                continue
            except MalformedError:
                # Whatever the server sent is not for us to judge here; keep draining.
                self.buf.clear()

    def is_open(self, wait: float = 0.3) -> bool:
        """True if the connection is not closed by the server within ``wait`` seconds
        (sends a PINGREQ and expects a PINGRESP)."""
        if self.closed or not self.try_send(pingreq()):
            return False
        try:
            self.expect(PINGRESP, timeout=max(wait, 5.0), skip=(PUBLISH,))
            return True
        except AssertionError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        self.closed = True

    def abort(self) -> None:
        """Close abruptly with a TCP RST (no DISCONNECT, no FIN handshake)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    # -- conveniences -------------------------------------------------------------------------
    def connect(self, client_id: str = "", *, expect_rc: int | None = 0, **kwargs: Any) -> Packet:
        """Send CONNECT and return the CONNACK (asserting its code when ``expect_rc`` is set)."""
        self.send(connect(client_id, version=self.version, **kwargs))
        ack = self.expect(CONNACK)
        if expect_rc is not None:
            assert ack.reason_code == expect_rc, (
                f"CONNACK code 0x{ack.reason_code:02x}, expected 0x{expect_rc:02x}: {ack!r}"
            )
        return ack

    def subscribe(self, filters: list[tuple[str, int]] | str, qos: int = 0, packet_id: int = 1,
                  properties: dict[int, Any] | None = None) -> Packet:
        self.send(subscribe(packet_id, filters, qos, version=self.version, properties=properties))
        ack = self.expect(SUBACK, skip=(PUBLISH,))
        assert ack.packet_id == packet_id, f"SUBACK for pid {ack.packet_id}, sent {packet_id}"
        return ack

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, *,
                retain: bool = False, packet_id: int | None = None,
                properties: dict[int, Any] | list[tuple[int, Any]] | None = None,
                complete: bool = True) -> Packet | None:
        """Publish; for QoS 1/2 with ``complete`` run the acknowledgement flow and return the
        final ack (PUBACK or PUBCOMP)."""
        if qos and packet_id is None:
            packet_id = 1
        self.send(publish(topic, payload, qos=qos, retain=retain, packet_id=packet_id,
                          version=self.version, properties=properties))
        if not qos or not complete:
            return None
        if qos == 1:
            ack = self.expect(PUBACK, skip=(PUBLISH,))
            assert ack.packet_id == packet_id
            return ack
        rec = self.expect(PUBREC, skip=(PUBLISH,))
        assert rec.packet_id == packet_id
        if rec.reason_code is not None and rec.reason_code >= 0x80:
            return rec
        self.send(pubrel(packet_id))
        comp = self.expect(PUBCOMP, skip=(PUBLISH,))
        assert comp.packet_id == packet_id
        return comp

    def ack(self, pkt: Packet) -> None:
        """Acknowledge a received PUBLISH (QoS 1: PUBACK; QoS 2: PUBREC, then PUBREL->PUBCOMP
        is handled by ``expect``ing the PUBREL in the caller or ``complete_qos2``)."""
        if pkt.qos == 1:
            self.send(puback(pkt.packet_id))
        elif pkt.qos == 2:
            self.send(pubrec(pkt.packet_id))

    def complete_qos2(self, pkt: Packet) -> None:
        self.send(pubrec(pkt.packet_id))
        rel = self.expect(PUBREL, skip=(PUBLISH,))
        assert rel.packet_id == pkt.packet_id
        self.send(pubcomp(pkt.packet_id))

    def disconnect(self, reason_code: int | None = None) -> None:
        self.try_send(disconnect(reason_code))
        self.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
