"""Incremental MQTT packet parser and encoder for protocol levels 3 (3.1), 4 (3.1.1) and 5 (5.0).

Sans-I/O: :class:`PacketParser` turns received bytes into packet objects (``packets.py``) and
:func:`encode` / :func:`publish_parts` turn packet objects into bytes. Nothing here touches sockets.

Hot path notes: ``feed`` copies the buffered bytes into one immutable ``bytes`` object per call,
walks it with index arithmetic (slices of ``bytes`` are single copies), decodes PUBLISH and PUBACK
inline in the loop, dispatches the other types through a 256-entry table indexed by the first byte
(which also validates the fixed-header flags), and keeps the unconsumed tail once per call.

Compiled fast path (optional): ``_speedups.parse_run`` (``_speedups.c``) consumes runs of plain
PUBLISH (no properties) and PUBACK packets and returns at the first packet that is anything else,
which this module's loop then handles, so the Python code stays the reference and raises every
error. BROKER_PURE_PYTHON=1, or a failed build, runs the Python loop only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .errors import ProtocolError, UnsupportedProtocolVersion
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import WILL_CONTEXT, Prop, decode_properties, encode_properties
from .reasons import (
    AUTH_REASONS,
    CONNACK_REASONS,
    DISCONNECT_REASONS,
    PUBACK_REASONS,
    PUBCOMP_REASONS,
    PUBREC_REASONS,
    PUBREL_REASONS,
    SUBACK_FAILURE_V3,
    SUBACK_REASONS,
    SUBACK_RETURN_CODES_V3,
    UNSUBACK_REASONS,
    v3_connack_code,
)
from .topics import validate_topic_name
from .wire import (
    BYTE,
    MAX_VARINT,
    encode_bin,
    encode_str,
    encode_varint,
    malformed,
    protocol_error,
    read_bin,
    read_str,
)

#: Largest possible packet: 1 type byte + 4 length bytes + 268,435,455 bytes of body.
MAX_PACKET_SIZE = 268_435_460

Decoder = Callable[[bytes, int, int, "int | None"], Packet]

_speedups = None
if os.environ.get("BROKER_PURE_PYTHON", "").strip() in ("", "0"):
    try:
        from broker.protocol import _speedups
    except ImportError:  # not built (optional extension): pure Python
        _speedups = None
if _speedups is not None and not all(
        hasattr(_speedups, name) for name in ("publish_packet", "publish_packet_pid",
                                              "slot_maker", "publish_run_end")):
    # Built from an older _speedups.c (a checkout updated without ``pip install -e .``, a .so
    # copied from another tree): set aside whole, like one never built, so the node starts on
    # the pure-Python codec and its start-up warning says to rebuild, instead of every start
    # dying here with an AttributeError (issue 25 added these).
    _speedups = None
if _speedups is not None:
    _speedups.setup(Publish, PubAck)
SPEEDUPS: bool = _speedups is not None
"""True when the compiled parse loop is in use."""
# Looked up at call time, so a test can switch it off with monkeypatch.
c_parse_run = _speedups.parse_run if _speedups else None
#: ``publish_packet(topic, tail, b0, whole)``: the compiled PUBLISH encoder (None: pure Python)
c_publish_packet = _speedups.publish_packet if _speedups else None
#: ``publish_packet_pid(topic, payload, b0, pid)``: a whole v3.x QoS 1/2 PUBLISH (None: Python)
c_publish_packet_pid = _speedups.publish_packet_pid if _speedups else None
#: ``slot_maker(cls, template, fields, required)``: see broker/message.py (None: Python)
c_slot_maker = _speedups.slot_maker if _speedups else None
#: ``publish_run_end(packets, start, stop, qos, topic)``: where a run of plain publishes ends,
#: or None when Publish is built by its class (broker/publishrun.py run_end; None: Python)
c_publish_run_end = _speedups.publish_run_end if _speedups else None

# --------------------------------------------------------------------------------------------------
# Decoders: (data, body_start, end, level) -> packet. ``data[body_start:end]`` is exactly the
# variable header + payload; every read is bounds-checked against ``end``.
# --------------------------------------------------------------------------------------------------


def _packet_id(data: bytes, p: int, end: int) -> int:
    if p + 2 > end:
        raise malformed("truncated packet identifier")
    pid = (data[p] << 8) | data[p + 1]
    if not pid:  # [MQTT-2.3.1-1]: packets that need an identifier use a non-zero one
        raise malformed("packet identifier 0")
    return pid


def _publish_topic_slow(topic: str, props: Properties | None, level: int | None) -> None:
    """Rare-case topic checks, outside the inline PUBLISH path."""
    if "\x00" in topic:
        raise malformed("U+0000 in topic name")  # [MQTT-1.5.3-2] / [MQTT-1.5.4-2]
    if not topic and level == 5:
        # 3.3.2.3.4: a zero-length topic is legal only together with a Topic Alias.
        if props is None or Prop.TOPIC_ALIAS not in props:
            raise protocol_error("empty topic name without a topic alias")
        return
    validate_topic_name(topic)  # [MQTT-3.3.2-2] wildcards -> 0x90; [MQTT-4.7.3-1] empty -> 0x90


def _decode_connect(data: bytes, p: int, end: int, level: int | None) -> Connect:
    name, p = read_str(data, p, end)
    if p + 4 > end:
        raise malformed("truncated CONNECT variable header")
    lvl = data[p]
    flags = data[p + 1]
    keepalive = (data[p + 2] << 8) | data[p + 3]
    p += 4
    # [MQTT-3.1.2-1]: name "MQTT" (3.1.1, 5.0) or "MQIsdp" (3.1); [MQTT-3.1.2-2]: unknown level ->
    # CONNACK 0x01 (3.x) / 0x84 (5.0), which the caller sends from UnsupportedProtocolVersion.
    if name == "MQTT":
        if lvl != 4 and lvl != 5:
            raise UnsupportedProtocolVersion(lvl, name)
    elif name == "MQIsdp":
        if lvl != 3:
            raise UnsupportedProtocolVersion(lvl, name)
    else:
        raise protocol_error(f"unknown protocol name {name!r}")
    if flags & 1:  # [MQTT-3.1.2-3] reserved flag must be 0
        raise malformed("CONNECT reserved flag set")
    will_flag = flags & 4
    will_qos = (flags >> 3) & 3
    will_retain = (flags & 0x20) != 0
    if will_flag:
        if will_qos == 3:  # [MQTT-3.1.2-14]
            raise malformed("will QoS 3")
    elif will_qos or will_retain:  # [MQTT-3.1.2-11], [MQTT-3.1.2-13], [MQTT-3.1.2-15]
        raise malformed("will QoS/retain set without the will flag")
    has_user = flags & 0x80
    has_pass = flags & 0x40
    if has_pass and not has_user and lvl != 5:  # [MQTT-3.1.2-22]; 5.0 allows a lone password
        raise malformed("password flag without user name flag")
    props = None
    if lvl == 5:
        props, p = decode_properties(data, p, end, PacketType.CONNECT)
        if (
            props is not None
            and Prop.AUTHENTICATION_DATA in props
            and (Prop.AUTHENTICATION_METHOD not in props)
        ):  # 3.1.2.11.10
            raise protocol_error("authentication data without authentication method")
    client_id, p = read_str(data, p, end)
    will = None
    if will_flag:
        wprops = None
        if lvl == 5:
            wprops, p = decode_properties(data, p, end, WILL_CONTEXT)
        wtopic, p = read_str(data, p, end)
        validate_topic_name(wtopic)  # [MQTT-3.1.3-11]: the Will Topic is a topic name
        wpayload, p = read_bin(data, p, end)
        will = Will(wtopic, wpayload, will_qos, will_retain, wprops)
    username = password = None
    if has_user:
        username, p = read_str(data, p, end)
    if has_pass:
        password, p = read_bin(data, p, end)
    if p != end:
        raise malformed("extra bytes after CONNECT payload")
    return Connect(
        client_id, lvl, (flags & 2) != 0, keepalive, username, password, will, props, name
    )


def _decode_connack(data: bytes, p: int, end: int, level: int | None) -> Connack:
    if p + 2 > end:
        raise malformed("truncated CONNACK")
    flags = data[p]
    code = data[p + 1]
    p += 2
    if flags & 0xFE:  # [MQTT-3.2.2-1] reserved bits of the acknowledge flags
        raise malformed("CONNACK reserved flags set")
    props = None
    if level == 5:
        if code not in CONNACK_REASONS:
            raise protocol_error(f"invalid CONNACK reason code 0x{code:02X}")
        if p < end:
            props, p = decode_properties(data, p, end, PacketType.CONNACK)
    elif code > 5:
        raise malformed(f"invalid CONNACK return code {code}")
    if p != end:
        raise malformed("extra bytes after CONNACK")
    return Connack(flags == 1, code, props)


def _make_ack_decoder(
    cls: type[PubAck | PubRec | PubRel | PubComp], ptype: int, reasons: frozenset[int]
) -> Decoder:
    def decode(data: bytes, p: int, end: int, level: int | None) -> Packet:
        pid = _packet_id(data, p, end)
        p += 2
        if p == end:
            return cls(pid)
        if level != 5:  # 3.x acks are exactly two bytes (3.4.1 ff. of 3.1.1)
            raise malformed(f"{cls.__name__} remaining length must be 2")
        # 3.4.2.1: reason code and property length may be omitted (remaining length 2 or 3)
        code = data[p]
        if code not in reasons:
            raise protocol_error(f"invalid {cls.__name__} reason code 0x{code:02X}")
        props = None
        if p + 1 < end:
            props, p = decode_properties(data, p + 1, end, ptype)
            if p != end:
                raise malformed(f"extra bytes after {cls.__name__}")
        return cls(pid, code, props)

    return decode


def _decode_subscribe(data: bytes, p: int, end: int, level: int | None) -> Subscribe:
    pid = _packet_id(data, p, end)
    p += 2
    props = None
    if level == 5:
        props, p = decode_properties(data, p, end, PacketType.SUBSCRIBE)
    subs: list[tuple[str, SubscriptionOptions]] = []
    while p < end:
        flt, p = read_str(data, p, end)
        if p >= end:
            raise malformed("missing subscription options")
        opts = data[p]
        p += 1
        qos = opts & 3
        if level == 5:
            if opts & 0xC0:  # [MQTT-3.8.3-5]
                raise malformed("SUBSCRIBE options reserved bits set")
            if qos == 3:  # 3.8.3.1: "It is a Protocol Error if the Maximum QoS field has the
                # value 3"
                raise protocol_error("SUBSCRIBE with QoS 3")
            rh = (opts >> 4) & 3
            if rh == 3:  # 3.8.3.1: "It is a Protocol Error to send a Retain Handling value of 3"
                raise protocol_error("SUBSCRIBE with retain handling 3")
            subs.append((flt, SubscriptionOptions(qos, (opts & 4) != 0, (opts & 8) != 0, rh)))
        else:
            if opts & 0xFC or qos == 3:  # [MQTT-3-8.3-4] (3.1.1)
                raise malformed("SUBSCRIBE options reserved bits set or QoS 3")
            subs.append((flt, SubscriptionOptions(qos)))
    if not subs:  # [MQTT-3.8.3-3] (3.1.1) / 3.8.3 (5.0: "A SUBSCRIBE packet with no Payload is a
        raise protocol_error("SUBSCRIBE without topic filters")  # Protocol Error")
    return Subscribe(pid, subs, props)


def _decode_suback(data: bytes, p: int, end: int, level: int | None) -> Suback:
    pid = _packet_id(data, p, end)
    p += 2
    props = None
    if level == 5:
        props, p = decode_properties(data, p, end, PacketType.SUBACK)
        valid = SUBACK_REASONS
    else:
        valid = SUBACK_RETURN_CODES_V3
    # [MQTT-3.9.3-2] (3.1.1) / 3.9.3 (5.0)
    return Suback(pid, _reason_codes(data, p, end, valid, "SUBACK code"), props)


def _decode_unsubscribe(data: bytes, p: int, end: int, level: int | None) -> Unsubscribe:
    pid = _packet_id(data, p, end)
    p += 2
    props = None
    if level == 5:
        props, p = decode_properties(data, p, end, PacketType.UNSUBSCRIBE)
    filters: list[str] = []
    while p < end:
        flt, p = read_str(data, p, end)
        filters.append(flt)
    if not filters:  # [MQTT-3.10.3-2] (3.1.1) / 3.10.3 (5.0)
        raise protocol_error("UNSUBSCRIBE without topic filters")
    return Unsubscribe(pid, filters, props)


def _decode_unsuback(data: bytes, p: int, end: int, level: int | None) -> Unsuback:
    pid = _packet_id(data, p, end)
    p += 2
    if level != 5:
        if p != end:  # 3.11.1 (3.1.1): remaining length 2
            raise malformed("UNSUBACK remaining length must be 2")
        return Unsuback(pid)
    props, p = decode_properties(data, p, end, PacketType.UNSUBACK)
    return Unsuback(pid, _reason_codes(data, p, end, UNSUBACK_REASONS, "UNSUBACK reason code"),
                    props)


def _reason_codes(data: bytes, p: int, end: int, valid: frozenset[int], what: str) -> list[int]:
    """SUBACK / UNSUBACK end with one code per filter; each must be in ``valid``."""
    codes = list(data[p:end])
    for code in codes:
        if code not in valid:
            raise protocol_error(f"invalid {what} 0x{code:02X}")
    return codes


def _decode_pingreq(data: bytes, p: int, end: int, level: int | None) -> PingReq:
    if p != end:
        raise malformed("PINGREQ remaining length must be 0")
    return _PINGREQ


def _decode_pingresp(data: bytes, p: int, end: int, level: int | None) -> PingResp:
    if p != end:
        raise malformed("PINGRESP remaining length must be 0")
    return _PINGRESP


def _make_reason_decoder(
    cls: type[Disconnect | Auth], ptype: int, reasons: frozenset[int]
) -> Decoder:
    def decode(data: bytes, p: int, end: int, level: int | None) -> Packet:
        if level != 5:
            if ptype == PacketType.AUTH:  # packet type 15 is reserved before 5.0
                raise malformed("AUTH packet before MQTT 5")
            if p != end:  # 3.14.1 (3.1.1): remaining length 0
                raise malformed(f"{cls.__name__} remaining length must be 0")
            return cls()
        if p == end:  # 3.14.2.1 / 3.15.2.1: reason code omitted means 0x00
            return cls()
        code = data[p]
        if code not in reasons:
            raise protocol_error(f"invalid {cls.__name__} reason code 0x{code:02X}")
        props = None
        if p + 1 < end:
            props, p = decode_properties(data, p + 1, end, ptype)
            if p != end:
                raise malformed(f"extra bytes after {cls.__name__}")
        return cls(code, props)

    return decode


_PINGREQ = PingReq()
_PINGRESP = PingResp()

#: Decoder per first byte; ``None`` where the type is reserved or the flags are wrong
#: ([MQTT-2.2.2-1], [MQTT-2.2.2-2]: PUBREL, SUBSCRIBE, UNSUBSCRIBE carry 0b0010, the rest 0).
#: PUBLISH (0x30-0x3F) is handled inline by the parser.
_DECODERS: list[Decoder | None] = [None] * 256
_DECODERS[0x10] = _decode_connect
_DECODERS[0x20] = _decode_connack
_DECODERS[0x40] = _make_ack_decoder(PubAck, PacketType.PUBACK, PUBACK_REASONS)
_DECODERS[0x50] = _make_ack_decoder(PubRec, PacketType.PUBREC, PUBREC_REASONS)
_DECODERS[0x62] = _make_ack_decoder(PubRel, PacketType.PUBREL, PUBREL_REASONS)
_DECODERS[0x70] = _make_ack_decoder(PubComp, PacketType.PUBCOMP, PUBCOMP_REASONS)
_DECODERS[0x82] = _decode_subscribe
_DECODERS[0x90] = _decode_suback
_DECODERS[0xA2] = _decode_unsubscribe
_DECODERS[0xB0] = _decode_unsuback
_DECODERS[0xC0] = _decode_pingreq
_DECODERS[0xD0] = _decode_pingresp
_DECODERS[0xE0] = _make_reason_decoder(Disconnect, PacketType.DISCONNECT, DISCONNECT_REASONS)
_DECODERS[0xF0] = _make_reason_decoder(Auth, PacketType.AUTH, AUTH_REASONS)


#: MQTT 3.1 sets DUP on a resent PUBREL, SUBSCRIBE or UNSUBSCRIBE (they are QoS 1 there); the
#: fixed-flags rule [MQTT-2.2.2-2] that forbids it is 3.1.1's, so only level 3 accepts these.
_V31_DUP = frozenset((0x6A, 0x8A, 0xAA))


def _bad_first_byte(b0: int) -> ProtocolError:
    if b0 >> 4 == 0:
        return malformed("reserved packet type 0")
    return malformed(f"invalid fixed header flags 0x{b0 & 15:X} for packet type {b0 >> 4}")


_NOTHING = b""


class PacketParser:
    """Incremental decoder: bytes in, complete packets out.

    ``protocol_level=None`` is the server role: the first packet must be CONNECT ([MQTT-3.1.0-1];
    anything else is a protocol error 0x82) and its level then governs the rest of the stream. A
    client-role user passes the level it connected with.

    ``max_packet_size`` bounds the *total* packet size (fixed header included), as the MQTT 5
    Maximum Packet Size does (3.1.2.11.4); a bigger packet is refused with 0x95 as soon as its fixed
    header is read, before any of its body is buffered. After a :class:`ProtocolError` the parser is
    unusable: the connection must be closed.

    ``max_connect_size`` (server role) bounds the packet that must be a CONNECT, which arrives
    before anyone is authenticated: 300 unauthenticated sockets each sending 1 MB of a CONNECT
    held 300 MB (issue 11). Once the CONNECT is decoded, ``max_packet_size`` applies.
    """

    __slots__ = ("max_packet_size", "max_connect_size", "protocol_level", "_buf", "_need")

    def __init__(
        self, max_packet_size: int = MAX_PACKET_SIZE, protocol_level: int | None = None
    ) -> None:
        if protocol_level not in (None, 3, 4, 5):
            raise ValueError(f"unknown protocol level {protocol_level}")
        self.max_packet_size = max_packet_size
        self.max_connect_size = max_packet_size
        self.protocol_level = protocol_level
        # the unfinished packet's bytes: a bytearray while there are some, the shared b""
        # otherwise (an empty bytearray is still a 56-byte object per idle connection)
        self._buf: bytearray | bytes = _NOTHING
        self._need = 0  # total bytes needed before the buffered packet can be decoded

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded (a partial packet)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add received bytes; return every packet they complete, in order."""
        buf = self._buf
        if buf:
            buf += data  # (non-empty: always a bytearray)
            if len(buf) < self._need:  # still inside a large packet's body: no copy, no work
                return []
            data = bytes(buf)
        elif type(data) is not bytes:
            data = bytes(data)
        n = len(data)
        pos = 0
        need = 0
        out: list[Packet] = []
        level = self.protocol_level
        maxsize = self.max_packet_size if level is not None else self.max_connect_size
        decoders = _DECODERS
        c_run = c_parse_run
        try:
            while pos < n:
                if c_run is not None and level is not None:
                    # C consumes the plain PUBLISH/PUBACK run; this loop gets what stops it
                    pos = c_run(data, pos, level, maxsize, out)
                    if pos >= n:
                        break
                b0 = data[pos]
                if level is None and b0 != 0x10:
                    if b0 >> 4 == 1:
                        raise malformed("CONNECT reserved flags set")
                    raise protocol_error("first packet is not CONNECT")  # [MQTT-3.1.0-1]
                if pos + 1 >= n:
                    break
                rl = data[pos + 1]
                if rl < 128:
                    body = pos + 2
                else:
                    # Remaining Length: Variable Byte Integer of at most 4 bytes (2.2.3)
                    rl &= 127
                    shift = 7
                    i = pos + 2
                    while True:
                        if i >= n:
                            rl = -1
                            break
                        b = data[i]
                        i += 1
                        rl |= (b & 127) << shift
                        if b < 128:
                            if b == 0 and level == 5:  # [MQTT-1.5.5-1]
                                raise malformed("remaining length not minimally encoded")
                            break
                        shift += 7
                        if shift == 28:
                            raise malformed("remaining length longer than 4 bytes")
                    if rl < 0:
                        break
                    body = i
                end = body + rl
                if end - pos > maxsize:
                    raise ProtocolError(0x95, f"packet of {end - pos} bytes exceeds {maxsize}")
                if end > n:
                    need = end - pos
                    break
                if 0x30 <= b0 < 0x40:
                    # PUBLISH, inline (3.3)
                    qos = (b0 >> 1) & 3
                    if body + 2 > end:
                        raise malformed("truncated PUBLISH topic length")
                    p = body + 2 + ((data[body] << 8) | data[body + 1])
                    if p > end:
                        raise malformed("PUBLISH topic runs past the end of the packet")
                    topic = data[body + 2 : p].decode()
                    if qos:
                        if qos == 3:  # [MQTT-3.3.1-4]
                            raise malformed("PUBLISH with QoS 3")
                        if p + 2 > end:
                            raise malformed("truncated PUBLISH packet identifier")
                        pid = (data[p] << 8) | data[p + 1]
                        if not pid:  # [MQTT-2.3.1-1]
                            raise malformed("PUBLISH packet identifier 0")
                        p += 2
                    else:
                        if b0 & 8:  # [MQTT-3.3.1-2]: DUP must be 0 for QoS 0
                            raise malformed("PUBLISH QoS 0 with DUP set")
                        pid = None
                    props = None
                    if level == 5:
                        if p >= end:
                            raise malformed("missing PUBLISH property length")
                        if data[p]:
                            props, p = decode_properties(data, p, end, 3)
                        else:
                            p += 1
                    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
                        _publish_topic_slow(topic, props, level)
                    out.append(
                        Publish(topic, data[p:end], qos, (b0 & 1) != 0, (b0 & 8) != 0, pid, props)
                    )
                elif b0 == 0x40 and rl == 2:
                    # PUBACK without reason code/properties, inline (3.4)
                    pid = (data[body] << 8) | data[body + 1]
                    if not pid:
                        raise malformed("PUBACK packet identifier 0")
                    out.append(PubAck(pid))
                else:
                    dec = decoders[b0]
                    if dec is None:
                        if level == 3 and b0 in _V31_DUP:
                            dec = decoders[b0 & 0xF7]
                        else:
                            raise _bad_first_byte(b0)
                    pkt = dec(data, body, end, level)
                    if level is None:  # the CONNECT just decoded fixes the level
                        level = self.protocol_level = pkt.protocol_level  # type: ignore[union-attr]
                        maxsize = self.max_packet_size
                    out.append(pkt)
                pos = end
        except UnicodeDecodeError:
            err = malformed("ill-formed UTF-8 in topic name")  # [MQTT-1.5.3-1]
            err.packets = out
            self._buf = _NOTHING
            raise err from None
        except ProtocolError as err:
            err.packets = out
            self._buf = _NOTHING
            raise
        if pos < n:
            self._buf = bytearray(data[pos:]) if pos else bytearray(data)
            self._need = need
        elif buf:
            self._buf = _NOTHING
        return out


