"""One test per validation rule of the parser, asserting the exact reason code."""

from __future__ import annotations

from typing import Any

import pytest

from broker.protocol import (
    Connect,
    PacketParser,
    ProtocolError,
    Publish,
    UnsupportedProtocolVersion,
    Will,
    encode,
)
from broker.protocol.wire import encode_varint


def frame(b0: int, body: bytes) -> bytes:
    return bytes((b0,)) + encode_varint(len(body)) + body


def s(text: str) -> bytes:
    b = text.encode()
    return len(b).to_bytes(2, "big") + b


def raw_str(b: bytes) -> bytes:
    return len(b).to_bytes(2, "big") + b


def props(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return encode_varint(len(body)) + body


def reject(data: bytes, level: int | None, code: int, max_packet_size: int | None = None) -> Any:
    kw: dict[str, Any] = {"protocol_level": level}
    if max_packet_size is not None:
        kw["max_packet_size"] = max_packet_size
    parser = PacketParser(**kw)
    with pytest.raises(ProtocolError) as info:
        parser.feed(data)
    assert info.value.reason_code == code, info.value
    return info.value


CONNECT4 = encode(Connect("c"), 4)
CONNECT5 = encode(Connect("c", 5), 5)


# -- fixed header ---------------------------------------------------------------------------------


def test_packet_too_large_rejected_from_header_alone() -> None:
    # only the fixed header arrives: the 0x95 comes before any of the body is buffered
    err = reject(b"\x30\xff\xff\xff\x7f", 4, 0x95, max_packet_size=1_000_000)
    assert "exceeds" in err.message


def test_max_packet_size_counts_the_whole_packet() -> None:
    pkt = encode(Publish("t", b"x" * 10), 4)  # 15 bytes in all
    assert PacketParser(max_packet_size=15, protocol_level=4).feed(pkt)
    reject(pkt, 4, 0x95, max_packet_size=14)


def test_too_large_connect_in_server_role() -> None:
    reject(encode(Connect("c" * 100), 4)[:3], None, 0x95, max_packet_size=50)


@pytest.mark.parametrize(
    "b0",
    [0x11, 0x21, 0x41, 0x58, 0x60, 0x63, 0x7F, 0x80, 0x83, 0x92, 0xA0, 0xA3, 0xB4, 0xC1, 0xD2,
     0xE1, 0xF1, 0x00, 0x02],
)
def test_reserved_fixed_header_flags(b0: int) -> None:
    # [MQTT-2.2.2-2]; type 0 is reserved
    reject(bytes((b0, 2, 0, 1)), 5, 0x81)


def test_remaining_length_more_than_four_bytes() -> None:
    reject(b"\x30\x80\x80\x80\x80\x01", 4, 0x81)
    # known malformed even before the fifth byte arrives
    reject(b"\x30\xff\xff\xff\xff", 4, 0x81)


def test_remaining_length_not_minimal_in_v5() -> None:
    reject(b"\xc0\x80\x00", 5, 0x81)  # [MQTT-1.5.5-1]


@pytest.mark.parametrize(
    "data",
    [
        b"\x40\x03\x00\x01\x00",  # 3.1.1 PUBACK longer than 2
        b"\x40\x01\x00",  # PUBACK shorter than its packet id
        b"\xc0\x01\x00",  # PINGREQ with a body
        b"\xd0\x01\x00",  # PINGRESP with a body
        b"\xe0\x01\x00",  # 3.1.1 DISCONNECT with a body
        b"\xb0\x03\x00\x01\x00",  # 3.1.1 UNSUBACK longer than 2
        b"\x20\x03\x00\x00\x00",  # 3.1.1 CONNACK longer than 2
        b"\x20\x01\x00",  # CONNACK too short
        b"\x30\x01\x00",  # PUBLISH topic length truncated
        b"\x30\x03\x00\x05a",  # PUBLISH topic past the end
        b"\x32\x03\x00\x01a",  # QoS 1 PUBLISH without packet id
        b"\x82\x05\x00\x01\x00\x01a",  # SUBSCRIBE filter without options byte
        b"\xa2\x04\x00\x01\x00\x05",  # UNSUBSCRIBE filter past the end
        frame(0x10, CONNECT4[2:] + b"\x00"),  # CONNECT with a trailing byte
        frame(0x10, CONNECT4[2:-1]),  # CONNECT cut short
    ],
)
def test_body_length_mismatch(data: bytes) -> None:
    reject(data, 4, 0x81)


def test_v5_body_length_mismatch() -> None:
    reject(b"\x40\x05\x00\x01\x00\x05\x1f", 5, 0x81)  # property length past the end
    reject(b"\x40\x05\x00\x01\x00\x00\x00", 5, 0x81)  # trailing byte after properties
    reject(b"\x30\x03\x00\x01a", 5, 0x81)  # PUBLISH without property length
    reject(b"\xe0\x03\x00\x00\x00", 5, 0x81)  # DISCONNECT trailing byte


# -- UTF-8 strings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [b"\xff", b"a\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"a\x00b"],
    ids=["invalid", "overlong", "surrogate", "truncated", "nul"],
)
def test_bad_utf8_in_topic(bad: bytes) -> None:
    reject(frame(0x30, raw_str(bad) + b"payload"), 4, 0x81)


