"""A tiny MQTT 3.1.1 encoder for the load generator.

Deliberately independent of the broker's own protocol package: the generator must not share
bugs (or speed-ups) with the thing it measures. Only what the workloads send is here.
"""

from __future__ import annotations

import struct

PROTOCOL_LEVEL_311 = 4

# Fixed-header first bytes.
CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
PUBREC = 0x50
PUBREL = 0x62  # PUBREL carries the reserved flags 0b0010
PUBCOMP = 0x70
SUBSCRIBE = 0x82  # SUBSCRIBE carries the reserved flags 0b0010
SUBACK = 0x90
DISCONNECT = 0xE0


def varint(n: int) -> bytes:
    """Encode an MQTT Remaining Length."""
    if n < 0 or n > 268_435_455:
        raise ValueError(f"remaining length out of range: {n}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(b)) + b


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def connect(client_id: str, keepalive: int = 0, clean: bool = True) -> bytes:
    flags = 0x02 if clean else 0x00
    body = utf8("MQTT") + bytes([PROTOCOL_LEVEL_311, flags]) + struct.pack(">H", keepalive)
    return packet(CONNECT, body + utf8(client_id))


def subscribe(pid: int, filters: list[tuple[str, int]]) -> bytes:
    body = struct.pack(">H", pid) + b"".join(utf8(f) + bytes([q]) for f, q in filters)
    return packet(SUBSCRIBE, body)


def publish(topic: str, payload: bytes, qos: int = 0, pid: int = 0, retain: bool = False,
            dup: bool = False) -> bytes:
    first = PUBLISH | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    body = utf8(topic) + (struct.pack(">H", pid) if qos else b"") + payload
    return packet(first, body)


def publish_prefix(topic: str, payload_len: int, qos: int = 0) -> bytes:
    """Fixed header + topic (+ nothing else) of a PUBLISH whose payload is ``payload_len`` long.

    For QoS > 0 the packet id follows the prefix; callers append it and the payload.
    """
    t = utf8(topic)
    rl = len(t) + (2 if qos else 0) + payload_len
    return bytes([PUBLISH | (qos << 1)]) + varint(rl) + t


def ack(first: int, pid: int) -> bytes:
    return bytes([first, 2]) + struct.pack(">H", pid)


def disconnect() -> bytes:
    return bytes([DISCONNECT, 0])


def publish_ring(topic: str, payload: bytes, qos: int) -> tuple[bytes, int]:
    """All 65,535 QoS>0 PUBLISH packets (ids 1..65535) of one topic, concatenated.

    Every packet has the same size, so the packets for ids i..j are one slice. Returns
    (ring, packet_size). The ring is doubled so that a run that wraps around is still one slice.
    """
    prefix = publish_prefix(topic, len(payload), qos)
    ids = struct.Struct(">H")
    one = [prefix + ids.pack(i) + payload for i in range(1, 65536)]
    ring = b"".join(one)
    return ring + ring, len(one[0])


def split_packet(buf: bytes | bytearray, i: int = 0) -> tuple[int, int, int] | None:
    """Parse one packet at ``buf[i:]``: (first_byte, body_start, end), None if incomplete."""
    n = len(buf)
    if n - i < 2:
        return None
    j = i + 1
    rl = 0
    mult = 1
    while True:
        if j >= n:
            return None
        b = buf[j]
        j += 1
        rl += (b & 0x7F) * mult
        if not b & 0x80:
            break
        mult <<= 7
        if mult > 128**3:
            raise ValueError("malformed remaining length")
    end = j + rl
    if end > n:
        return None
    return buf[i], j, end
