"""Malformed input over raw sockets: each case closes that one connection, is logged, and the
broker keeps serving everyone else."""

import re

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import V311, unique
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(60)

MAX_PACKET = 4096

LOG_WORDS = re.compile(
    r"malformed|protocol|invalid|error|violation|too large|reserved|utf|refus|reject|bad|"
    r"closing|closed|disconnect",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def mbroker(module_broker_factory):
    return module_broker_factory(mqtt={"max_packet_size": MAX_PACKET})


@pytest.fixture(scope="module")
def witness(mbroker):
    """A subscriber that lives through the whole module: it must keep receiving."""
    from helpers.clients import Client

    topic = unique("witness") + "/t"
    c = Client(mbroker, protocol=V311)
    c.connect(keepalive=60)
    c.subscribe(topic, 1)
    yield c, topic
    c.disconnect()


def _assert_broker_healthy(mbroker, witness, clients):
    c, topic = witness
    c.drain()
    pub = clients.connected(mbroker, protocol=V311)
    payload = unique("alive").encode()
    pub.publish(topic, payload, 1)
    msg = c.expect_message()
    assert msg.payload == payload, "the witness subscriber stopped receiving"
    assert mbroker.alive, "broker process died"


def _run_case(mbroker, witness, clients, raw, data, *, version=4, connect_first=True):
    offset = mbroker.log_size()
    c = raw(mbroker, version=version)
    if connect_first:
        c.connect(unique("bad"))
    c.try_send(data)
    got = c.wait_closed(timeout=10)
    # Before closing the server may only send a v5 DISCONNECT with an error code (>= 0x80).
    for p in got:
        assert p.type == R.DISCONNECT and version == 5 and p.reason_code >= 0x80, (
            f"server answered malformed input with {p!r}"
        )
    wait_for(lambda: LOG_WORDS.search(mbroker.log_since(offset)), timeout=5,
             message="a log line about the rejected connection")
    _assert_broker_healthy(mbroker, witness, clients)
    return got


CASES_311 = {
    # [MQTT-2.2.2-2] reserved flag bits
    "pubrel-flags-0000": R.pubrel(1, flags=0x00),
    "subscribe-flags-0000": R.subscribe(1, "a/b", 0, flags=0x00),
    "unsubscribe-flags-0000": R.packet(R.UNSUBSCRIBE, 0x00, b"\x00\x01\x00\x01a"),
    "pingreq-flags-0001": b"\xc1\x00",
    "puback-flags-0001": b"\x41\x02\x00\x01",
    "disconnect-flags-0001": b"\xe1\x00",
    # packet type 0 and (for 3.1.1) 15 are reserved
    "packet-type-0": b"\x00\x00",
    "packet-type-15-in-311": b"\xf0\x00",
    # Remaining Length with 5 bytes (3.1.1 2.2.3: at most four)
    "remaining-length-5-bytes": b"\x30\xff\xff\xff\xff\x01",
    # [MQTT-1.5.3-1] ill-formed UTF-8 and surrogates in the topic
    "utf8-invalid-topic": R.publish(b"a/\xff\xfe", b"x"),
    "utf8-surrogate-topic": R.publish(b"a/\xed\xa0\x80", b"x"),
    "utf8-overlong-topic": R.publish(b"a/\xc0\xaf", b"x"),
    # [MQTT-1.5.3-2] U+0000
    "nul-in-topic": R.publish(b"a/\x00/b", b"x"),
    "nul-in-filter": R.subscribe(1, [(b"a/\x00", 0)]),
    # [MQTT-3.3.2-2] wildcards in a topic name
    "plus-in-topic": R.publish("a/+/b", b"x"),
    "hash-in-topic": R.publish("a/#", b"x"),
    # [MQTT-4.7.3-1] empty topic name
    "empty-topic": R.publish("", b"x", qos=1, packet_id=1),
    # [MQTT-3.3.1-4] QoS 3
    "qos-3": R.packet(R.PUBLISH, 0x06, R.encode_string("a/b") + b"\x00\x01x"),
    # [MQTT-2.3.1-1] packet identifier 0
    "publish-qos1-pid-0": R.publish("a/b", b"x", qos=1, packet_id=0),
    "publish-qos2-pid-0": R.publish("a/b", b"x", qos=2, packet_id=0),
    "subscribe-pid-0": R.subscribe(0, "a/b", 0),
    "unsubscribe-pid-0": R.unsubscribe(0, "a/b"),
    # [MQTT-3.8.3-3] (3.1.1) SUBSCRIBE without any topic filter
    "subscribe-no-filters": R.packet(R.SUBSCRIBE, 0x02, b"\x00\x01"),
    "unsubscribe-no-filters": R.packet(R.UNSUBSCRIBE, 0x02, b"\x00\x01"),
    # requested QoS 3 in SUBSCRIBE (3.8.3.1: malformed)
    "subscribe-qos-3": R.subscribe(1, [("a/b", 3)]),
    # a length prefix that runs past the packet
    "string-past-end": R.packet(R.PUBLISH, 0, b"\x00\x20a/b"),
    # server-to-client packet types from a client
    "connack-from-client": b"\x20\x02\x00\x00",
    "suback-from-client": b"\x90\x03\x00\x01\x00",
    "pingresp-from-client": b"\xd0\x00",
}


@pytest.mark.parametrize("case", list(CASES_311))
def test_malformed_311_closes_only_that_connection(mbroker, witness, clients, raw, case):
    """[MQTT-2.2.2-2], [MQTT-1.5.3-1], [MQTT-1.5.3-2], [MQTT-3.3.2-2], [MQTT-3.3.1-4],
    [MQTT-2.3.1-1], [MQTT-4.7.3-1], [MQTT-3.8.3-3] (3.1.1) and [MQTT-4.8.0-1]: malformed
    input or a protocol violation closes that network connection; nothing is delivered; the
    broker logs it and keeps serving other clients."""
    _run_case(mbroker, witness, clients, raw, CASES_311[case])


CASES_V5 = {
    "reserved-flags": b"\xc1\x00",
    "utf8-invalid-topic": R.publish(b"a/\xff", b"x", version=5),
    "nul-in-topic": R.publish(b"a\x00b", b"x", version=5),
    "wildcard-topic": R.publish("a/+", b"x", version=5),
    "qos-3": R.packet(R.PUBLISH, 0x06, R.encode_string("a/b") + b"\x00\x01\x00x"),
    "pid-0": R.publish("a/b", b"x", qos=1, packet_id=0, version=5),
    "duplicate-property": R.packet(
        R.PUBLISH, 0,
        R.encode_string("a/b") + b"\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02" + b"x"),
    "unknown-property": R.packet(R.PUBLISH, 0, R.encode_string("a/b") + b"\x02\x7f\x00x"),
    "property-length-past-end": R.packet(R.PUBLISH, 0, R.encode_string("a/b") + b"\x40x"),
    "remaining-length-5-bytes": b"\x30\xff\xff\xff\xff\x01",
    "user-property-invalid-utf8": R.packet(
        R.PUBLISH, 0, R.encode_string("a/b") + b"\x07\x26\x00\x01\xff\x00\x01vx"),
}


@pytest.mark.parametrize("case", list(CASES_V5))
def test_malformed_v5_disconnect_code_and_close(mbroker, witness, clients, raw, case):
    """[MQTT-4.13.1-1]/[MQTT-4.13.2-1] (5.0): on a Malformed Packet or Protocol Error the server
    may send DISCONNECT with a code >= 0x80 and MUST close the connection; others unaffected."""
    _run_case(mbroker, witness, clients, raw, CASES_V5[case], version=5)


def test_oversized_packet_v5_disconnect_0x95(mbroker, witness, clients, raw):
    """MQTT 5.0 3.2.2.3.6 / 4.13: a packet larger than the server's Maximum Packet Size (4096,
    announced in CONNACK) is answered with DISCONNECT 0x95 (Packet too large), then close."""
    c = raw(mbroker, version=5)
    ack = c.connect(unique("big5"))
    assert ack.properties.get(R.MAXIMUM_PACKET_SIZE) == MAX_PACKET, ack
    offset = mbroker.log_size()
    c.try_send(R.publish(unique("big") + "/t", b"B" * (MAX_PACKET + 100), qos=1, packet_id=1,
                         version=5))
    got = c.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x95], got
    assert not [p for p in got if p.type == R.PUBACK], got
    wait_for(lambda: mbroker.log_since(offset).strip(), timeout=5, message="a log line")
    _assert_broker_healthy(mbroker, witness, clients)


