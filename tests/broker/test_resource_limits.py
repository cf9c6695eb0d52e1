"""Resource limits a client cannot grow past (issue 11, item 6).

Each limit is a config key; hitting it refuses or closes the one client involved, counts
``meshmq_limit_hits_total{limit=<key>}`` and logs a line. Sizes stay small (tens of sockets, a few
hundred at most) so the module is cheap in CI.
"""

from __future__ import annotations

import socket

import pytest
from helpers import raw as R
from helpers.authfiles import auth_overrides
from helpers.broker import metric_sum, wait_for
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)


def hits(broker, limit: str) -> float:
    return metric_sum(broker.metrics(), "meshmq_limit_hits_total", limit=limit)


# --------------------------------------------------------------------------------------------
# max_connections (total and per listener)
# --------------------------------------------------------------------------------------------


def test_max_connections_total(start_broker, raw):
    """mqtt.max_connections 10: the 11th socket is closed at accept; once one leaves, a new
    client connects again."""
    b = start_broker(ws=False, mqtt={"max_connections": 10})
    held = [raw(b, version=5) for _ in range(10)]
    for c in held:
        c.connect(unique("held"))
    extra = raw(b, version=5)
    got = extra.wait_closed(timeout=20)
    assert not [p for p in got if p.type == R.CONNACK], got
    assert hits(b, "max_connections") >= 1
    held.pop().disconnect()
    wait_for(lambda: metric_sum(b.metrics(), "meshmq_listener_sockets") <= 9, timeout=20,
             message="the broker to notice the disconnect")
    raw(b, version=5).connect(unique("again"))


def test_max_connections_per_listener(start_broker, raw):
    """listener.tcp.max_connections 3 caps that listener under a larger total."""
    b = start_broker(ws=False, mqtt={"max_connections": 100},
                     listener={"tcp": {"max_connections": 3}})
    for _ in range(3):
        raw(b, version=5).connect(unique("l"))
    got = raw(b, version=5).wait_closed(timeout=20)
    assert not [p for p in got if p.type == R.CONNACK], got
    assert hits(b, "listener.max_connections") >= 1


# --------------------------------------------------------------------------------------------
# Packet size before CONNECT, and a deadline for finishing a started packet
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(module_broker_factory):
    return module_broker_factory(mqtt={"max_connect_packet_size": 4096, "packet_timeout": 1.0})


def test_big_connect_refused_before_its_body_arrives(small, raw):
    """A CONNECT announcing 1 MB is refused from its fixed header alone: the connection is
    closed and the broker buffers none of it (300 such sockets used to hold 300 MB). No CONNACK:
    the protocol version is in the body, which is never read."""
    c = raw(small, version=5)
    c.send(b"\x10" + R.encode_varint(1_000_000) + b"\x00\x04MQTT\x05")
    got = c.wait_closed(timeout=20)
    assert not got, got
    assert hits(small, "max_connect_packet_size") >= 1


def test_limit_lifts_after_connect(small, raw):
    """After CONNECT, max_packet_size applies: a 64 KB PUBLISH pipelined in the same write as
    the CONNECT is accepted and acknowledged."""
    c = raw(small, version=5)
    c.send(R.connect(unique("big"), version=5)
           + R.publish(unique("t"), b"p" * 65536, qos=1, packet_id=1, version=5))
    assert c.expect(R.CONNACK).reason_code == 0
    assert c.expect(R.PUBACK).reason_code in (0, None)


def test_unfinished_packet_closed_after_packet_timeout(small, raw):
    """A client with keepalive 0 that sends half a PUBLISH is closed once packet_timeout (1 s)
    has passed; a client that only idles (no partial packet) is left alone."""
    idle = raw(small, version=5)
    idle.connect(unique("idle"), keepalive=0)
    c = raw(small, version=5)
    c.connect(unique("half"), keepalive=0)
    whole = R.publish(unique("t"), b"z" * 10_000, qos=1, packet_id=1, version=5)
    c.send(whole[:5000])
    c.wait_closed(timeout=30)
    assert hits(small, "packet_timeout") >= 1
    assert idle.is_open()


# --------------------------------------------------------------------------------------------
# Offline sessions and queued bytes
# --------------------------------------------------------------------------------------------


def test_max_offline_sessions_ends_the_oldest(start_broker, raw):
    """max_offline_sessions 3: of five persistent sessions gone offline in order, the two
    oldest are ended (no session present on return), the three newest are kept."""
    b = start_broker(ws=False, mqtt={"max_offline_sessions": 3})
    ids = [unique(f"off{i}") for i in range(5)]
    for cid in ids:
        c = raw(b, version=4)
        c.connect(cid, clean=False)
        c.subscribe(f"o/{cid}", 1)
        c.disconnect()
    wait_for(lambda: hits(b, "max_offline_sessions") >= 2, timeout=20,
             message="two sessions ended by max_offline_sessions")
    assert metric_sum(b.metrics(), "meshmq_sessions_offline") == 3
    present = {}
    for cid in reversed(ids):  # newest first: reconnecting takes them out of the offline set
        present[cid] = raw(b, version=4).connect(cid, clean=False).session_present
    assert [present[cid] for cid in ids] == [False, False, True, True, True]


