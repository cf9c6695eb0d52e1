"""Deep topics (issue 11, item 2): no walk recurses on a client's topic depth, the
``max_topic_levels`` limit refuses deep topics with the right codes, and a packet that raises
while being handled closes its own client only, never another client's flow or the rest of a
batch.

Most tests run a real broker; the isolation tests at the end drive a real ``Router`` and real
``Connection`` objects over loopback sockets in-process, because no well-formed input should make
the broker raise any more, and the boundary has to be exercised by one that still does.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from helpers import raw as R
from helpers.broker import metric_sum
from helpers.clients import unique

from broker.connection import Connection
from broker.message import Message
from broker.protocol.packets import Connack
from broker.router import Router
from broker.settings import BrokerSettings
from broker.stats import BrokerStats

pytestmark = pytest.mark.timeout(120)

DEEP = 1000  # levels: above Python's default recursion limit once the walks add their frames


def deep_topic(prefix: str, levels: int = DEEP) -> str:
    return prefix + "/" + "/".join("x" * 1 for _ in range(levels))


@pytest.fixture(scope="module")
def limited(module_broker_factory):
    """Default max_topic_levels (128)."""
    return module_broker_factory()


@pytest.fixture(scope="module")
def unlimited(module_broker_factory):
    """max_topic_levels at its maximum: the walks themselves must cope with 1,000+ levels."""
    return module_broker_factory(mqtt={"max_topic_levels": 65535})


# --------------------------------------------------------------------------------------------
# The limit: PUBLISH, will, SUBSCRIBE
# --------------------------------------------------------------------------------------------


def test_deep_publish_refused_0x90_next_publish_acked_other_client_unaffected(limited, raw):
    """The issue's scenario: a deep QoS 1 PUBLISH and a normal one in the same read. The deep one
    gets PUBACK 0x90 (nothing stored), the normal one PUBACK 0x00, and another publisher's
    PUBACKs keep coming, before and after."""
    base = unique("deep")
    other = raw(limited, version=5)
    other.connect(unique("other"))
    for pid in range(1, 33):
        assert other.publish(f"devices/{base}o/t", b"o", 1, packet_id=pid).reason_code in (0, None)
    sub = raw(limited, version=5)
    sub.connect(unique("sub"))
    sub.subscribe(f"devices/{base}/#", 1)
    attacker = raw(limited, version=5)
    attacker.connect(unique("att"))
    attacker.send(R.publish(deep_topic(f"devices/{base}"), b"deep", qos=1, packet_id=1, version=5)
                  + R.publish(f"devices/{base}/ok", b"ok", qos=1, packet_id=2, version=5))
    acks = {p.packet_id: p.reason_code for p in (attacker.expect(R.PUBACK) for _ in range(2))}
    assert acks[1] == 0x90, acks
    assert acks[2] in (0, None), acks
    got = sub.expect(R.PUBLISH)
    assert got.payload == b"ok" and got.topic == f"devices/{base}/ok"
    sub.expect_none(0.5)
    for pid in range(33, 65):
        assert other.publish(f"devices/{base}o/t", b"o", 1, packet_id=pid).reason_code in (0, None)
    assert attacker.is_open()
    metrics = limited.metrics()
    assert metric_sum(metrics, "meshmq_limit_hits_total", limit="max_topic_levels") >= 1
    assert metric_sum(metrics, "meshmq_messages_dropped_total", reason="topic_levels") >= 1


def test_deep_publish_v311_closes_only_that_client(limited, raw):
    """3.1.1 has no negative PUBACK: the deep publisher is disconnected; another 3.1.1 client on
    the same broker keeps being acknowledged."""
    other = raw(limited, version=4)
    other.connect(unique("o311"))
    attacker = raw(limited, version=4)
    attacker.connect(unique("a311"))
    attacker.send(R.publish(deep_topic("r"), b"deep", qos=1, packet_id=1))
    got = attacker.wait_closed()
    assert not [p for p in got if p.type == R.PUBACK], got
    for pid in range(1, 11):
        assert other.publish("r/fine", b"x", 1, packet_id=pid).packet_id == pid


def test_deep_qos0_publish_v5_disconnect_0x90(limited, raw):
    """QoS 0 has no ack to carry the refusal: v5 DISCONNECT 0x90 (EMQX's answer)."""
    attacker = raw(limited, version=5)
    attacker.connect(unique("a0"))
    attacker.send(R.publish(deep_topic("$deep"), b"deep", qos=0, version=5))
    got = attacker.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x90], got