def test_oversized_packet_311_closed(mbroker, witness, clients, raw):
    """A 3.1.1 client sending a packet over max_packet_size is disconnected (no PUBACK)."""
    got = _run_case(mbroker, witness, clients, raw,
                    R.publish("big/t", b"B" * (MAX_PACKET * 2), qos=1, packet_id=1))
    assert got == []


def test_oversized_declared_length_closed_without_body(mbroker, witness, clients, raw):
    """The server judges the size from the fixed header: a Remaining Length of 100 MB is
    refused at once (v5 0x95), without waiting for (or buffering) the body."""
    c = raw(mbroker, version=5)
    c.connect(unique("decl"))
    c.send(b"\x30" + R.encode_varint(100_000_000) + b"\x00\x03a/b")
    got = c.wait_closed(timeout=10)
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x95], got
    _assert_broker_healthy(mbroker, witness, clients)


def test_malformed_connect_closed(mbroker, witness, clients, raw):
    """[MQTT-3.1.4-1]: a CONNECT that does not conform (client id with invalid UTF-8, will flag
    with QoS 3, password flag without user name in 3.1.1) is refused: the connection closes
    without CONNACK 0."""
    bad = [
        R.packet(R.CONNECT, 0, R.encode_string("MQTT") + b"\x04\x02\x00\x3c"
                 + R.encode_string(b"\xff\xfe")),
        R.packet(R.CONNECT, 0, R.encode_string("MQTT") + b"\x04" + bytes([0x02 | 0x04 | 0x18])
                 + b"\x00\x3c" + R.encode_string("c") + R.encode_string("w")
                 + R.encode_string("p")),
        R.packet(R.CONNECT, 0, R.encode_string("MQTT") + b"\x04" + bytes([0x02 | 0x40])
                 + b"\x00\x3c" + R.encode_string("c") + R.encode_string("pw")),
        R.packet(R.CONNECT, 1, R.connect("c")[2:]),  # CONNECT with reserved flag bit set
    ]
    for data in bad:
        c = raw(mbroker, version=4)
        c.send(data)
        got = c.wait_closed()
        assert all(p.type == R.CONNACK and p.reason_code != 0 for p in got), got
    _assert_broker_healthy(mbroker, witness, clients)


