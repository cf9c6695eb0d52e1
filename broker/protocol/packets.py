"""MQTT control packets as plain slotted objects: the codec's events.

One class per packet type covers all three protocol levels (3 = MQTT 3.1, 4 = 3.1.1, 5 = 5.0);
fields that only exist in v5 (reason codes, properties) are simply ignored when encoding for 3.x.
Properties are a dict keyed by property id (see ``properties.py``) or ``None`` when empty, so the
hot path (PUBLISH without properties) allocates nothing for them. Repeatable properties (user
property, subscription identifier) hold a list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

Properties = dict[int, Any]


class PacketType(IntEnum):
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


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties | None = None  # will properties (v5): delay interval, expiry, ...


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = 4  # 3: MQTT 3.1 ("MQIsdp"), 4: 3.1.1, 5: 5.0
    clean_start: bool = True  # "clean session" in 3.x
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties | None = None
    protocol_name: str = "MQTT"  # "MQIsdp" for level 3
    type = PacketType.CONNECT


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0  # v5 reason code; for 3.x the return code 0-5
    properties: Properties | None = None
    type = PacketType.CONNACK


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # required for qos > 0, absent for qos 0
    properties: Properties | None = None
    type = PacketType.PUBLISH


@dataclass(slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None
    type = PacketType.PUBACK


@dataclass(slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None
    type = PacketType.PUBREC


@dataclass(slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None
    type = PacketType.PUBREL


@dataclass(slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None
    type = PacketType.PUBCOMP


@dataclass(slots=True)
class SubscriptionOptions:
    qos: int = 0
    no_local: bool = False  # v5
    retain_as_published: bool = False  # v5
    retain_handling: int = 0  # v5: 0 send, 1 send if new subscription, 2 don't send


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    # (topic filter, options) in request order; options.qos is the requested maximum QoS
    subscriptions: list[tuple[str, SubscriptionOptions]] = field(default_factory=list)
    properties: Properties | None = None  # subscription identifier, user properties
    type = PacketType.SUBSCRIBE


@dataclass(slots=True)
class Suback:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # granted QoS 0-2 or a failure code
    properties: Properties | None = None
    type = PacketType.SUBACK


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str] = field(default_factory=list)
    properties: Properties | None = None
    type = PacketType.UNSUBSCRIBE


@dataclass(slots=True)
class Unsuback:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # v5 only; empty for 3.x
    properties: Properties | None = None
    type = PacketType.UNSUBACK


@dataclass(slots=True)
class PingReq:
    type = PacketType.PINGREQ


@dataclass(slots=True)
class PingResp:
    type = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0  # v5 only
    properties: Properties | None = None
    type = PacketType.DISCONNECT


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties | None = None
    type = PacketType.AUTH


Packet = (
    Connect | Connack | Publish | PubAck | PubRec | PubRel | PubComp | Subscribe | Suback
    | Unsubscribe | Unsuback | PingReq | PingResp | Disconnect | Auth
)
