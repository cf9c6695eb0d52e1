"""Garbage and mutated input: the parser only ever raises ProtocolError, and stays bounded.

``test_mutated_valid_packets`` draws 100 examples per level in CI (16 s of CI at 300) and
3,000 with ``TEST_SOAK=1``, as tests/protocol/test_codec_fuzz.py does."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import packets

from broker.protocol import PacketParser, ProtocolError, encode

ROLES = [None, 3, 4, 5]
MAX = 4096
MUTATED_EXAMPLES = 3_000 if os.environ.get("TEST_SOAK") == "1" else 100


def feed_all(level: int | None, chunks: list[bytes], max_packet_size: int = MAX) -> list[Any]:
    parser = PacketParser(max_packet_size=max_packet_size, protocol_level=level)
    out: list[Any] = []
    try:
        for chunk in chunks:
            out += parser.feed(chunk)
            # nothing is buffered beyond one (bounded) partial packet
            assert parser.buffered <= max_packet_size + 5
    except ProtocolError as err:
        assert 0x80 <= err.reason_code <= 0xA2
    return out


@pytest.mark.parametrize("level", ROLES)
@given(chunks=st.lists(st.binary(max_size=200), max_size=8))
@settings(max_examples=400, deadline=None)
def test_random_garbage(level: int | None, chunks: list[bytes]) -> None:
    feed_all(level, chunks)


@pytest.mark.parametrize("level", ROLES)
@given(chunks=st.lists(st.binary(max_size=200), max_size=8))
@settings(max_examples=100, deadline=None)
def test_random_garbage_default_limit(level: int | None, chunks: list[bytes]) -> None:
    feed_all(level, chunks, 268_435_460)


@pytest.mark.parametrize("level", [3, 4, 5])
@given(data=st.data())
@settings(max_examples=MUTATED_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_mutated_valid_packets(level: int, data: st.DataObject) -> None:
    """Flip, insert or delete bytes of valid packets: deeper paths than pure garbage reaches."""
    pkts = data.draw(st.lists(packets(level), min_size=1, max_size=4))
    stream = bytearray(b"".join(encode(p, level) for p in pkts))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(stream) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            stream[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            stream.insert(i, data.draw(st.integers(0, 255)))
        elif len(stream) > 1:
            del stream[i]
    cut = data.draw(st.integers(0, len(stream)))
    for role in (level, None):
        feed_all(role, [bytes(stream[:cut]), bytes(stream[cut:])])


def test_huge_declared_length_is_not_buffered() -> None:
    parser = PacketParser(max_packet_size=1 << 20, protocol_level=4)
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"\x30\xff\xff\xff\x7f" + b"\x00" * 100)
    assert info.value.reason_code == 0x95
    assert parser.buffered == 0


def test_large_packet_arrives_in_small_chunks() -> None:
    """Accumulating a big body does not re-copy the buffer on every feed (and completes)."""
    payload = b"z" * 300_000
    from broker.protocol import Publish

    wire = encode(Publish("big", payload), 4)
    parser = PacketParser(protocol_level=4)
    out: list[Any] = []
    for i in range(0, len(wire), 1000):
        out += parser.feed(wire[i : i + 1000])
    assert out == [Publish("big", payload)]