def test_truncated_packet_then_close_is_harmless(mbroker, witness, clients, raw):
    """A client that sends half a packet and hangs up leaves no trace: the broker goes on."""
    for n in (1, 2, 5):
        c = raw(mbroker, version=4)
        c.connect(unique("trunc"))
        c.send(R.publish("a/b", b"x" * 100, qos=1, packet_id=1)[:n])
        c.abort()
    _assert_broker_healthy(mbroker, witness, clients)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=200))
def test_fuzz_random_bytes_after_connect(mbroker, witness, data):
    """Random bytes after a valid CONNECT never take the broker down, nor hang its loop: the
    CONNECT must succeed (else the bytes were never fuzzed into a session), and after them a
    normal client is served (CONNACK and PINGRESP), inside the same example."""
    c = R.RawClient(mbroker.host, mbroker.port, version=4, timeout=10)
    try:
        c.connect(unique("fz"))
        c.try_send(data)
    finally:
        c.abort()
    assert mbroker.alive
    probe = R.RawClient(mbroker.host, mbroker.port, version=4, timeout=10)
    try:
        probe.connect(unique("fzok"))
        probe.send(R.pingreq())
        probe.expect(R.PINGRESP, timeout=10)
    finally:
        probe.close()


def test_broker_alive_after_fuzz(mbroker, witness, clients):
    """After the fuzzing above, the broker still serves the witness."""
    _assert_broker_healthy(mbroker, witness, clients)