@pytest.mark.parametrize("bad", [b"\xff", b"\xed\xa0\x80", b"\x00"])
def test_bad_utf8_elsewhere(bad: bytes) -> None:
    # CONNECT client id, SUBSCRIBE filter, UNSUBSCRIBE filter, v5 user property
    reject(frame(0x10, s("MQTT") + b"\x04\x02\x00\x3c" + raw_str(bad)), None, 0x81)
    reject(frame(0x82, b"\x00\x01" + raw_str(bad) + b"\x00"), 4, 0x81)
    reject(frame(0xA2, b"\x00\x01" + raw_str(bad)), 4, 0x81)
    reject(frame(0x40, b"\x00\x01\x00" + props(b"\x26" + s("k") + raw_str(bad))), 5, 0x81)


# -- PUBLISH --------------------------------------------------------------------------------------


def test_publish_qos3() -> None:
    reject(frame(0x36, s("t") + b"\x00\x01"), 4, 0x81)  # [MQTT-3.3.1-4]


def test_publish_qos0_with_dup() -> None:
    reject(frame(0x38, s("t") + b"x"), 4, 0x81)  # [MQTT-3.3.1-2]


@pytest.mark.parametrize("topic", ["a/+", "#", "a/#", "+", "a+b"])
def test_publish_topic_wildcards(topic: str) -> None:
    reject(frame(0x30, s(topic)), 4, 0x90)  # [MQTT-3.3.2-2]
    reject(frame(0x30, s(topic) + b"\x00"), 5, 0x90)


def test_publish_empty_topic() -> None:
    reject(frame(0x30, s("")), 4, 0x90)  # [MQTT-4.7.3-1]
    reject(frame(0x30, s("") + b"\x00"), 5, 0x82)  # v5: only legal with a topic alias


def test_v5_empty_topic_with_alias_is_returned() -> None:
    out = PacketParser(protocol_level=5).feed(frame(0x30, s("") + props(b"\x23\x00\x01") + b"x"))
    assert out == [Publish("", b"x", properties={0x23: 1})]


def test_packet_id_zero() -> None:
    reject(frame(0x32, s("t") + b"\x00\x00"), 4, 0x81)  # [MQTT-2.3.1-1]
    reject(b"\x40\x02\x00\x00", 4, 0x81)
    reject(b"\x50\x02\x00\x00", 4, 0x81)
    reject(b"\x62\x02\x00\x00", 4, 0x81)
    reject(b"\x70\x02\x00\x00", 4, 0x81)
    reject(frame(0x82, b"\x00\x00" + s("a") + b"\x00"), 4, 0x81)
    reject(frame(0xA2, b"\x00\x00" + s("a")), 4, 0x81)
    reject(b"\x90\x03\x00\x00\x00", 4, 0x81)
    reject(b"\xb0\x02\x00\x00", 4, 0x81)


# -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------------


def test_subscribe_without_filters() -> None:
    reject(b"\x82\x02\x00\x01", 4, 0x82)  # [MQTT-3.8.3-3]
    reject(b"\x82\x03\x00\x01\x00", 5, 0x82)


def test_unsubscribe_without_filters() -> None:
    reject(b"\xa2\x02\x00\x01", 4, 0x82)  # [MQTT-3.10.3-2]
    reject(b"\xa2\x03\x00\x01\x00", 5, 0x82)


@pytest.mark.parametrize("opts", [0x03, 0x04, 0x80, 0x41])
def test_subscribe_options_v3(opts: int) -> None:
    reject(frame(0x82, b"\x00\x01" + s("a") + bytes((opts,))), 4, 0x81)  # [MQTT-3-8.3-4]


@pytest.mark.parametrize(
    ("opts", "code"),
    [(0x40, 0x81), (0x80, 0x81), (0x03, 0x82), (0x30, 0x82)],
    ids=["reserved6", "reserved7", "qos3", "retain_handling3"],
)
def test_subscribe_options_v5(opts: int, code: int) -> None:
    # reserved bits: malformed [MQTT-3.8.3-5]; QoS 3 and retain handling 3: Protocol Error (3.8.3.1)
    reject(frame(0x82, b"\x00\x01\x00" + s("a") + bytes((opts,))), 5, code)