@pytest.mark.parametrize("version, code", [(5, 0x90), (4, 3)])
def test_deep_will_refused_at_connect(limited, raw, version, code):
    """A will deeper than the limit is refused at CONNECT: v5 0x90, 3.1.1 return code 3."""
    c = raw(limited, version=version)
    c.connect(unique("w"), expect_rc=code, will=R.Will(deep_topic("w"), b"bye"))


@pytest.mark.parametrize("version, code", [(5, 0x8F), (4, 0x80)])
def test_deep_subscribe_refused_per_filter(limited, raw, version, code):
    """SUBACK refuses the deep filter (v5 0x8F Topic Filter invalid, 3.1.1 0x80) and grants the
    normal one beside it; the connection stays up."""
    c = raw(limited, version=version)
    c.connect(unique("s"))
    ack = c.subscribe([(deep_topic("s") + "/#", 1), ("s/ok", 1)])
    assert list(ack.reason_codes) == [code, 1], ack
    assert c.is_open()


def test_limit_at_exactly_max_levels_is_accepted(limited, raw):
    """128 levels is allowed, 129 is not (the limit counts levels, not separators)."""
    c = raw(limited, version=5)
    c.connect(unique("edge"))
    ok = "/".join(["e"] * 128)
    assert c.publish(ok, b"x", 1, packet_id=1).reason_code in (0, None)
    assert c.publish(ok + "/e", b"x", 1, packet_id=2).reason_code == 0x90


# --------------------------------------------------------------------------------------------
# The walks themselves: no recursion, whatever the limit allows
# --------------------------------------------------------------------------------------------


def test_deep_retained_does_not_break_later_wildcard_subscribers(unlimited, raw):
    """A retained message on a 1,500-level topic, then `#`-style subscribers: each gets its
    SUBACK and the retained message (the recursive retained walk aborted their connections)."""
    base = unique("ret")
    topic = deep_topic(base, 1500)
    pub = raw(unlimited, version=5)
    pub.connect(unique("rp"))
    assert pub.publish(topic, b"deep-retained", 1, retain=True).reason_code in (0, None)
    for flt in (f"{base}/#", f"{base}/+/#"):
        sub = raw(unlimited, version=5)
        sub.connect(unique("rs"))
        assert list(sub.subscribe(flt, 1).reason_codes) == [1]
        got = sub.expect(R.PUBLISH)
        assert got.topic == topic and got.payload == b"deep-retained" and got.retain


def test_deep_publish_routed_through_wildcards(unlimited, raw):
    """A 1,500-level publish (and a `$` one) is routed through `#` and a 1,400-level `+` filter
    (one copy each: overlapping filters merge), and the normal publish behind it in the same
    read is acked and delivered too."""
    base = unique("route")
    sub = raw(unlimited, version=5)
    sub.connect(unique("rsub"))
    # the trie is as deep as its deepest filter: a 1,400-level one of `+` makes the walk deep
    deep_plus = base + "/+" * 1400 + "/#"
    ack = sub.subscribe([(f"{base}/#", 1), (deep_plus, 1), (f"$d{base}/#", 1)])
    assert list(ack.reason_codes) == [1, 1, 1]
    pub = raw(unlimited, version=5)
    pub.connect(unique("rpub"))
    deep = deep_topic(base, 1500)
    deep_dollar = deep_topic(f"$d{base}", 1500)
    pub.send(R.publish(deep, b"1", qos=1, packet_id=1, version=5)
             + R.publish(deep_dollar, b"2", qos=1, packet_id=2, version=5)
             + R.publish(f"{base}/n", b"3", qos=1, packet_id=3, version=5))
    acks = sorted((p.packet_id, p.reason_code or 0) for p in (pub.expect(R.PUBACK)
                                                              for _ in range(3)))
    assert acks == [(1, 0), (2, 0), (3, 0)]
    got = sorted(sub.expect(R.PUBLISH).payload for _ in range(3))
    assert got == [b"1", b"2", b"3"]


