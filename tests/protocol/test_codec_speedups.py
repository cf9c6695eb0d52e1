"""The codec's compiled parse loop (broker/protocol/_speedups.c) against the pure-Python loop.

Differential: the same bytes, cut into the same chunks, through PacketParser with the C run and
without it must give identical packets, identical errors (class, reason code, message, the
packets that preceded the error) and the same buffered tail. Skipped when the extension is not
built (the Python loop is then the only one, and the rest of the suite tests it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import packets

from broker.protocol import PacketParser, ProtocolError, PubAck, Publish, codec, encode

ROOT = Path(__file__).resolve().parents[2]
HYP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

pytestmark = pytest.mark.skipif(not codec.SPEEDUPS, reason="broker.protocol._speedups not built")


def run(level: int | None, chunks: list[bytes], c: bool, max_packet_size: int = 4096) -> Any:
    """Everything observable of feeding ``chunks``: packets per feed, then the error or tail."""
    saved = codec.c_parse_run
    codec.c_parse_run = saved if c else None
    try:
        parser = PacketParser(max_packet_size=max_packet_size, protocol_level=level)
        seen: list[Any] = []
        for chunk in chunks:
            try:
                seen.append(parser.feed(chunk))
            except ProtocolError as err:
                seen.append(("error", type(err), err.reason_code, str(err), err.packets))
                break
        return seen, parser.buffered, parser.protocol_level
    finally:
        codec.c_parse_run = saved


def same_both_ways(level: int | None, chunks: list[bytes], max_packet_size: int = 4096) -> None:
    assert run(level, chunks, True, max_packet_size) == run(level, chunks, False,
                                                             max_packet_size)


topics = st.one_of(st.sampled_from(["devices/d1/t", "a", "ü/€", "x" * 200]),
                   st.text(max_size=12))
plain = st.one_of(
    st.builds(lambda t, p, r: Publish(t, p, 0, r), topics, st.binary(max_size=150),
              st.booleans()),
    st.builds(lambda t, p, q, r, d, i: Publish(t, p, q, r, d, i), topics,
              st.binary(max_size=150), st.integers(1, 2), st.booleans(), st.booleans(),
              st.integers(1, 65535)),
    st.builds(PubAck, st.integers(1, 65535)),
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[int, list[bytes]]:
    level = draw(st.sampled_from([3, 4, 5]))
    pkts = draw(st.lists(st.one_of(plain, plain, packets(level)), min_size=1, max_size=8))
    stream = bytearray(b"".join(encode(p, level) for p in pkts))
    for _ in range(draw(st.integers(0, 3))):  # damage: set, insert or delete a byte
        i = draw(st.integers(0, len(stream) - 1))
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            stream[i] = draw(st.integers(0, 255))
        elif op == "insert":
            stream.insert(i, draw(st.integers(0, 255)))
        elif len(stream) > 1:
            del stream[i]
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=3)))
    bounds = [0, *cuts, len(stream)]
    return level, [bytes(stream[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


@HYP
@given(s=streams())
def test_same_packets_errors_and_tail(s: tuple[int, list[bytes]]) -> None:
    level, chunks = s
    same_both_ways(level, chunks)
    same_both_ways(level, chunks, max_packet_size=60)  # the size limit inside a run


@HYP
@given(chunks=st.lists(st.binary(max_size=120), max_size=6), level=st.sampled_from([3, 4, 5]))
def test_same_on_garbage(chunks: list[bytes], level: int) -> None:
    same_both_ways(level, chunks)


@pytest.mark.parametrize("wire", [
    b"\x32\x06\x00\x01a\x00\x00x",  # packet id 0
    b"\x36\x06\x00\x01a\x00\x01x",  # QoS 3
    b"\x38\x04\x00\x01ax",  # DUP on QoS 0
    b"\x30\x04\x00\x02\xc3\x28",  # ill-formed UTF-8 topic
    b"\x30\x03\x00\x01+",  # wildcard in a topic name
    b"\x30\x03\x00\x01\x00",  # NUL in a topic name
    b"\x30\x02\x00\x00",  # empty topic without an alias
    b"\x30\x05\x00\x05ab",  # topic runs past the packet
    b"\x40\x02\x00\x00",  # PUBACK packet id 0
    b"\x30\x80\x00",  # non-minimal remaining length (v5 refuses it)
])
@pytest.mark.parametrize("level", [4, 5])
def test_bad_packet_after_a_plain_run(wire: bytes, level: int) -> None:
    """The run stops at the bad packet: the same good packets first, then the same error."""
    good = encode(Publish("t", b"p", 1, packet_id=7), level) + encode(PubAck(3), level)
    same_both_ways(level, [good + wire + good])


def test_a_plain_run_is_consumed_in_c() -> None:
    """Not vacuous: the C loop really takes plain publishes and acks (v3.1.1 and v5)."""
    from broker.protocol import _speedups

    for level in (4, 5):
        wire = b"".join([encode(Publish("devices/d/t", b"x" * 64, 1, packet_id=i), level)
                         for i in range(1, 50)] + [encode(PubAck(9), level)])
        out: list[Any] = []
        assert _speedups.parse_run(wire, 0, level, 4096, out) == len(wire)
        assert out[0] == Publish("devices/d/t", b"x" * 64, 1, packet_id=1)
        assert out[-1] == PubAck(9) and len(out) == 50
        # v5 properties are left to Python
        props = encode(Publish("t", b"", 0, properties={1: 1}), 5)
        assert _speedups.parse_run(props, 0, 5, 4096, []) == 0


def test_plain_packets_are_built_in_c_without_their_init() -> None:
    """Issue 25: parse_run fills the slots of Publish and PubAck itself (their generated
    __init__ was a Python frame per packet, two per logged QoS 1 message). The plan is in
    place for the classes we ship, and what it builds is what the class builds: every field,
    defaults included, the exact class, tracked by the GC like any instance. A class it cannot
    prove plain (here: one with a __post_init__) is called as before."""
    import gc
    from dataclasses import dataclass

    from broker.protocol import _speedups

    assert _speedups.slots_ready() == (True, True)
    wire = b"".join([encode(Publish("devices/d/t", b"p", 1, True, True, 7), 4),
                     encode(Publish("devices/d/u", b"", 0), 4), encode(PubAck(65535), 4)])
    out: list[Any] = []
    assert _speedups.parse_run(wire, 0, 4, 4096, out) == len(wire)
    made = [Publish("devices/d/t", b"p", 1, True, True, 7, None),
            Publish("devices/d/u", b"", 0, False, False, None, None), PubAck(65535)]
    assert out == made
    for got, want in zip(out, made, strict=True):
        assert type(got) is type(want)
        assert [getattr(got, f) for f in got.__slots__] == \
            [getattr(want, f) for f in want.__slots__]
        assert gc.is_tracked(got) and gc.is_tracked(want)

    @dataclass(slots=True)
    class Checked:
        topic: str
        payload: bytes = b""
        qos: int = 0
        retain: bool = False
        dup: bool = False
        packet_id: int | None = None
        properties: dict | None = None

        def __post_init__(self) -> None:
            inits.append(self.packet_id)

    inits: list[int | None] = []  # (Publish's fields exactly: only __post_init__ differs)

    try:
        _speedups.setup(Checked, PubAck)
        assert _speedups.slots_ready() == (False, True)
        inits.clear()  # (setup made one itself, for the defaults)
        out = []
        _speedups.parse_run(encode(Publish("devices/d/t", b"p", 1, packet_id=3), 4), 0, 4,
                            4096, out)
        assert type(out[0]) is Checked and inits == [3]
    finally:
        _speedups.setup(Publish, PubAck)
    assert _speedups.slots_ready() == (True, True)


def test_pure_python_switch() -> None:
    code = "from broker.protocol import codec; print(codec.SPEEDUPS, codec.c_parse_run)"
    env = {**os.environ, "BROKER_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["False", "None"]


def encode_both(topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                props: dict | None, level: int) -> tuple[Any, Any]:
    """(C, Python) results of publish_parts and publish_packet0: values or error types."""
    def one(c: bool) -> Any:
        saved = codec.c_publish_packet
        codec.c_publish_packet = saved if c else None
        try:
            out: list[Any] = []
            for fn, args in ((codec.publish_parts, (topic, payload, qos, retain, dup, props,
                                                    level)),
                             (codec.publish_packet0, (topic, payload, retain, props, level))):
                try:
                    out.append(fn(*args))
                except ValueError as err:
                    out.append((type(err), str(err)))
            return out
        finally:
            codec.c_publish_packet = saved
    return one(True), one(False)


@HYP
@given(topics, st.one_of(st.binary(max_size=300), st.binary(min_size=16380, max_size=16390)),
       st.integers(0, 2), st.booleans(), st.booleans(),
       st.one_of(st.none(), st.just({3: "text/plain"})), st.sampled_from([3, 4, 5]))
def test_the_compiled_publish_encoder_writes_the_python_bytes(
        topic: str, payload: bytes, qos: int, retain: bool, dup: bool, props: dict | None,
        level: int) -> None:
    """publish_parts / publish_packet0 (issue 25: encoded in C) give the Python encoder's bytes,
    in every shape (varint lengths of 1-3 bytes, non-ASCII topics, v5 properties)."""
    c, py = encode_both(topic, payload, qos, retain, dup, props, level)
    assert c == py
    assert type(c[0][0]) is bytes and type(c[1]) is bytes


def test_the_compiled_publish_encoder_refuses_what_python_refuses() -> None:
    c, py = encode_both("t" * 65536, b"", 0, False, False, None, 4)
    assert c == py and c[0][0] is ValueError
    # a memoryview payload (a log read) is encoded as its bytes
    c, py = encode_both("a/b", memoryview(b"xyz"), 1, False, False, None, 4)
    assert c[0] == (bytes([0x32, 10, 0, 3]) + b"a/b", b"xyz") and c[1] == py[1]


run_packets = st.lists(st.one_of(
    st.builds(lambda t, q, r, d, props: Publish(t, b"x", q, r, d, 7 if q else None, props),
              st.sampled_from(["d/1", "d/2"]), st.integers(0, 2), st.booleans(),
              st.booleans(), st.sampled_from([None, {}])),
    st.builds(PubAck, st.integers(1, 9))), min_size=1, max_size=20)


@HYP
@given(run_packets, st.integers(0, 1), st.sampled_from(["d/1", "d/2"]), st.integers(0, 3))
def test_the_end_of_a_run_is_found_alike_compiled_and_in_python(pkts: list, qos: int,
                                                                topic: str, over: int) -> None:
    """``publish_run_end`` (broker/publishrun.py ``run_end``: the scan of the router's QoS 0
    and QoS 1 runs) ends every run, from every start, where the Python reference does and
    where the rule says: at another class, QoS, RETAIN, DUP, properties (even empty), another
    topic (an equal str that is another object continues it), or ``stop``; parsed packets too
    (their slots filled by parse_run)."""
    from broker.publishrun import py_run_end

    topic = "".join(list(topic))  # (a new str object)
    valid = [Publish(p.topic, p.payload, p.qos, p.retain, p.dup and p.qos > 0, p.packet_id)
             if type(p) is Publish else p for p in pkts]  # (QoS 0 with DUP is malformed)
    parsed = PacketParser(max_packet_size=4096, protocol_level=4).feed(
        b"".join(encode(p, 4) for p in valid))
    for start in range(len(pkts)):
        for stop in (start, start + 2, len(pkts) + over):
            end = min(stop, len(pkts))
            want = start + 1 + next(
                (k for k, p in enumerate(pkts[start + 1:end])
                 if not (type(p) is Publish and p.qos == qos and not p.retain and not p.dup
                         and p.properties is None and p.topic == topic)),
                max(0, end - start - 1))
            assert py_run_end(pkts, start, stop, qos, topic) == want, (start, stop)
            assert codec.c_publish_run_end(pkts, start, stop, qos, topic) == want, (start, stop)
            assert codec.c_publish_run_end(parsed, start, stop, qos, topic) == py_run_end(
                parsed, start, stop, qos, topic), (start, stop)


def _odd_runs() -> list[tuple[str, list, int, int, int, str]]:
    def pub(topic: str = "a", qos: Any = 0, retain: Any = False, dup: Any = False,
            props: Any = None) -> Publish:
        return Publish(topic, b"x", qos, retain, dup, 7 if qos else None, props)

    class Topic(str):
        pass

    ack = PubAck(3)
    return [
        ("qos-true", [pub(qos=1), pub(qos=True), pub(qos=1)], 0, 9, 1, "a"),
        ("qos-huge", [pub(qos=1), pub(qos=2**70), pub(qos=1)], 0, 9, 1, "a"),
        ("qos-arg-huge", [pub(), pub(), pub()], 0, 9, 2**70, "a"),
        ("flags-as-ints", [pub(), pub(retain=0, dup=0), pub(retain=1)], 0, 9, 0, "a"),
        ("dup-empty-str", [pub(), pub(dup=""), pub(dup="y")], 0, 9, 0, "a"),
        ("props-empty", [pub(), pub(props={}), pub()], 0, 9, 0, "a"),
        ("topic-subclass", [pub(), pub(Topic("a")), pub()], 0, 9, 0, "a"),
        ("topic-arg-subclass", [pub(), pub(), pub("b")], 0, 9, 0, Topic("a")),
        ("start-negative", [ack, pub(), pub()], -1, 9, 0, "a"),
        ("start-past-end", [pub(), pub()], 5, 9, 0, "a"),
        ("start-maxsize", [pub(), pub()], sys.maxsize, sys.maxsize, 0, "a"),
        ("stop-huge", [pub(), pub(), pub("b")], 0, 2**70, 0, "a"),
        ("stop-before-start", [pub(), pub(), pub()], 2, 1, 0, "a"),
        ("empty", [], 0, 9, 0, "a"),
    ]


@pytest.mark.parametrize("case", _odd_runs(), ids=lambda c: c[0])
def test_the_end_of_a_run_of_odd_values_is_found_as_python_finds_it(case: tuple) -> None:
    """``run_end`` (``_speedups.publish_run_end``, then ``py_run_end`` when the C declines)
    answers as the Python reference for what parse_run never makes: a QoS that is a bool or
    too big for a C long, RETAIN/DUP that are not bools, a str subclass topic, a start or stop
    outside the list. (The C raised OverflowError for a huge QoS or stop, ended a QoS 1 run at
    ``qos=True``, and read a negative start as 0.)"""
    from broker.publishrun import py_run_end, run_end

    _, pkts, start, stop, qos, topic = case
    assert run_end(pkts, start, stop, qos, topic) == py_run_end(pkts, start, stop, qos, topic)


_RUN_END_RUNS_PYTHON = """
from broker.protocol import codec
from broker.protocol.packets import Publish
packets = []
class Topic(str):
    def __eq__(self, other):
        packets.clear()
        return True
    __hash__ = str.__hash__
class Flag:
    def __bool__(self):
        packets.clear()
        return False
first = Publish("t" * 40, b"x", 0, False, False, None, None)
for odd in ({"topic": Topic("t" * 40)}, {"retain": Flag()}, {"dup": Flag()}):
    packets[:] = [first] + [Publish(**{"topic": "t" * 40, "payload": b"x" * 100, "qos": 0,
                                       "retain": False, "dup": False, **odd})
                            for _ in range(2000)]
    odd = None
    end = codec.c_publish_run_end(packets, 0, 2001, 0, "t" * 40)
    assert end is None or type(end) is int, end
print("ok")
"""


def test_the_compiled_run_scan_survives_python_code_that_empties_the_list() -> None:
    """``publish_run_end`` reads borrowed packets and slots: a topic's ``__eq__`` or a flag's
    ``__bool__`` that empties the list freed them under the scan (a segfault). It runs no
    Python code (such values go to the Python reference). In a child process: a crash fails
    this test, not the worker."""
    run = subprocess.run([sys.executable, "-c", _RUN_END_RUNS_PYTHON], capture_output=True,
                         text=True, timeout=30, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr)