def test_suback_invalid_return_code() -> None:
    reject(b"\x90\x03\x00\x01\x03", 4, 0x82)
    reject(b"\x90\x04\x00\x01\x00\x10", 5, 0x82)


# -- CONNECT --------------------------------------------------------------------------------------


def connect_bytes(
    name: str = "MQTT", level: int = 4, flags: int = 0x02, tail: bytes = s("c")
) -> bytes:
    return frame(0x10, s(name) + bytes((level, flags)) + b"\x00\x3c" + tail)


def test_first_packet_must_be_connect() -> None:
    reject(encode(Publish("t"), 4), None, 0x82)  # [MQTT-3.1.0-1]
    reject(b"\xc0", None, 0x82)  # known from the first byte


def test_connect_reserved_fixed_header_flags() -> None:
    reject(b"\x11\x00", None, 0x81)


def test_connect_unknown_protocol_name() -> None:
    reject(connect_bytes(name="MQTX"), None, 0x82)  # [MQTT-3.1.2-1]


@pytest.mark.parametrize(
    ("name", "level"), [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTT", 0), ("MQTT", 0x84)]
)
def test_connect_unsupported_level(name: str, level: int) -> None:
    parser = PacketParser()
    with pytest.raises(UnsupportedProtocolVersion) as info:
        parser.feed(connect_bytes(name=name, level=level, tail=b"\xff\xff"))
    assert info.value.protocol_level == level
    assert info.value.reason_code == 0x84
    assert info.value.connack == b"\x20\x02\x00\x01"  # [MQTT-3.1.2-2]


def test_connect_unsupported_level_v5_connack() -> None:
    err = UnsupportedProtocolVersion(5, "MQIsdp")
    assert err.connack == b"\x20\x03\x00\x84\x00"


def test_connect_reserved_flag() -> None:
    reject(connect_bytes(flags=0x03), None, 0x81)  # [MQTT-3.1.2-3]


@pytest.mark.parametrize("flags", [0x0A, 0x12, 0x22, 0x1A])
def test_connect_will_qos_retain_without_will_flag(flags: int) -> None:
    reject(connect_bytes(flags=flags), None, 0x81)  # [MQTT-3.1.2-11/13/15]


def test_connect_will_qos3() -> None:
    reject(connect_bytes(flags=0x1E, tail=s("c") + s("w") + s("x")), None, 0x81)  # [MQTT-3.1.2-14]


def test_connect_password_without_username_v311() -> None:
    reject(connect_bytes(flags=0x42, tail=s("c") + s("pw")), None, 0x81)  # [MQTT-3.1.2-22]
    reject(connect_bytes("MQIsdp", 3, flags=0x42, tail=s("c") + s("pw")), None, 0x81)


def test_connect_password_without_username_v5_ok() -> None:
    out = PacketParser().feed(connect_bytes(level=5, flags=0x42, tail=b"\x00" + s("c") + s("pw")))
    assert out[0].password == b"pw" and out[0].username is None


def test_connect_will_topic_with_wildcard() -> None:
    reject(connect_bytes(flags=0x06, tail=s("c") + s("w/#") + s("x")), None, 0x90)


def test_connect_missing_flagged_fields() -> None:
    reject(connect_bytes(flags=0x82), None, 0x81)  # username flag without a username
    reject(connect_bytes(flags=0x06), None, 0x81)  # will flag without will topic


def test_connect_auth_data_without_method() -> None:
    tail = props(b"\x16" + s("x")) + s("c")
    reject(connect_bytes(level=5, tail=tail), None, 0x82)


def test_connack_reserved_flags() -> None:
    reject(b"\x20\x02\x02\x00", 4, 0x81)  # [MQTT-3.2.2-1]
    reject(b"\x20\x02\x00\x06", 4, 0x81)
    reject(b"\x20\x03\x00\x01\x00", 5, 0x82)


# -- v5 properties --------------------------------------------------------------------------------


def pub5(*entries: bytes) -> bytes:
    return frame(0x30, s("t") + props(*entries) + b"payload")


@pytest.mark.parametrize(
    "entry",
    [
        b"\x11\x00\x00\x00\x01",  # session expiry interval in PUBLISH
        b"\x1f" + s("r"),  # reason string in PUBLISH
        b"\x21\x00\x01",  # receive maximum in PUBLISH
        b"\x18\x00\x00\x00\x01",  # will delay interval outside the will
    ],
)
def test_property_not_allowed_in_packet(entry: bytes) -> None:
    reject(pub5(entry), 5, 0x81)  # 2.2.2.2


def test_property_not_allowed_elsewhere() -> None:
    reject(frame(0x40, b"\x00\x01\x00" + props(b"\x23\x00\x01")), 5, 0x81)  # alias in PUBACK
    tail = props(b"\x23\x00\x01") + s("c")
    reject(connect_bytes(level=5, tail=tail), None, 0x81)  # alias in CONNECT
    will = s("c") + props(b"\x11\x00\x00\x00\x01") + s("w") + s("x")
    reject(connect_bytes(level=5, flags=0x06, tail=b"\x00" + will), None, 0x81)


@pytest.mark.parametrize("pid", [0x00, 0x04, 0x7F, 0x80, 0xFF])
def test_unknown_property_id(pid: int) -> None:
    reject(pub5(bytes((pid, 0))), 5, 0x81)


@pytest.mark.parametrize(
    "entry",
    [b"\x01\x00", b"\x02\x00\x00\x00\x01", b"\x03" + s("a"), b"\x08" + s("a"), b"\x09" + s("a"),
     b"\x23\x00\x01"],
)
def test_duplicate_property(entry: bytes) -> None:
    reject(pub5(entry, entry), 5, 0x82)


def test_repeatable_properties_may_repeat() -> None:
    up = b"\x26" + s("a") + s("b")
    out = PacketParser(protocol_level=5).feed(pub5(up, b"\x0b\x01", up, b"\x0b\x02"))
    assert out[0].properties == {0x26: [("a", "b"), ("a", "b")], 0x0B: [1, 2]}


def test_two_subscription_identifiers_in_subscribe() -> None:
    body = b"\x00\x01" + props(b"\x0b\x01", b"\x0b\x02") + s("a") + b"\x00"
    reject(frame(0x82, body), 5, 0x82)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (pub5(b"\x01\x02"), 0x82),  # payload format indicator 2
        (pub5(b"\x23\x00\x00"), 0x94),  # topic alias 0 [MQTT-3.3.2-8]
        (pub5(b"\x0b\x00"), 0x82),  # subscription identifier 0
        (pub5(b"\x08" + s("a/#")), 0x82),  # response topic with a wildcard [MQTT-3.3.2-14]
        (pub5(b"\x0b\x80\x00"), 0x81),  # non-minimal variable byte integer [MQTT-1.5.5-1]
        (pub5(b"\x0b\x80\x80\x80\x80\x01"), 0x81),  # five-byte variable byte integer
        (pub5(b"\x02\x00\x00"), 0x81),  # truncated four-byte integer
        (pub5(b"\x23\x00"), 0x81),  # truncated two-byte integer
        (pub5(b"\x01"), 0x81),  # truncated byte
        (pub5(b"\x09\x00\x05ab"), 0x81),  # binary data past the property length
    ],
)
def test_invalid_property_values(data: bytes, code: int) -> None:
    reject(data, 5, code)


