"""Errors raised by the sans-I/O codec.

Every error carries the MQTT 5 reason code the server should put in its DISCONNECT (or CONNACK, when
the CONNECT itself is bad) before closing the network connection. For 3.x peers there is no
DISCONNECT from the server: the broker just closes ([MQTT-4.8.0-1] in 3.1.1).
"""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """A malformed packet or a protocol violation: the connection must be closed.

    ``reason_code`` is the v5 reason code to report (0x81 malformed, 0x82 protocol error,
    0x95 packet too large, 0x90 topic name invalid, 0x94 topic alias invalid, ...).
    ``packets`` holds the packets that :meth:`PacketParser.feed` had already decoded, in the same
    call, before it met the bad one; the broker may still act on them (e.g. deliver a PUBLISH that
    preceded the garbage) or drop them, as it sees fit.
    """

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message
        self.packets: list[Any] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(0x{self.reason_code:02X}, {self.message!r})"


class UnsupportedProtocolVersion(ProtocolError):
    """CONNECT with a protocol level (or name/level pair) this broker does not speak.

    [MQTT-3.1.2-2] (3.1.1): the server MUST answer CONNACK return code 0x01 and close; in v5 the
    server MAY answer CONNACK 0x84 (3.1.2.2). ``connack`` gives those bytes ready to write: the v5
    form when the client asked for level 5, else the 3.x form.
    """

    def __init__(self, protocol_level: int, protocol_name: str = "MQTT") -> None:
        super().__init__(
            0x84, f"unsupported protocol level {protocol_level} for protocol name {protocol_name!r}"
        )
        self.protocol_level = protocol_level
        self.protocol_name = protocol_name

    @property
    def connack(self) -> bytes:
        """Wire bytes of the refusing CONNACK to send before closing."""
        if self.protocol_level == 5:
            return b"\x20\x03\x00\x84\x00"
        return b"\x20\x02\x00\x01"
