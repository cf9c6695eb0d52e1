"""MQTT reason codes (v5, section 2.4) and the 3.x return codes they map to."""

from __future__ import annotations

from enum import IntEnum


class Reason(IntEnum):
    """Every MQTT 5 reason code (table 2-6 of the 5.0 specification)."""

    SUCCESS = 0x00  # also NORMAL_DISCONNECTION and GRANTED_QOS_0
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USERNAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackV3(IntEnum):
    """CONNACK return codes of MQTT 3.1 / 3.1.1 (table 3.1 of 3.1.1)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


#: SUBACK return code "Failure" in 3.1.1 (3.9.3); every v5 failure (>= 0x80) maps to it.
SUBACK_FAILURE_V3 = 0x80

_V3_CONNACK = {
    0x00: ConnackV3.ACCEPTED,
    0x84: ConnackV3.UNACCEPTABLE_PROTOCOL_VERSION,
    0x85: ConnackV3.IDENTIFIER_REJECTED,
    0x88: ConnackV3.SERVER_UNAVAILABLE,
    0x89: ConnackV3.SERVER_UNAVAILABLE,
    0x86: ConnackV3.BAD_USERNAME_OR_PASSWORD,
    0x8C: ConnackV3.BAD_USERNAME_OR_PASSWORD,  # bad authentication method: credentials refused
    0x87: ConnackV3.NOT_AUTHORIZED,
    0x8A: ConnackV3.NOT_AUTHORIZED,  # banned
}


def v3_connack_code(reason: int) -> int:
    """Map a v5 CONNACK reason code to the nearest 3.x CONNACK return code.

    0x84→1, 0x85→2, 0x88/0x89→3, 0x86/0x8C→4, 0x87/0x8A→5. Every other failure (0x80-0xFF:
    unspecified, malformed, quota, server moved, ...) maps to 3 "server unavailable": it is the only
    3.x code that tells the client "not your fault, try later" without claiming bad credentials.
    Values below 0x80 are taken as already being 3.x return codes (0-5) and returned unchanged, so
    the broker may hand the encoder either form.
    """
    if reason < 0x80:
        return reason
    return _V3_CONNACK.get(reason, ConnackV3.SERVER_UNAVAILABLE)


#: Reason codes each v5 packet may carry (sections 3.2.2.2, 3.4.2.1, ... of 5.0). Receiving any
#: other value is treated as a protocol error (0x82), as Mosquitto does.
CONNACK_REASONS = frozenset(
    (0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95,
     0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)
)
PUBACK_REASONS = frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))
PUBREC_REASONS = PUBACK_REASONS
PUBREL_REASONS = frozenset((0x00, 0x92))
PUBCOMP_REASONS = PUBREL_REASONS
SUBACK_REASONS = frozenset(
    (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)
)
UNSUBACK_REASONS = frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91))
DISCONNECT_REASONS = frozenset(
    (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94,
     0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2)
)
AUTH_REASONS = frozenset((0x00, 0x18, 0x19))
SUBACK_RETURN_CODES_V3 = frozenset((0x00, 0x01, 0x02, 0x80))