# --------------------------------------------------------------------------------------------
# Isolation: an exception closes its own client only (in-process, real sockets)
# --------------------------------------------------------------------------------------------


class _Wire:
    """A real Router with real Connection objects on loopback sockets, driven in-process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stats = BrokerStats()
        self.router = Router(BrokerSettings(), self.stats, loop=self.loop)
        self.server = self.loop.run_until_complete(self.loop.create_server(
            lambda: Connection(self.router, self.stats.listener("tcp"), self.stats),
            "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    def client(self, client_id: str) -> tuple[socket.socket, Connection]:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(R.connect(client_id, version=5))
        conn = self.run_until(lambda: next((c for c in self.router.connections
                                            if c.client_id == client_id), None))
        return sock, conn

    def run_until(self, predicate, timeout: float = 20.0):
        async def wait():
            async with asyncio.timeout(timeout):
                while not (value := predicate()):
                    await asyncio.sleep(0.005)
                return value
        return self.loop.run_until_complete(wait())

    def close(self) -> None:
        for conn in list(self.router.connections):
            conn.abort()
        self.server.close()
        self.loop.run_until_complete(self.server.wait_closed())
        self.loop.close()


@pytest.fixture
def wire():
    w = _Wire()
    yield w
    w.close()


def _read_packets(sock: socket.socket, ptype: int) -> list[R.Packet]:
    """Packets the server sent on ``sock`` up to and including the first of type ``ptype``."""
    sock.settimeout(20)
    buf, out = b"", []
    while True:
        split = R.split_packet(buf)
        if split is None:
            chunk = sock.recv(65536)
            assert chunk, f"closed before a packet of type {ptype}: {out}"
            buf += chunk
            continue
        raw, buf = split
        out.append(R.decode_packet(raw, version=5))
        if out[-1].type == ptype:
            return out


def test_exception_in_a_batch_closes_that_client_only(wire, caplog):
    """A packet the router cannot handle (here a server-side CONNACK object, which no handler
    takes) raises inside handle_packets: that client is closed and logged at ERROR with its id
    and a traceback; another client's PUBLISH is still acknowledged afterwards."""
    sock_a, conn_a = wire.client("client-a")
    sock_b, conn_b = wire.client("client-b")
    with caplog.at_level(logging.ERROR, logger="broker.router"):
        wire.router.handle_packets(conn_a, [Connack()])
        wire.run_until(lambda: conn_a.closing)
    assert any(r.levelno == logging.ERROR and getattr(r, "client_id", None) == "client-a"
               and r.exc_info for r in caplog.records), caplog.records
    assert wire.stats.client_errors == 1
    sock_b.sendall(R.publish("b/t", b"x", qos=1, packet_id=7, version=5))
    wire.run_until(lambda: wire.stats.packets_out[R.PUBACK] >= 1)
    wire.router.flush_writes()
    assert _read_packets(sock_b, R.PUBACK)[-1].packet_id == 7
    assert not conn_b.closing
    sock_a.close()
    sock_b.close()


def test_exception_in_durable_batch_does_not_abandon_the_rest(wire):
    """Router._on_durable with a batch whose first publish cannot be routed (its topic is not a
    string): its publisher is closed, and the rest of the batch is still routed and acked."""
    sock_a, conn_a = wire.client("dur-a")
    sock_b, conn_b = wire.client("dur-b")
    conn_a.inbound_unacked = conn_b.inbound_unacked = 1
    bad = Message(None, b"bad", 1, False, None, None, "dur-a")  # type: ignore[arg-type]
    good = Message("d/ok", b"good", 1, False, None, None, "dur-b")
    good.device, good.offset = "d", 0
    wire.router._on_durable([(conn_a, 1, bad), (conn_b, 2, good)], None)
    wire.router.flush_writes()
    assert conn_a.closing and not conn_b.closing
    got = _read_packets(sock_b, R.PUBACK)
    assert got[-1].packet_id == 2 and not got[-1].reason_code, got
    assert wire.stats.client_errors == 1
    sock_a.close()
    sock_b.close()
