"""Packets against hand-written wire bytes (examples of the 3.1.1 and 5.0 specifications)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.protocol import (
    Connack,
    Connect,
    Disconnect,
    PacketParser,
    PingReq,
    PingResp,
    Prop,
    PubAck,
    Publish,
    PubRel,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsubscribe,
    Will,
    encode,
)

H = bytes.fromhex

CASES: list[tuple[int, Any, bytes]] = [
    (4, PingReq(), H("c000")),
    (4, PingResp(), H("d000")),
    (4, Disconnect(), H("e000")),
    (5, Disconnect(), H("e000")),
    (5, Disconnect(0x04), H("e00104")),
    (5, PubAck(1), H("40020001")),  # v5 short form: reason 0, no properties (3.4.2.1)
    (5, PubAck(1, 0x10), H("4003000110")),
    (5, PubRel(10), H("6202000a")),
    (4, Connack(False, 0), H("20020000")),
    (4, Connack(True, 0), H("20020100")),
    (5, Connack(False, 0), H("2003000000")),
    (5, Connack(False, 0x86), H("2003008600")),
    # 3.1.1 figure 3.6: "MQTT", level 4, flags 0xCE (user, password, will QoS 1, will, clean),
    # keep alive 10
    (
        4,
        Connect("c", 4, True, 10, "u", b"p", Will("w", b"x", 1, False)),
        H("1019" "00044d515454" "04" "ce" "000a" "000163" "000177" "000178" "000175" "000170"),
    ),
    # 3.1: "MQIsdp", level 3, clean session, keep alive 60, client id "abc"
    (
        3,
        Connect("abc", 3, True, 60, protocol_name="MQIsdp"),
        H("1011" "00064d5149736470" "03" "02" "003c" "0003616263"),
    ),
    # 5.0 figure 3-6 variable header: level 5, flags 0xCE, keep alive 10, properties length 5,
    # session expiry interval 10
    (
        5,
        Connect(
            "c",
            5,
            True,
            10,
            "u",
            b"p",
            Will("w", b"x", 1, False),
            {Prop.SESSION_EXPIRY_INTERVAL: 10},
        ),
        H("1020" "00044d515454" "05" "ce" "000a" "051100" "00000a" "000163" "00" "000177"
          "000178" "000175" "000170"),
    ),
    # 3.1.1 3.3.2: topic "a/b", packet identifier 10
    (4, Publish("a/b", b"hi", 1, packet_id=10), H("3209" "0003612f62" "000a" "6869")),
    (5, Publish("a/b", b"hi", 0, retain=True), H("3108" "0003612f62" "00" "6869")),
    # 3.1.1 figure 3.22: SUBSCRIBE pid 10, "a/b" QoS 1, "c/d" QoS 2
    (
        4,
        Subscribe(10, [("a/b", SubscriptionOptions(1)), ("c/d", SubscriptionOptions(2))]),
        H("820e" "000a" "0003612f6201" "0003632f6402"),
    ),
    # 3.1.1 figure 3.26: SUBACK return codes 0, 1, 2, 0x80
    (4, Suback(10, [0, 1, 2, 0x80]), H("9006000a00010280")),
    # 3.1.1 figure 3.30: UNSUBSCRIBE "a/b", "c/d"
    (4, Unsubscribe(10, ["a/b", "c/d"]), H("a20c" "000a" "0003612f62" "0003632f64")),
    (
        5,
        Subscribe(1, [("x", SubscriptionOptions(1, True, True, 2))]),
        H("8207" "0001" "00" "000178" "2d"),
    ),
]


@pytest.mark.parametrize(("level", "pkt", "wire"), CASES, ids=lambda v: repr(v)[:30])
def test_known_bytes(level: int, pkt: Any, wire: bytes) -> None:
    assert encode(pkt, level) == wire
    parser = PacketParser(protocol_level=level)
    assert parser.feed(wire) == [pkt]


def test_v5_short_forms_decode() -> None:
    parser = PacketParser(protocol_level=5)
    assert parser.feed(H("40020001")) == [PubAck(1)]
    assert parser.feed(H("4003000110")) == [PubAck(1, 0x10)]
    assert parser.feed(H("400400011000")) == [PubAck(1, 0x10)]  # empty property block
    assert parser.feed(H("e000")) == [Disconnect()]
    assert parser.feed(H("e0028e00")) == [Disconnect(0x8E)]
    assert parser.feed(H("f000"))[0].reason_code == 0