def test_max_queued_bytes_drops_oldest(start_broker, raw):
    """max_queued_bytes 10,000 with drop_oldest: 20 messages of ~1 KB for an offline
    subscriber leave only the newest that fit; the drops are counted."""
    b = start_broker(ws=False, mqtt={"max_queued_bytes": 10_000})
    cid = unique("qb")
    topic = f"$q/{cid}"  # $ topics are never logged: they queue in memory (logged ones lag)
    sub = raw(b, version=4)
    sub.connect(cid, clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = raw(b, version=5)
    pub.connect(unique("qp"))
    for i in range(20):
        pub.publish(topic, f"{i:04d}".encode() + b"." * 996, 1, packet_id=i + 1)
    sub = raw(b, version=4)
    assert sub.connect(cid, clean=False).session_present
    got = []
    while True:
        try:
            pkt = sub.expect(R.PUBLISH, timeout=2)
        except AssertionError:
            break
        got.append(int(pkt.payload[:4]))
        sub.ack(pkt)
    assert got == list(range(20 - len(got), 20)) and len(got) * (1000 + len(topic)) <= 10_000, got
    assert len(got) >= 5, got
    metrics = b.metrics()
    assert metric_sum(metrics, "meshmq_messages_dropped_total", reason="queue_full") \
        == 20 - len(got)
    assert metric_sum(metrics, "meshmq_limit_hits_total", limit="max_queued_bytes") >= 1


# --------------------------------------------------------------------------------------------
# Password checks under a flood of wrong passwords
# --------------------------------------------------------------------------------------------

USERS = {"alice": "wonderland", "bob": "builder"}
MAX_FAILURES = 5
ADDRESS_FAILURES = 8  # auth.max_address_failures
CONCURRENT = 2


@pytest.fixture(scope="module")
def flood_broker(module_broker_factory, tmp_path_factory):
    return module_broker_factory(**auth_overrides(
        tmp_path_factory.mktemp("flood"), USERS, max_failures=MAX_FAILURES,
        max_concurrent_checks=CONCURRENT, failure_window=600.0,
        max_address_failures=ADDRESS_FAILURES))


def _from(address: str, broker) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(30)
    s.bind((address, 0))
    s.connect((broker.host, broker.port))
    return s


def test_wrong_password_flood_cannot_starve_a_valid_client(flood_broker, raw):
    """The issue's scenario: 150 wrong-password CONNECTs for alice from 127.0.0.2, all sent before
    a valid client (bob, from 127.0.0.1) connects. Only the first few are hashed; the rest are
    refused at once with 0x9F, and bob is accepted. The count of real checks is bounded by
    max_failures + max_concurrent_checks, whatever the timing."""
    attackers = [raw(flood_broker, version=5, sock=_from("127.0.0.2", flood_broker))
                 for _ in range(150)]
    for a in attackers:
        a.send(R.connect(unique("att"), version=5, username="alice", password="guess"))
    bob = raw(flood_broker, version=5)
    bob.connect(unique("bob"), username="bob", password=USERS["bob"])
    codes = [a.expect(R.CONNACK, timeout=60).reason_code for a in attackers]
    assert set(codes) <= {0x86, 0x9F}, codes
    assert codes.count(0x86) <= MAX_FAILURES + CONCURRENT, codes
    assert codes.count(0x9F) >= 150 - MAX_FAILURES - CONCURRENT
    assert hits(flood_broker, "max_failures") >= 100
    # the locked-out pair is refused until the window passes, even with the right password
    # (3.1.1: rc 3)...
    again = raw(flood_broker, version=4, sock=_from("127.0.0.2", flood_broker))
    again.connect(unique("alice"), username="alice", password=USERS["alice"], expect_rc=3)
    # ...but the stranger did not lock the real alice out from her own address (issue 27)
    real = raw(flood_broker, version=5)
    real.connect(unique("alice"), username="alice", password=USERS["alice"])


def test_an_address_spraying_usernames_is_locked_out(flood_broker, raw):
    """auth.max_address_failures: one address failing for many usernames is refused for all of
    them, the right password included; other addresses are not."""
    names = [unique("nobody") for _ in range(ADDRESS_FAILURES)]
    for name in names:  # one failure each: no pair reaches max_failures
        c = raw(flood_broker, version=5, sock=_from("127.0.0.3", flood_broker))
        c.connect(unique("spray"), username=name, password="guess", expect_rc=0x86)
    bob = raw(flood_broker, version=5, sock=_from("127.0.0.3", flood_broker))
    bob.connect(unique("bob"), username="bob", password=USERS["bob"], expect_rc=0x9F)
    elsewhere = raw(flood_broker, version=5, sock=_from("127.0.0.4", flood_broker))
    elsewhere.connect(unique("bob"), username="bob", password=USERS["bob"])
