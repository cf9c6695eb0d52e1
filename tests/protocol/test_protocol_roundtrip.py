"""Encode -> parse round trips for every packet type, level, and property."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import packets, publishes

from broker.protocol import (
    PROPERTY_SPECS,
    WILL_CONTEXT,
    Auth,
    Connack,
    Connect,
    Disconnect,
    PacketParser,
    PacketType,
    PingReq,
    PingResp,
    Prop,
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
    encode,
    encode_publish,
    publish_parts,
)

LEVELS = (3, 4, 5)
# test_random_stream_split_anywhere: 50 streams per level in CI (14 s of CI at 150), 1,500
# with TEST_SOAK=1 (tests/protocol/test_codec_fuzz.py's precedent)
SPLIT_EXAMPLES = 1_500 if os.environ.get("TEST_SOAK") == "1" else 50


def roundtrip(pkt: Any, level: int) -> Any:
    data = encode(pkt, level)
    parser = PacketParser(protocol_level=level)
    out = parser.feed(data)
    assert out == [pkt], (data.hex(), out)
    assert parser.buffered == 0
    return data


def _connect(level: int, **kw: Any) -> Connect:
    return Connect(
        client_id="client-1",
        protocol_level=level,
        protocol_name="MQIsdp" if level == 3 else "MQTT",
        **kw,
    )


# -- one example per type and level, without properties -------------------------------------------

PLAIN = [
    lambda lv: _connect(lv),
    lambda lv: _connect(
        lv,
        clean_start=False,
        keepalive=0,
        username="user",
        password=b"\x00secret\xff",
        will=Will("last/will", b"bye", 2, True),
    ),
    lambda lv: Connack(session_present=lv != 3, reason_code=0),
    lambda lv: Connack(reason_code=5 if lv != 5 else 0x87),
    lambda lv: Publish("a/b", b"hello"),
    lambda lv: Publish("a/b", b"", qos=1, packet_id=1, retain=True),
    lambda lv: Publish("ü/€/😀", b"x" * 200, qos=2, packet_id=65535, dup=True),
    lambda lv: PubAck(1),
    lambda lv: PubRec(2),
    lambda lv: PubRel(3),
    lambda lv: PubComp(65535),
    lambda lv: Subscribe(10, [("a/b", SubscriptionOptions(1)), ("c/#", SubscriptionOptions(2))]),
    lambda lv: Suback(10, [0, 1, 2, 0x80]),
    lambda lv: Unsubscribe(11, ["a/b", "+/c"]),
    lambda lv: Unsuback(11, [0, 0x11] if lv == 5 else []),
    lambda lv: PingReq(),
    lambda lv: PingResp(),
    lambda lv: Disconnect(),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("make", PLAIN)
def test_roundtrip_plain(make: Any, level: int) -> None:
    roundtrip(make(level), level)


@pytest.mark.parametrize("level", LEVELS)
def test_connect_roundtrip_through_server_role(level: int) -> None:
    pkt = _connect(level, username="u", password=b"p", will=Will("w", b"x", 1, False))
    parser = PacketParser()
    assert parser.feed(encode(pkt, level)) == [pkt]
    assert parser.protocol_level == level


def test_v5_password_without_username() -> None:
    roundtrip(_connect(5, password=b"token"), 5)


# -- v5 with properties: every property id at least once, where it is allowed ---------------------

UP = [("k1", "v1"), ("k2", "v2"), ("k1", "again"), ("", "")]


def test_every_property_id_is_exercised() -> None:
    """The v5 examples below carry every property identifier of table 2-4 at least once."""
    seen: set[int] = set()
    for pkt in V5_WITH_PROPS:
        for props in (pkt.properties, getattr(getattr(pkt, "will", None), "properties", None)):
            seen.update(props or ())
    assert seen == set(Prop)


V5_WITH_PROPS: list[Any] = [
    Connect(
        "c",
        5,
        properties={
            Prop.SESSION_EXPIRY_INTERVAL: 3600,
            Prop.RECEIVE_MAXIMUM: 20,
            Prop.MAXIMUM_PACKET_SIZE: 1 << 20,
            Prop.TOPIC_ALIAS_MAXIMUM: 10,
            Prop.REQUEST_RESPONSE_INFORMATION: 1,
            Prop.REQUEST_PROBLEM_INFORMATION: 0,
            Prop.USER_PROPERTY: UP,
            Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-1",
            Prop.AUTHENTICATION_DATA: b"\x00\x01",
        },
        will=Will(
            "w/t",
            b"gone",
            1,
            True,
            {
                Prop.WILL_DELAY_INTERVAL: 5,
                Prop.PAYLOAD_FORMAT_INDICATOR: 1,
                Prop.MESSAGE_EXPIRY_INTERVAL: 60,
                Prop.CONTENT_TYPE: "text/plain",
                Prop.RESPONSE_TOPIC: "reply/here",
                Prop.CORRELATION_DATA: b"corr",
                Prop.USER_PROPERTY: UP,
            },
        ),
    ),
    Connack(
        True,
        0,
        {
            Prop.SESSION_EXPIRY_INTERVAL: 0,
            Prop.RECEIVE_MAXIMUM: 100,
            Prop.MAXIMUM_QOS: 1,
            Prop.RETAIN_AVAILABLE: 0,
            Prop.MAXIMUM_PACKET_SIZE: 65536,
            Prop.ASSIGNED_CLIENT_IDENTIFIER: "auto-123",
            Prop.TOPIC_ALIAS_MAXIMUM: 16,
            Prop.REASON_STRING: "ok",
            Prop.USER_PROPERTY: UP,
            Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
            Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
            Prop.SHARED_SUBSCRIPTION_AVAILABLE: 0,
            Prop.SERVER_KEEP_ALIVE: 30,
            Prop.RESPONSE_INFORMATION: "resp/",
            Prop.SERVER_REFERENCE: "other:1883",
            Prop.AUTHENTICATION_METHOD: "m",
            Prop.AUTHENTICATION_DATA: b"d",
        },
    ),
    Publish(
        "t",
        b"p",
        1,
        False,
        False,
        7,
        {
            Prop.PAYLOAD_FORMAT_INDICATOR: 0,
            Prop.MESSAGE_EXPIRY_INTERVAL: 10,
            Prop.TOPIC_ALIAS: 3,
            Prop.RESPONSE_TOPIC: "r",
            Prop.CORRELATION_DATA: b"",
            Prop.USER_PROPERTY: UP,
            Prop.SUBSCRIPTION_IDENTIFIER: [1, 268_435_455, 128],
            Prop.CONTENT_TYPE: "application/json",
        },
    ),
    Publish("", b"alias only", 0, properties={Prop.TOPIC_ALIAS: 3}),
    PubAck(1, 0x10, {Prop.REASON_STRING: "nobody", Prop.USER_PROPERTY: UP}),
    PubAck(1, 0x80),
    PubRec(2, 0x97, {Prop.REASON_STRING: "quota"}),
    PubRel(3, 0x92, {Prop.USER_PROPERTY: UP}),
    PubComp(4, 0, {Prop.REASON_STRING: ""}),
    Subscribe(
        5,
        [
            ("a/+", SubscriptionOptions(2, True, True, 2)),
            ("$share/g/x/#", SubscriptionOptions(0, False, False, 1)),
        ],
        {Prop.SUBSCRIPTION_IDENTIFIER: [42], Prop.USER_PROPERTY: UP},
    ),
    Suback(5, [0, 1, 2, 0x80, 0x8F, 0xA2], {Prop.REASON_STRING: "partial"}),
    Unsubscribe(6, ["a/+"], {Prop.USER_PROPERTY: UP}),
    Unsuback(6, [0, 0x11, 0x87], {Prop.REASON_STRING: "r", Prop.USER_PROPERTY: UP}),
    Disconnect(0x8B, {Prop.SESSION_EXPIRY_INTERVAL: 0, Prop.SERVER_REFERENCE: "s2"}),
    Disconnect(0x04, {Prop.REASON_STRING: "bye", Prop.USER_PROPERTY: UP}),
    Disconnect(0x8E),
    Auth(0x18, {Prop.AUTHENTICATION_METHOD: "m", Prop.AUTHENTICATION_DATA: b"x"}),
    Auth(0x19, {Prop.REASON_STRING: "again", Prop.USER_PROPERTY: UP}),
    Auth(0x18),
    Auth(),
]


@pytest.mark.parametrize("pkt", V5_WITH_PROPS, ids=lambda p: type(p).__name__)
def test_roundtrip_v5_with_properties(pkt: Any) -> None:
    roundtrip(pkt, 5)


def test_user_property_order_is_kept() -> None:
    pkt = PubAck(9, 0, {Prop.USER_PROPERTY: [("b", "1"), ("a", "2"), ("b", "3")]})
    out = PacketParser(protocol_level=5).feed(encode(pkt, 5))[0]
    assert out.properties[Prop.USER_PROPERTY] == [("b", "1"), ("a", "2"), ("b", "3")]


def test_decoded_property_keys_are_prop_members() -> None:
    pkt = Publish("t", properties={0x02: 5, 0x26: [("a", "b")]})
    out = PacketParser(protocol_level=5).feed(encode(pkt, 5))[0]
    assert all(type(k) is Prop for k in out.properties)
    assert out.properties == {Prop.MESSAGE_EXPIRY_INTERVAL: 5, Prop.USER_PROPERTY: [("a", "b")]}


def test_property_table_is_complete() -> None:
    assert set(PROPERTY_SPECS) == set(Prop)
    assert len(Prop) == 27
    assert Prop.USER_PROPERTY in PROPERTY_SPECS and WILL_CONTEXT == 0


# -- 3.x drops v5-only fields ---------------------------------------------------------------------


@pytest.mark.parametrize("level", (3, 4))
def test_v3_drops_v5_fields(level: int) -> None:
    p = PacketParser(protocol_level=level)
    assert encode(PubAck(1, 0x10, {Prop.REASON_STRING: "x"}), level) == b"\x40\x02\x00\x01"
    assert encode(Disconnect(0x8B, {Prop.REASON_STRING: "x"}), level) == b"\xe0\x00"
    assert encode(Unsuback(2, [0x11]), level) == b"\xb0\x02\x00\x02"
    pub = Publish("t", b"x", properties={Prop.MESSAGE_EXPIRY_INTERVAL: 5})
    assert p.feed(encode(pub, level)) == [Publish("t", b"x")]
    con = _connect(level, properties={Prop.RECEIVE_MAXIMUM: 5})
    assert p.feed(encode(con, level))[0].properties is None


@pytest.mark.parametrize(
    ("reason", "code"),
    [(0, 0), (0x84, 1), (0x85, 2), (0x88, 3), (0x89, 3), (0x86, 4), (0x87, 5), (0x97, 3), (4, 4)],
)
def test_connack_reason_mapped_for_v3(reason: int, code: int) -> None:
    assert encode(Connack(False, reason), 4) == bytes((0x20, 2, 0, code))


def test_suback_failures_mapped_for_v3() -> None:
    wire = bytes.fromhex("90080001000102808080")
    assert encode(Suback(1, [0, 1, 2, 0x80, 0x87, 0xA2]), 4) == wire


def test_connect_protocol_name_follows_level() -> None:
    assert encode(Connect("c"), 3)[2:10] == b"\x00\x06MQIsdp"
    assert encode(Connect("c", protocol_name="MQIsdp"), 4)[2:8] == b"\x00\x04MQTT"


# -- remaining length boundaries ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remaining", "header_len"),
    [(0, 2), (127, 2), (128, 3), (16383, 3), (16384, 4), (2_097_151, 4), (2_097_152, 5)],
)
def test_remaining_length_boundaries(remaining: int, header_len: int) -> None:
    if remaining == 0:
        data = encode(PingReq(), 4)
        assert len(data) == header_len
        return
    pkt = Publish("t", b"\xaa" * (remaining - 3))  # topic length (2) + "t" (1) + payload
    data = roundtrip(pkt, 4)
    assert len(data) == header_len + remaining
    # and fed one byte at a time through the header, then the rest
    parser = PacketParser(protocol_level=4)
    for i in range(header_len + 1):
        assert parser.feed(data[i : i + 1]) == []
    assert parser.feed(data[header_len + 1 :]) == [pkt]


def test_largest_remaining_length_header_is_accepted_until_body() -> None:
    parser = PacketParser(protocol_level=4)
    assert parser.feed(b"\x30\xff\xff\xff\x7f\x00\x01t") == []
    assert parser.buffered == 8


# -- publish_parts / encode_publish ---------------------------------------------------------------


@given(pkt=publishes(5), level=st.sampled_from(LEVELS))
@settings(max_examples=200)
def test_publish_parts_assemble_to_encode(pkt: Publish, level: int) -> None:
    if level != 5:
        pkt.properties = None
        pkt.topic = pkt.topic or "t"
    head, tail = publish_parts(
        pkt.topic, pkt.payload, pkt.qos, pkt.retain, pkt.dup, pkt.properties, level
    )
    wire = encode_publish(pkt, level)
    if pkt.qos:
        assert head + pkt.packet_id.to_bytes(2, "big") + tail == wire
    else:
        assert head + tail == wire
    assert encode(pkt, level) == wire
    assert PacketParser(protocol_level=level).feed(wire) == [pkt]


@pytest.mark.parametrize("size", [0, 100, 124, 125, 200, 20000])
def test_publish_parts_length_counts_packet_id(size: int) -> None:
    head, tail = publish_parts("ab", b"x" * size, 1, False, False, None, 4)
    parser = PacketParser(protocol_level=4)
    for pid in (1, 2, 65535):
        assert parser.feed(head + pid.to_bytes(2, "big") + tail) == [
            Publish("ab", b"x" * size, 1, packet_id=pid)
        ]


# -- hypothesis: random packet streams, split at random points ------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
@settings(max_examples=SPLIT_EXAMPLES, suppress_health_check=[HealthCheck.too_slow],
          deadline=None)
def test_random_stream_split_anywhere(level: int, data: st.DataObject) -> None:
    pkts = data.draw(st.lists(packets(level), min_size=1, max_size=12))
    stream = b"".join(encode(p, level) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    parser = PacketParser(protocol_level=level)
    out: list[Any] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        chunk = stream[prev:cut]
        out += parser.feed(data.draw(st.sampled_from([bytes, bytearray, memoryview]))(chunk))
        prev = cut
    assert out == pkts
    assert parser.buffered == 0


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
@settings(max_examples=50, deadline=None)
def test_server_role_stream_after_connect(level: int, data: st.DataObject) -> None:
    """Server role: the level found in CONNECT governs the packets coalesced after it."""
    con = _connect(level)
    pkts = data.draw(
        st.lists(
            st.one_of(publishes(level), st.builds(PubAck, st.integers(1, 65535))), max_size=6
        )
    )
    stream = b"".join(encode(p, level) for p in [con, *pkts])
    parser = PacketParser()
    assert parser.feed(stream) == [con, *pkts]


def test_every_type_covered_by_strategies() -> None:
    assert {t.value for t in PacketType} == set(range(1, 16))