# --------------------------------------------------------------------------------------------------
# Encoders
# --------------------------------------------------------------------------------------------------


def _frame(b0: int, body: bytes) -> bytes:
    n = len(body)
    if n < 128:
        return bytes((b0, n)) + body
    return BYTE[b0] + encode_varint(n) + body


def publish_parts(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    properties: Properties | None,
    protocol_level: int,
) -> tuple[bytes, bytes]:
    """Encode a PUBLISH around its packet identifier: wire bytes are ``head + tail`` for QoS 0 and
    ``head + pid.to_bytes(2, "big") + tail`` for QoS 1/2 (the remaining length in ``head`` already
    counts those two bytes). Encode once per (QoS, properties) shape, write per subscriber.
    """
    if protocol_level == 5:
        tail = (encode_properties(properties) if properties else b"\x00") + payload
    else:
        tail = payload
    encode = c_publish_packet
    if encode is not None:
        return encode(topic, tail, 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0),
                      False)
    tb = topic.encode()
    tl = len(tb)
    if tl > 65535:
        raise ValueError("topic longer than 65535 bytes")
    rl = tl + len(tail) + (4 if qos else 2)
    b0 = 0x30 | (qos << 1)
    if retain:
        b0 |= 1
    if dup:
        b0 |= 8
    if rl < 128:
        return bytes((b0, rl, tl >> 8, tl & 255)) + tb, tail
    if rl > MAX_VARINT:
        raise ValueError("PUBLISH larger than the maximum remaining length")
    return BYTE[b0] + encode_varint(rl) + bytes((tl >> 8, tl & 255)) + tb, tail