@pytest.mark.parametrize(
    "entry",
    [b"\x21\x00\x00", b"\x27\x00\x00\x00\x00", b"\x17\x02", b"\x19\x05"],
    ids=["receive_maximum_0", "maximum_packet_size_0", "problem_info_2", "response_info_5"],
)
def test_invalid_connect_property_values(entry: bytes) -> None:
    reject(connect_bytes(level=5, tail=props(entry) + s("c")), None, 0x82)


@pytest.mark.parametrize("entry", [b"\x24\x02", b"\x25\x02", b"\x28\x03", b"\x2a\x02"])
def test_invalid_connack_property_values(entry: bytes) -> None:
    reject(frame(0x20, b"\x00\x00" + props(entry)), 5, 0x82)


# -- v5 reason codes and types --------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"\x40\x03\x00\x01\x01", b"\x50\x03\x00\x01\x92", b"\x62\x03\x00\x01\x10",
     b"\x70\x03\x00\x01\x80", b"\xe0\x01\x01", b"\xf0\x01\x01", b"\xb0\x04\x00\x01\x00\x02"],
)
def test_invalid_reason_codes(data: bytes) -> None:
    reject(data, 5, 0x82)


@pytest.mark.parametrize("level", [3, 4])
def test_auth_before_v5(level: int) -> None:
    reject(b"\xf0\x00", level, 0x81)


def test_error_carries_packets_decoded_before_it() -> None:
    good = encode(Publish("a"), 4)
    err = reject(good + good + b"\x00\x00", 4, 0x81)
    assert err.packets == [Publish("a"), Publish("a")]


def test_will_qos_in_v5_connect_roundtrip_still_validated() -> None:
    data = encode(Connect("c", 5, will=Will("w", b"", 3)), 5)  # encoder trusts; parser refuses
    reject(data, None, 0x81)
