"""Codec fuzzing (issue 11, "Also"): mutated packets get a protocol error and nothing else.

The codec stood up to 210k mutated packets over 156k connections and 4M atheris inputs with no
exception but its own ``ProtocolError``; this keeps it that way, at two levels:

* in-process, the server's whole receive path (``ServerProtocol.receive_data``: the parser, the C
  run loop when built, the connection state checks, v5 topic aliases) fed a valid CONNECT and
  valid packets with bytes flipped, inserted, deleted or cut at random chunk boundaries: only
  ``ProtocolError`` (with a v5 reason code), and never more buffered than one bounded packet
  (``test_protocol_fuzz.py`` covers the bare ``PacketParser`` the same way);
* against a real broker over sockets: many connections each sending a mutated stream, then a
  normal client is still served (CONNACK, SUBACK, PUBACK, its own message back), the broker
  counted no client error (an exception other than a protocol error while handling a packet)
  and logged no traceback.

The CI run is short (100 examples per level in-process, 100 connections). ``TEST_SOAK=1`` runs
the long one (~25k in-process examples per protocol level and 3,000 connections).
"""

from __future__ import annotations

import os
import socket

import pytest
from helpers import raw as R
from helpers.broker import metric_sum
from helpers.clients import unique
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import connects, packets

from broker.protocol import ProtocolError, encode
from broker.protocol.connection import ServerProtocol

SOAK = os.environ.get("TEST_SOAK") == "1"
IN_PROCESS_EXAMPLES = 25_000 if SOAK else 100
OVER_SOCKETS_EXAMPLES = 3_000 if SOAK else 100
MAX_PACKET = 8192
MAX_CONNECT = 2048

pytestmark = pytest.mark.timeout(3600 if SOAK else 300)


@st.composite
def mutated_streams(draw: st.DrawFn, level: int) -> tuple[bytes, list[int]]:
    """A CONNECT and a few packets of ``level``, mutated, with random read boundaries."""
    first = draw(connects(level))
    rest = draw(st.lists(packets(level), max_size=5))
    stream = bytearray(encode(first, level) + b"".join(encode(p, level) for p in rest))
    for _ in range(draw(st.integers(0, 6))):
        if not stream:
            break
        i = draw(st.integers(0, len(stream) - 1))
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate", "length"]))
        if op == "set":
            stream[i] = draw(st.integers(0, 255))
        elif op == "insert":
            stream[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and len(stream) > 1:
            del stream[i:i + draw(st.integers(1, 4))]
        elif op == "truncate" and i:
            del stream[i:]
        elif op == "length" and i + 1 < len(stream):
            stream[i + 1] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))  # remaining length
    cuts = sorted(draw(st.lists(st.integers(0, max(0, len(stream))), max_size=4)))
    return bytes(stream), cuts


def chunks(stream: bytes, cuts: list[int]) -> list[bytes]:
    out, prev = [], 0
    for cut in [*cuts, len(stream)]:
        out.append(stream[prev:cut])
        prev = cut
    return out


@pytest.mark.parametrize("level", [3, 4, 5])
@given(data=st.data())
@settings(max_examples=IN_PROCESS_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_server_receive_path_only_raises_protocol_errors(level: int, data: st.DataObject) -> None:
    stream, cuts = data.draw(mutated_streams(level))
    proto = ServerProtocol(MAX_PACKET, topic_alias_maximum=10, max_connect_size=MAX_CONNECT)
    try:
        for chunk in chunks(stream, cuts):
            proto.receive_data(chunk)
            # one bounded partial packet at most: the CONNECT's bound until it is decoded
            bound = MAX_CONNECT if proto.protocol_level is None else MAX_PACKET
            assert proto.buffered <= bound + 5
    except ProtocolError as err:
        assert 0x80 <= err.reason_code <= 0xA2, err


# --------------------------------------------------------------------------------------------
# Over sockets, against a real broker
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_broker(module_broker_factory):
    return module_broker_factory(ws=False, mqtt={"max_packet_size": MAX_PACKET,
                                                 "max_connect_packet_size": MAX_CONNECT,
                                                 "connect_timeout": 2.0, "packet_timeout": 2.0})


def _send_mutated(broker, stream: bytes, cuts: list[int]) -> None:
    with socket.create_connection((broker.host, broker.port), timeout=10) as s:
        try:
            for chunk in chunks(stream, cuts):
                if chunk:
                    s.sendall(chunk)
            s.settimeout(0.02)
            while s.recv(65536):
                pass
        except OSError:
            pass  # closed by the broker (the usual answer), reset, or still open: all fine


def _normal_client_served(broker) -> None:
    c = R.RawClient(broker.host, broker.port, version=5)
    try:
        c.connect(unique("normal"))
        topic = unique("fz") + "/t"
        c.subscribe(topic, 1)
        assert c.publish(topic, b"still here", 1).reason_code in (0, None)
        assert c.expect(R.PUBLISH).payload == b"still here"
        c.disconnect()
    finally:
        c.close()


def test_mutated_streams_over_sockets_leave_other_clients_served(fuzz_broker) -> None:
    counter = {"n": 0}

    @given(level=st.sampled_from([3, 4, 5]), data=st.data())
    @settings(max_examples=OVER_SOCKETS_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    def run(level: int, data: st.DataObject) -> None:
        stream, cuts = data.draw(mutated_streams(level))
        _send_mutated(fuzz_broker, stream, cuts)
        counter["n"] += 1
        if counter["n"] % 25 == 0:
            _normal_client_served(fuzz_broker)

    run()
    _normal_client_served(fuzz_broker)
    assert fuzz_broker.alive
    metrics = fuzz_broker.metrics()
    assert metric_sum(metrics, "meshmq_client_errors_total") == 0
    log = fuzz_broker.log_since(0)
    assert "Traceback" not in log, log[-3000:]
    assert metric_sum(metrics, "meshmq_protocol_errors_total") > 0  # the fuzz reached the codec