def publish_packet0(topic: str, payload: bytes, retain: bool,
                    properties: Properties | None, protocol_level: int) -> bytes:
    """A whole QoS 0 PUBLISH in one bytes object: what every subscriber of one shape is
    written (no per-copy ``head + tail``); the compiled encoder when built."""
    encode = c_publish_packet
    if encode is not None:
        if protocol_level == 5:
            payload = (encode_properties(properties) if properties else b"\x00") + payload
        return encode(topic, payload, 0x31 if retain else 0x30, True)
    head, tail = publish_parts(topic, payload, 0, retain, False, properties, protocol_level)
    return head + tail


def encode_publish(pkt: Publish, protocol_level: int) -> bytes:
    """Encode one PUBLISH (the single-destination path)."""
    head, tail = publish_parts(
        pkt.topic, pkt.payload, pkt.qos, pkt.retain, pkt.dup, pkt.properties, protocol_level
    )
    if pkt.qos:
        pid = pkt.packet_id
        if not pid:
            raise ValueError("QoS > 0 PUBLISH needs a non-zero packet identifier")
        return head + bytes((pid >> 8, pid & 255)) + tail
    return head + tail


def _encode_connect(pkt: Connect, level: int) -> bytes:
    flags = 2 if pkt.clean_start else 0
    will = pkt.will
    if will is not None:
        flags |= 4 | (will.qos << 3) | (0x20 if will.retain else 0)
    if pkt.username is not None:
        flags |= 0x80
    if pkt.password is not None:
        flags |= 0x40
    parts = [
        b"\x00\x06MQIsdp" if level == 3 else b"\x00\x04MQTT",
        bytes((level, flags)),
        pkt.keepalive.to_bytes(2, "big"),
    ]
    if level == 5:
        parts.append(encode_properties(pkt.properties))
    parts.append(encode_str(pkt.client_id))
    if will is not None:
        if level == 5:
            parts.append(encode_properties(will.properties))
        parts.append(encode_str(will.topic))
        parts.append(encode_bin(will.payload))
    if pkt.username is not None:
        parts.append(encode_str(pkt.username))
    if pkt.password is not None:
        parts.append(encode_bin(pkt.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(pkt: Connack, level: int) -> bytes:
    if level != 5:
        # 3.1 has no session-present flag; 3.x return codes derive from v5 reasons when needed
        sp = 1 if pkt.session_present and level == 4 else 0
        return bytes((0x20, 2, sp, v3_connack_code(pkt.reason_code)))
    body = bytes((1 if pkt.session_present else 0, pkt.reason_code)) + encode_properties(
        pkt.properties
    )
    return _frame(0x20, body)


def _make_ack_encoder(b0: int) -> Callable[[PubAck | PubRec | PubRel | PubComp, int], bytes]:
    def encode_ack(pkt: PubAck | PubRec | PubRel | PubComp, level: int) -> bytes:
        pid = pkt.packet_id
        if level == 5 and (pkt.reason_code or pkt.properties):
            if pkt.properties:
                return _frame(
                    b0,
                    bytes((pid >> 8, pid & 255, pkt.reason_code))
                    + encode_properties(pkt.properties),
                )
            return bytes((b0, 3, pid >> 8, pid & 255, pkt.reason_code))
        return bytes((b0, 2, pid >> 8, pid & 255))  # short form (3.4.2.1)

    return encode_ack


def _encode_subscribe(pkt: Subscribe, level: int) -> bytes:
    pid = pkt.packet_id
    parts = [bytes((pid >> 8, pid & 255))]
    if level == 5:
        parts.append(encode_properties(pkt.properties))
        for flt, o in pkt.subscriptions:
            parts.append(encode_str(flt))
            parts.append(
                BYTE[
                    o.qos
                    | (4 if o.no_local else 0)
                    | (8 if o.retain_as_published else 0)
                    | (o.retain_handling << 4)
                ]
            )
    else:
        for flt, o in pkt.subscriptions:
            parts.append(encode_str(flt))
            parts.append(BYTE[o.qos])
    return _frame(0x82, b"".join(parts))


def _encode_suback(pkt: Suback, level: int) -> bytes:
    pid = bytes((pkt.packet_id >> 8, pkt.packet_id & 255))
    if level == 5:
        return _frame(0x90, pid + encode_properties(pkt.properties) + bytes(pkt.reason_codes))
    codes = bytes(c if c < 0x80 else SUBACK_FAILURE_V3 for c in pkt.reason_codes)
    return _frame(0x90, pid + codes)


def _encode_unsubscribe(pkt: Unsubscribe, level: int) -> bytes:
    parts = [bytes((pkt.packet_id >> 8, pkt.packet_id & 255))]
    if level == 5:
        parts.append(encode_properties(pkt.properties))
    parts.extend(encode_str(f) for f in pkt.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(pkt: Unsuback, level: int) -> bytes:
    pid = bytes((pkt.packet_id >> 8, pkt.packet_id & 255))
    if level == 5:
        return _frame(0xB0, pid + encode_properties(pkt.properties) + bytes(pkt.reason_codes))
    return b"\xb0\x02" + pid


def _make_reason_encoder(b0: int) -> Callable[[Disconnect | Auth, int], bytes]:
    def encode_reason(pkt: Disconnect | Auth, level: int) -> bytes:
        if level != 5 or (not pkt.reason_code and not pkt.properties):
            return bytes((b0, 0))  # 3.14.2.1 / 3.15.2.1: both may be omitted
        if not pkt.properties:
            return bytes((b0, 1, pkt.reason_code))
        return _frame(b0, BYTE[pkt.reason_code] + encode_properties(pkt.properties))

    return encode_reason


_ENCODERS: dict[type, Callable[[object, int], bytes]] = {
    Publish: encode_publish,  # type: ignore[dict-item]
    PubAck: _make_ack_encoder(0x40),  # type: ignore[dict-item]
    PubRec: _make_ack_encoder(0x50),  # type: ignore[dict-item]
    PubRel: _make_ack_encoder(0x62),  # type: ignore[dict-item]
    PubComp: _make_ack_encoder(0x70),  # type: ignore[dict-item]
    Connect: _encode_connect,  # type: ignore[dict-item]
    Connack: _encode_connack,  # type: ignore[dict-item]
    Subscribe: _encode_subscribe,  # type: ignore[dict-item]
    Suback: _encode_suback,  # type: ignore[dict-item]
    Unsubscribe: _encode_unsubscribe,  # type: ignore[dict-item]
    Unsuback: _encode_unsuback,  # type: ignore[dict-item]
    PingReq: lambda pkt, level: b"\xc0\x00",
    PingResp: lambda pkt, level: b"\xd0\x00",
    Disconnect: _make_reason_encoder(0xE0),  # type: ignore[dict-item]
    Auth: _make_reason_encoder(0xF0),  # type: ignore[dict-item]
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode any packet for a peer speaking ``protocol_level`` (3, 4 or 5).

    For 3.x, v5-only fields (properties, reason codes of acks/DISCONNECT) are dropped, CONNACK
    reasons >= 0x80 are mapped with :func:`v3_connack_code`, SUBACK failures become 0x80, and
    CONNECT is written with protocol name "MQIsdp" at level 3 and "MQTT" otherwise.
    """
    return _ENCODERS[type(packet)](packet, protocol_level)
