"""ServerProtocol: CONNECT first and once, inbound topic aliases, state and encoding."""

from __future__ import annotations

import pytest

from broker.protocol import (
    AWAIT_CONNECT,
    CLOSED,
    CONNECTED,
    Connack,
    Connect,
    Disconnect,
    PingReq,
    Prop,
    ProtocolError,
    PubAck,
    Publish,
    ServerProtocol,
    Suback,
    UnsupportedProtocolVersion,
    encode,
)


def connected(level: int = 5, alias_max: int = 10, **props: int) -> ServerProtocol:
    proto = ServerProtocol(max_packet_size=1 << 20, topic_alias_maximum=alias_max)
    con = Connect(
        "c",
        level,
        properties={Prop[k.upper()]: v for k, v in props.items()} or None,
        protocol_name="MQIsdp" if level == 3 else "MQTT",
    )
    assert proto.receive_data(encode(con, level)) == [con]
    return proto


def test_connect_first() -> None:
    proto = ServerProtocol(1 << 20, 0)
    assert proto.state is AWAIT_CONNECT and proto.protocol_level is None
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(PingReq(), 4))
    assert info.value.reason_code == 0x82
    assert proto.state is CLOSED
    assert proto.receive_data(b"\xc0\x00") == []


@pytest.mark.parametrize("level", [3, 4, 5])
def test_connect_sets_level_and_state(level: int) -> None:
    proto = connected(level)
    assert proto.state is CONNECTED
    assert proto.protocol_level == level
    assert proto.connect is not None and proto.connect.client_id == "c"


def test_packets_coalesced_with_connect() -> None:
    proto = ServerProtocol(1 << 20, 0)
    con = Connect("c", 5)
    out = proto.receive_data(encode(con, 5) + encode(Publish("a", b"x"), 5) + b"\xc0\x00")
    assert out == [con, Publish("a", b"x"), PingReq()]


def test_second_connect() -> None:
    proto = connected(4)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(Connect("c", 4), 4))
    assert info.value.reason_code == 0x82  # [MQTT-3.1.0-2]
    assert proto.state is CLOSED


def test_unsupported_version() -> None:
    proto = ServerProtocol(1 << 20, 0)
    data = bytearray(encode(Connect("c", 4), 4))
    data[8] = 7
    with pytest.raises(UnsupportedProtocolVersion) as info:
        proto.receive_data(bytes(data))
    assert info.value.connack == b"\x20\x02\x00\x01"


@pytest.mark.parametrize("pkt", [Connack(), Suback(1, [0])])
def test_server_only_packets_from_client(pkt: object) -> None:
    proto = connected(4)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(pkt, 4))
    assert info.value.reason_code == 0x82


def test_alias_set_and_resolve() -> None:
    proto = connected(5, alias_max=5)
    first = Publish("a/b", b"1", properties={Prop.TOPIC_ALIAS: 3, Prop.CONTENT_TYPE: "t"})
    second = Publish("", b"2", properties={Prop.TOPIC_ALIAS: 3})
    out = proto.receive_data(encode(first, 5) + encode(second, 5))
    assert out == [
        Publish("a/b", b"1", properties={Prop.CONTENT_TYPE: "t"}),
        Publish("a/b", b"2"),
    ]
    # redefining the alias [MQTT-3.3.2-12]
    out = proto.receive_data(
        encode(Publish("c", b"3", properties={Prop.TOPIC_ALIAS: 3}), 5)
        + encode(Publish("", b"4", properties={Prop.TOPIC_ALIAS: 3}), 5)
    )
    assert [p.topic for p in out] == ["c", "c"]


def test_alias_above_maximum() -> None:
    proto = connected(5, alias_max=5)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(Publish("a", properties={Prop.TOPIC_ALIAS: 6}), 5))
    assert info.value.reason_code == 0x94
    assert proto.state is CLOSED


def test_alias_when_server_allows_none() -> None:
    proto = connected(5, alias_max=0)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(Publish("a", properties={Prop.TOPIC_ALIAS: 1}), 5))
    assert info.value.reason_code == 0x94


def test_alias_zero() -> None:
    proto = connected(5)
    body = bytes.fromhex("000174" "03" "230000" "78")  # topic "t", properties: alias 0
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(bytes((0x30, len(body))) + body)
    assert info.value.reason_code == 0x94


def test_unknown_alias() -> None:
    proto = connected(5)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(Publish("", b"x", properties={Prop.TOPIC_ALIAS: 2}), 5))
    assert info.value.reason_code == 0x82


