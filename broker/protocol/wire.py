"""Primitive MQTT data representations (section 1.5 of 3.1.1 / 5.0) shared by the codec modules.

Decoders work on an immutable ``bytes`` object with explicit ``(pos, end)`` bounds so a field can
never read past the end of its packet into the next one; every overrun is a Malformed Packet (0x81).
"""

from __future__ import annotations

from .errors import ProtocolError

MAX_VARINT = 268_435_455  # 0xFF 0xFF 0xFF 0x7F, the largest four-byte Variable Byte Integer

#: ``BYTE[i] == bytes((i,))`` without building a new object each time.
BYTE: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(256))


def malformed(message: str) -> ProtocolError:
    """A 0x81 Malformed Packet error, built not raised: callers write ``raise malformed(...)``."""
    return ProtocolError(0x81, message)


def protocol_error(message: str) -> ProtocolError:
    """A 0x82 Protocol Error."""
    return ProtocolError(0x82, message)


def encode_varint(n: int) -> bytes:
    """Variable Byte Integer encoding, minimal length [MQTT-1.5.5-1]."""
    if n < 128:
        return BYTE[n]
    if n < 16384:
        return bytes((n & 127 | 128, n >> 7))
    if n > MAX_VARINT or n < 0:
        raise ValueError(f"variable byte integer out of range: {n}")
    out = bytearray()
    while n >= 128:
        out.append(n & 127 | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer at ``pos``; return ``(value, next_pos)``.

    More than four bytes, a truncated value, or a non-minimal encoding ([MQTT-1.5.5-1], v5) is a
    Malformed Packet. Only used inside v5 properties, where the minimal-encoding rule applies.
    """
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise malformed("truncated variable byte integer")
        b = data[pos]
        pos += 1
        value |= (b & 127) << shift
        if b < 128:
            if b == 0 and shift:
                raise malformed("variable byte integer not minimally encoded")
            return value, pos
        shift += 7
        if shift == 28:
            raise malformed("variable byte integer longer than 4 bytes")


def read_str(data: bytes, pos: int, end: int) -> tuple[str, int]:
    """Decode a UTF-8 Encoded String (2-byte length + bytes); return ``(text, next_pos)``.

    Ill-formed UTF-8 (including encoded surrogates, which ``bytes.decode`` rejects) is malformed
    [MQTT-1.5.3-1] (3.1.1) / [MQTT-1.5.4-1] (5.0), and so is U+0000 [MQTT-1.5.3-2] / [MQTT-1.5.4-2].
    """
    if pos + 2 > end:
        raise malformed("truncated string length")
    q = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if q > end:
        raise malformed("string runs past the end of the packet")
    try:
        s = data[pos + 2 : q].decode()
    except UnicodeDecodeError:
        raise malformed("ill-formed UTF-8 string") from None
    if "\x00" in s:
        raise malformed("U+0000 in a UTF-8 string")
    return s, q


def read_bin(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    """Decode Binary Data (2-byte length + bytes); return ``(value, next_pos)``."""
    if pos + 2 > end:
        raise malformed("truncated binary data length")
    q = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if q > end:
        raise malformed("binary data runs past the end of the packet")
    return data[pos + 2 : q], q


def encode_str(s: str) -> bytes:
    """UTF-8 Encoded String: 2-byte big-endian length then the bytes (at most 65535)."""
    b = s.encode()
    n = len(b)
    if n > 65535:
        raise ValueError("UTF-8 string longer than 65535 bytes")
    return n.to_bytes(2, "big") + b


def encode_bin(b: bytes) -> bytes:
    """Binary Data: 2-byte big-endian length then the bytes (at most 65535)."""
    n = len(b)
    if n > 65535:
        raise ValueError("binary data longer than 65535 bytes")
    return n.to_bytes(2, "big") + bytes(b)
