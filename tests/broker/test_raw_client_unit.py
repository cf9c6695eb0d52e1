"""The raw test client's encoder/decoder against byte strings written from the specifications.

If these fail, the behaviour tests that use the raw client cannot be trusted.
"""

import pytest
from helpers import raw
from helpers.broker import metric_sum, parse_metrics, to_toml
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        # MQTT 3.1.1 Table 2.4 / MQTT 5.0 Table 1-1: Size of Variable Byte Integer
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_varint_matches_spec_table(value, encoded):
    assert raw.encode_varint(value) == encoded
    assert raw.decode_varint(encoded) == (value, len(encoded))


def test_varint_rejects_five_bytes():
    with pytest.raises(raw.MalformedError):
        raw.decode_varint(b"\xff\xff\xff\xff\x7f")


@given(st.integers(min_value=0, max_value=268_435_455))
def test_varint_round_trip(value):
    assert raw.decode_varint(raw.encode_varint(value)) == (value, len(raw.encode_varint(value)))


def test_connect_311_bytes():
    # Fixed header 0x10, remaining 13: "MQTT", level 4, flags clean(0x02), keepalive 60, "a".
    assert raw.connect("a", keepalive=60) == (
        b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a"
    )


def test_connect_31_bytes():
    # MQTT 3.1: protocol name "MQIsdp", level 3.
    assert raw.connect("a", version=3, keepalive=10) == (
        b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x0a\x00\x01a"
    )


def test_connect_v5_with_will_user_password():
    will = raw.Will("w", b"x", qos=1, retain=True, properties={raw.WILL_DELAY_INTERVAL: 5})
    data = raw.connect("c", version=5, clean=False, keepalive=0, username="u", password=b"p",
                       will=will, properties={raw.SESSION_EXPIRY_INTERVAL: 300})
    body = (
        b"\x00\x04MQTT\x05"
        + bytes([0x80 | 0x40 | 0x20 | 0x08 | 0x04])  # user, password, will retain, QoS 1, will
        + b"\x00\x00"
        + b"\x05\x11\x00\x00\x01\x2c"  # properties: session expiry 300
        + b"\x00\x01c"
        + b"\x05\x18\x00\x00\x00\x05"  # will properties: will delay 5
        + b"\x00\x01w\x00\x01x"
        + b"\x00\x01u\x00\x01p"
    )
    assert data == b"\x10" + raw.encode_varint(len(body)) + body


def test_publish_bytes():
    assert raw.publish("a/b", b"hi", qos=1, packet_id=10) == b"\x32\x09\x00\x03a/b\x00\x0ahi"
    assert raw.publish("t", b"", qos=0, retain=True) == b"\x31\x03\x00\x01t"
    assert raw.publish("t", b"x", qos=2, packet_id=1, dup=True) == b"\x3c\x06\x00\x01t\x00\x01x"
    # v5 with an empty property block
    assert raw.publish("t", b"x", version=5) == b"\x30\x05\x00\x01t\x00x"


def test_subscribe_and_acks_bytes():
    assert raw.subscribe(1, "a/#", 1) == b"\x82\x08\x00\x01\x00\x03a/#\x01"
    assert raw.subscribe(2, [("x", raw.sub_options(2, no_local=True, retain_handling=2))],
                         version=5, properties={raw.SUBSCRIPTION_IDENTIFIER: [7]}) == (
        b"\x82\x09\x00\x02\x02\x0b\x07\x00\x01x\x26"
    )
    assert raw.unsubscribe(3, "a") == b"\xa2\x05\x00\x03\x00\x01a"
    assert raw.puback(7) == b"\x40\x02\x00\x07"
    assert raw.pubrec(7) == b"\x50\x02\x00\x07"
    assert raw.pubrel(7) == b"\x62\x02\x00\x07"
    assert raw.pubcomp(7) == b"\x70\x02\x00\x07"
    assert raw.pingreq() == b"\xc0\x00"
    assert raw.disconnect() == b"\xe0\x00"
    assert raw.disconnect(0x04) == b"\xe0\x01\x04"


def test_decode_server_packets():
    ack = raw.decode_packet(b"\x20\x02\x01\x00")
    assert ack.type == raw.CONNACK and ack.session_present and ack.reason_code == 0
    ack5 = raw.decode_packet(b"\x20\x08\x00\x00\x05\x21\x00\x0a\x24\x01", version=5)
    assert ack5.properties == {raw.RECEIVE_MAXIMUM: 10, raw.MAXIMUM_QOS: 1}
    pub = raw.decode_packet(b"\x3b\x09\x00\x03a/b\x00\x0ahi")
    assert (pub.topic, pub.qos, pub.retain, pub.dup, pub.packet_id, pub.payload) == (
        "a/b", 1, True, True, 10, b"hi"
    )
    pub5 = raw.decode_packet(
        raw.publish("t", b"p", qos=1, packet_id=3, version=5,
                    properties=[(raw.USER_PROPERTY, ("k", "v")), (raw.USER_PROPERTY, ("k", "w")),
                                (raw.SUBSCRIPTION_IDENTIFIER, 5)]),
        version=5,
    )
    assert pub5.properties[raw.USER_PROPERTY] == [("k", "v"), ("k", "w")]
    assert pub5.properties[raw.SUBSCRIPTION_IDENTIFIER] == [5]
    suback = raw.decode_packet(b"\x90\x05\x00\x01\x00\x02\x80")
    assert suback.packet_id == 1 and suback.reason_codes == [0, 2, 0x80]
    suback5 = raw.decode_packet(b"\x90\x04\x00\x01\x00\x8f", version=5)
    assert suback5.reason_codes == [0x8F]
    disc = raw.decode_packet(b"\xe0\x01\x8b", version=5)
    assert disc.type == raw.DISCONNECT and disc.reason_code == 0x8B
    puback5 = raw.decode_packet(b"\x40\x02\x00\x05", version=5)
    assert puback5.reason_code == 0  # absent reason code means success (MQTT 5.0 3.4.2.1)
    assert raw.decode_packet(b"\xd0\x00").type == raw.PINGRESP


def test_decode_rejects_duplicate_property():
    with pytest.raises(raw.MalformedError):
        raw.decode_properties(b"\x0a\x11\x00\x00\x00\x01\x11\x00\x00\x00\x02", 0)


def test_split_packet_waits_for_whole_packet():
    assert raw.split_packet(b"\x30") is None
    assert raw.split_packet(b"\x30\x05\x00\x01t") is None
    assert raw.split_packet(b"\x30\x03\x00\x01tEXTRA") == (b"\x30\x03\x00\x01t", b"EXTRA")


def test_metrics_parser_and_toml_writer():
    text = (
        "# HELP meshmq_messages_dropped_total Dropped\n"
        "# TYPE meshmq_messages_dropped_total counter\n"
        'meshmq_messages_dropped_total{reason="queue_full"} 3.0\n'
        'meshmq_messages_dropped_total{reason="slow_consumer",listener="tcp"} 2\n'
        "meshmq_listener_sockets 4\n"
    )
    m = parse_metrics(text)
    assert m["meshmq_listener_sockets"] == 4
    assert metric_sum(m, "meshmq_messages_dropped_total") == 5
    assert metric_sum(m, "meshmq_messages_dropped_total", reason="queue_full") == 3
    toml = to_toml({"node": {"id": "x"}, "listener": {"tcp": {"bind": "a:1"}}, "mqtt": {"b": True}})
    assert '[node]\nid = "x"' in toml
    assert '[listener.tcp]\nbind = "a:1"' in toml
    assert "[mqtt]\nb = true" in toml