def test_subscription_identifier_from_client() -> None:
    proto = connected(5)
    pub = Publish("a", properties={Prop.SUBSCRIPTION_IDENTIFIER: [1]})
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(pub, 5))
    assert info.value.reason_code == 0x82  # [MQTT-3.3.4-6]


def test_disconnect_closes_and_drops_the_rest() -> None:
    proto = connected(4)
    out = proto.receive_data(encode(Disconnect(), 4) + encode(Publish("a"), 4))
    assert out == [Disconnect()]
    assert proto.state is CLOSED


def test_client_maximum_packet_size() -> None:
    proto = connected(5, maximum_packet_size=100)
    assert proto.client_maximum_packet_size == 100
    assert proto.fits(100) and not proto.fits(101)
    assert connected(4).fits(10**9)


def test_send_encodes_at_negotiated_level() -> None:
    v4 = connected(4)
    assert v4.send(PubAck(1, 0x10)) == b"\x40\x02\x00\x01"
    assert v4.send(Connack(False, 0x86)) == b"\x20\x02\x00\x04"
    v5 = connected(5)
    assert v5.send(PubAck(1, 0x10)) == b"\x40\x03\x00\x01\x10"
    assert v5.send(Disconnect(0x8B)) == b"\xe0\x01\x8b"
    assert v5.state is CLOSED


def test_send_before_connect() -> None:
    with pytest.raises(RuntimeError):
        ServerProtocol(1 << 20, 0).send(PingReq())


def test_packet_too_large_for_server() -> None:
    proto = ServerProtocol(max_packet_size=64, topic_alias_maximum=0)
    proto.receive_data(encode(Connect("c", 5), 5))
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(encode(Publish("a", b"x" * 100), 5)[:4])
    assert info.value.reason_code == 0x95


def test_error_packets_are_checked_and_resolved() -> None:
    proto = connected(5)
    first = encode(Publish("a/b", b"1", properties={Prop.TOPIC_ALIAS: 1}), 5)
    second = encode(Publish("", b"2", properties={Prop.TOPIC_ALIAS: 1}), 5)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(first + second + b"\x00\x00")
    assert info.value.reason_code == 0x81
    assert info.value.packets == [Publish("a/b", b"1"), Publish("a/b", b"2")]
    assert proto.state is CLOSED


def test_garbage_after_disconnect_is_ignored() -> None:
    proto = connected(4)
    assert proto.receive_data(b"\xe0\x00\x00\x00") == [Disconnect()]
    assert proto.state is CLOSED


def test_second_connect_error_keeps_earlier_packets() -> None:
    proto = connected(4)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(b"\xc0\x00" + encode(Connect("c", 4), 4))
    assert info.value.packets == [PingReq()]


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("last", ["suback", "connect", "disconnect", "alias"])
def test_a_batch_of_plain_packets_is_checked_like_one_packet(level: int, last: str) -> None:
    """``receive_data`` passes a batch of a connected client's publishes and acks without a
    Python step per packet; one packet that needs a check anywhere in it (a server-only one,
    a second CONNECT, DISCONNECT, a v5 topic alias) still gets it, with the packets before it
    kept, as when it comes alone."""
    proto = connected(level)
    plain = [Publish(f"t/{i}", b"x", qos=1, packet_id=i + 1) if i % 2 else PubAck(i + 1)
             for i in range(40)]
    wire = b"".join(encode(p, level) for p in plain)
    assert proto.receive_data(wire) == plain
    if last == "alias":
        if level == 4:
            return  # (no aliases before 5)
        aliased = [Publish("a/b", b"1", properties={Prop.TOPIC_ALIAS: 2}),
                   Publish("", b"2", properties={Prop.TOPIC_ALIAS: 2})]
        out = proto.receive_data(wire + b"".join(encode(p, level) for p in aliased))
        assert out == [*plain, Publish("a/b", b"1"), Publish("a/b", b"2")]
        return
    if last == "disconnect":
        out = proto.receive_data(wire + encode(Disconnect(), level) + wire)
        assert out == [*plain, Disconnect()]
        assert proto.state is CLOSED
        return
    bad = Suback(1, [0]) if last == "suback" else Connect("c", level)
    with pytest.raises(ProtocolError) as info:
        proto.receive_data(wire + encode(bad, level) + wire)
    assert info.value.reason_code == 0x82
    assert info.value.packets == plain
    assert proto.state is CLOSED
