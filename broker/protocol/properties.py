"""MQTT 5 properties (section 2.2.2 of 5.0): ids, wire types, where each is allowed, block codec.

A property block is a Variable Byte Integer length followed by ``(id, value)`` entries. Decoded
blocks are ``dict[int, value]`` keyed by :class:`Prop` members (which compare and hash equal to
plain ints), or ``None`` when the block is empty so the hot path allocates nothing. Value types:
``int`` for numeric properties, ``str`` for UTF-8 strings, ``bytes`` for binary data,
``list[tuple[str, str]]`` for USER_PROPERTY (order kept, [MQTT-3.3.2-18]) and ``list[int]`` for
SUBSCRIPTION_IDENTIFIER (a PUBLISH sent to a client may carry several, [MQTT-3.3.4-3]).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from .errors import ProtocolError
from .packets import PacketType, Properties
from .wire import (
    BYTE,
    encode_bin,
    encode_str,
    encode_varint,
    malformed,
    protocol_error,
    read_bin,
    read_str,
    read_varint,
)


class Prop(IntEnum):
    """Property identifiers (table 2-4 of 5.0)."""

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


class PropType(IntEnum):
    """Wire data types of property values (section 1.5 of 5.0)."""

    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8 = 5
    BINARY = 6
    UTF8_PAIR = 7


#: Pseudo packet type used as the context of the Will Properties inside CONNECT (3.1.3.2).
WILL_CONTEXT = 0

_P = PacketType
_T = PropType
_ACKS = (_P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP)

#: id -> (type, packets (and WILL_CONTEXT) that may carry it), from table 2-4 of 5.0.
PROPERTY_SPECS: dict[Prop, tuple[PropType, tuple[int, ...]]] = {
    Prop.PAYLOAD_FORMAT_INDICATOR: (_T.BYTE, (_P.PUBLISH, WILL_CONTEXT)),
    Prop.MESSAGE_EXPIRY_INTERVAL: (_T.FOUR_BYTE_INT, (_P.PUBLISH, WILL_CONTEXT)),
    Prop.CONTENT_TYPE: (_T.UTF8, (_P.PUBLISH, WILL_CONTEXT)),
    Prop.RESPONSE_TOPIC: (_T.UTF8, (_P.PUBLISH, WILL_CONTEXT)),
    Prop.CORRELATION_DATA: (_T.BINARY, (_P.PUBLISH, WILL_CONTEXT)),
    Prop.SUBSCRIPTION_IDENTIFIER: (_T.VARINT, (_P.PUBLISH, _P.SUBSCRIBE)),
    Prop.SESSION_EXPIRY_INTERVAL: (_T.FOUR_BYTE_INT, (_P.CONNECT, _P.CONNACK, _P.DISCONNECT)),
    Prop.ASSIGNED_CLIENT_IDENTIFIER: (_T.UTF8, (_P.CONNACK,)),
    Prop.SERVER_KEEP_ALIVE: (_T.TWO_BYTE_INT, (_P.CONNACK,)),
    Prop.AUTHENTICATION_METHOD: (_T.UTF8, (_P.CONNECT, _P.CONNACK, _P.AUTH)),
    Prop.AUTHENTICATION_DATA: (_T.BINARY, (_P.CONNECT, _P.CONNACK, _P.AUTH)),
    Prop.REQUEST_PROBLEM_INFORMATION: (_T.BYTE, (_P.CONNECT,)),
    Prop.WILL_DELAY_INTERVAL: (_T.FOUR_BYTE_INT, (WILL_CONTEXT,)),
    Prop.REQUEST_RESPONSE_INFORMATION: (_T.BYTE, (_P.CONNECT,)),
    Prop.RESPONSE_INFORMATION: (_T.UTF8, (_P.CONNACK,)),
    Prop.SERVER_REFERENCE: (_T.UTF8, (_P.CONNACK, _P.DISCONNECT)),
    Prop.REASON_STRING: (
        _T.UTF8,
        (_P.CONNACK, *_ACKS, _P.SUBACK, _P.UNSUBACK, _P.DISCONNECT, _P.AUTH),
    ),
    Prop.RECEIVE_MAXIMUM: (_T.TWO_BYTE_INT, (_P.CONNECT, _P.CONNACK)),
    Prop.TOPIC_ALIAS_MAXIMUM: (_T.TWO_BYTE_INT, (_P.CONNECT, _P.CONNACK)),
    Prop.TOPIC_ALIAS: (_T.TWO_BYTE_INT, (_P.PUBLISH,)),
    Prop.MAXIMUM_QOS: (_T.BYTE, (_P.CONNACK,)),
    Prop.RETAIN_AVAILABLE: (_T.BYTE, (_P.CONNACK,)),
    Prop.USER_PROPERTY: (
        _T.UTF8_PAIR,
        (_P.CONNECT, _P.CONNACK, _P.PUBLISH, WILL_CONTEXT, *_ACKS, _P.SUBSCRIBE, _P.SUBACK,
         _P.UNSUBSCRIBE, _P.UNSUBACK, _P.DISCONNECT, _P.AUTH),
    ),
    Prop.MAXIMUM_PACKET_SIZE: (_T.FOUR_BYTE_INT, (_P.CONNECT, _P.CONNACK)),
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: (_T.BYTE, (_P.CONNACK,)),
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (_T.BYTE, (_P.CONNACK,)),
    Prop.SHARED_SUBSCRIPTION_AVAILABLE: (_T.BYTE, (_P.CONNACK,)),
}

#: Properties that may appear more than once; all others are a Protocol Error when repeated
#: (e.g. "It is a Protocol Error to include the Receive Maximum value more than once", 3.1.2.11.3).
REPEATABLE = frozenset((Prop.USER_PROPERTY, Prop.SUBSCRIPTION_IDENTIFIER))

#: Byte properties whose only legal values are 0 and 1 (3.1.2.11.7, 3.1.2.11.6, 3.2.2.3.4,
#: 3.2.2.3.5, 3.2.2.3.11-13, 3.3.2.3.2); another value is a Protocol Error.
_BOOLEAN = frozenset(
    (Prop.PAYLOAD_FORMAT_INDICATOR, Prop.REQUEST_PROBLEM_INFORMATION,
     Prop.REQUEST_RESPONSE_INFORMATION, Prop.MAXIMUM_QOS, Prop.RETAIN_AVAILABLE,
     Prop.WILDCARD_SUBSCRIPTION_AVAILABLE, Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
     Prop.SHARED_SUBSCRIPTION_AVAILABLE)
)
#: Numeric properties for which 0 is a Protocol Error (3.1.2.11.3, 3.1.2.11.4, 3.8.2.1.2).
_NONZERO = frozenset((Prop.RECEIVE_MAXIMUM, Prop.MAXIMUM_PACKET_SIZE, Prop.SUBSCRIPTION_IDENTIFIER))

# Decode table indexed by the id byte: (Prop, PropType, bit mask of allowed contexts) or None.
_DECODE: list[tuple[Prop, PropType, int] | None] = [None] * 256
for _prop, (_type, _contexts) in PROPERTY_SPECS.items():
    _mask = 0
    for _c in _contexts:
        _mask |= 1 << _c
    _DECODE[_prop] = (_prop, _type, _mask)
_ENCODE_TYPE: dict[int, PropType] = {p: t for p, (t, _) in PROPERTY_SPECS.items()}


def _check_value(prop: Prop, value: Any, context: int) -> None:
    """Value rules beyond the wire type (only called for the few properties that have any)."""
    if prop in _BOOLEAN:
        if value > 1:
            raise protocol_error(f"{prop.name} must be 0 or 1, got {value}")
    elif prop in _NONZERO:
        if value == 0:
            raise protocol_error(f"{prop.name} must not be 0")
    elif prop is Prop.TOPIC_ALIAS:
        if value == 0:  # [MQTT-3.3.2-8]; 3.3.2.3.4 names 0x94 Topic Alias invalid for this
            raise ProtocolError(0x94, "topic alias 0 is not permitted")
    elif prop is Prop.RESPONSE_TOPIC:
        if "+" in value or "#" in value:  # [MQTT-3.3.2-14]: must be a Topic Name, no wildcards
            raise protocol_error("response topic contains wildcard characters")


_CHECKED = _BOOLEAN | _NONZERO | {Prop.TOPIC_ALIAS, Prop.RESPONSE_TOPIC}


def decode_properties(
    data: bytes, pos: int, end: int, context: int
) -> tuple[Properties | None, int]:
    """Decode the property block at ``data[pos:end]`` for a packet of type ``context``.

    Returns ``(properties or None, position after the block)``. An unknown id, or an id not
    allowed in this packet, or a value that is not of the specified type, is a Malformed Packet
    (2.2.2.2); a repeated non-repeatable property or an out-of-range value is a Protocol Error
    (0x82); topic alias 0 is 0x94. Only called for v5 packets.
    """
    if pos >= end:
        raise malformed("missing property length")
    plen = data[pos]
    if plen < 128:
        pos += 1
    else:
        plen, pos = read_varint(data, pos, end)
    if plen == 0:
        return None, pos
    pend = pos + plen
    if pend > end:
        raise malformed("property length runs past the end of the packet")
    props: dict[int, Any] = {}
    bit = 1 << context
    decode = _DECODE
    while pos < pend:
        spec = decode[data[pos]]
        if spec is None or not spec[2] & bit:
            raise malformed(f"property 0x{data[pos]:02X} not allowed in this packet")
        prop, ptype, _ = spec
        pos += 1
        if ptype == _T.UTF8:
            value: Any
            value, pos = read_str(data, pos, pend)
        elif ptype == _T.FOUR_BYTE_INT:
            if pos + 4 > pend:
                raise malformed("truncated four byte integer property")
            value = int.from_bytes(data[pos : pos + 4], "big")
            pos += 4
        elif ptype == _T.TWO_BYTE_INT:
            if pos + 2 > pend:
                raise malformed("truncated two byte integer property")
            value = (data[pos] << 8) | data[pos + 1]
            pos += 2
        elif ptype == _T.BYTE:
            if pos >= pend:
                raise malformed("truncated byte property")
            value = data[pos]
            pos += 1
        elif ptype == _T.UTF8_PAIR:
            k, pos = read_str(data, pos, pend)
            v, pos = read_str(data, pos, pend)
            pairs = props.get(prop)
            if pairs is None:
                props[prop] = [(k, v)]
            else:
                pairs.append((k, v))
            continue
        elif ptype == _T.BINARY:
            value, pos = read_bin(data, pos, pend)
        else:  # VARINT: only SUBSCRIPTION_IDENTIFIER
            value, pos = read_varint(data, pos, pend)
            if value == 0:  # 3.3.2.3.8 / 3.8.2.1.2
                raise protocol_error("subscription identifier 0")
            ids = props.get(prop)
            if ids is None:
                props[prop] = [value]
            elif context == _P.SUBSCRIBE:
                raise protocol_error("more than one subscription identifier in SUBSCRIBE")
            else:
                ids.append(value)
            continue
        if prop in props:
            raise protocol_error(f"{prop.name} included more than once")
        if prop in _CHECKED:
            _check_value(prop, value, context)
        props[prop] = value
    if pos != pend:
        raise malformed("property value runs past the property length")
    return props, pend


def encode_properties(props: Properties | None) -> bytes:
    """Encode a property block (length prefix included); ``None``/empty gives ``b"\\x00"``.

    Values are trusted (the broker builds them); ``SUBSCRIPTION_IDENTIFIER`` may be a list or an
    int.
    """
    if not props:
        return b"\x00"
    out = bytearray()
    for pid, value in props.items():
        ptype = _ENCODE_TYPE[pid]
        if ptype == _T.UTF8_PAIR:
            for k, v in value:
                out.append(pid)
                out += encode_str(k)
                out += encode_str(v)
        elif ptype == _T.VARINT:
            for v in value if isinstance(value, list | tuple) else (value,):
                out.append(pid)
                out += encode_varint(v)
        else:
            out.append(pid)
            if ptype == _T.UTF8:
                out += encode_str(value)
            elif ptype == _T.FOUR_BYTE_INT:
                out += value.to_bytes(4, "big")
            elif ptype == _T.TWO_BYTE_INT:
                out += value.to_bytes(2, "big")
            elif ptype == _T.BYTE:
                out += BYTE[value]
            else:
                out += encode_bin(value)
    return encode_varint(len(out)) + bytes(out)
