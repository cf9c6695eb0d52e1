"""Review of the one cursor engine (broker/cursors.py): a session moved between nodes while its
offset replay is mid-read, with deliveries in flight (sent, not acknowledged).

A slow subscriber (Receive Maximum 4) replays a device log from ``offset=earliest`` on node 0,
holds back the acks of its last deliveries, drops its connection (no DISCONNECT) and resumes its
session on node 1. The promise: a slow consumer is a lag, never a drop, and per-device order
holds: every offset reaches it (the unacknowledged ones again, at least once), first deliveries
in order, and the replay goes on from node 1 to the log's end and then live.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.clients import unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

_STORED = 200
_MOVE_AT = 60  # first deliveries acked on node 0 before the move
RESUME = {R.SESSION_EXPIRY_INTERVAL: 600, R.RECEIVE_MAXIMUM: 4}


@pytest.fixture
def pair(tmp_path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, n=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _publish_n(pub: R.RawClient, topic: str, first: int, count: int) -> None:
    for k in range(first, first + count):
        pub.send(R.publish(topic, str(k).encode(), qos=1, packet_id=k % 60000 + 1, version=5))
    for _ in range(count):
        ack = pub.expect(R.PUBACK, timeout=60)
        assert not ack.reason_code, ack


@pytest.mark.parametrize("owner", [0, 1])
def test_a_replaying_session_moved_to_another_node_with_deliveries_in_flight_misses_nothing(
        pair: Cluster, raw, owner: int) -> None:
    device = pair.device_owned_by(owner, prefix=unique("r4move"))
    topic = f"devices/{device}/t"
    pub = raw(pair.nodes[owner], version=5)
    pub.connect(unique("r4pub"))
    _publish_n(pub, topic, 0, _STORED)

    cid = unique("r4sub")
    sub = raw(pair.nodes[0], version=5)
    sub.connect(cid, properties=RESUME)
    sub.send(R.subscribe(1, [(f"devices/{device}/#", 1)], version=5,
                         properties={R.USER_PROPERTY: [("offset", "earliest")]}))
    firsts: list[int] = []
    got: set[int] = set()

    def take(pkt: R.Packet) -> int:
        value = int(pkt.payload)
        if value not in got:
            got.add(value)
            firsts.append(value)
        return value

    while len(got) < _MOVE_AT:
        pkt = sub.recv(timeout=30)
        if pkt.type == R.PUBLISH:
            take(pkt)
            sub.ack(pkt)
    # the window's worth in flight, not acknowledged, then the connection lost
    unacked = []
    while len(unacked) < 4:
        pkt = sub.recv(timeout=30)
        if pkt.type == R.PUBLISH:
            unacked.append(take(pkt))
    sub.abort()

    again = raw(pair.nodes[1], version=5)
    ack = again.connect(cid, clean=False, properties=RESUME)
    assert ack.session_present, f"the session did not move to node 1: {ack!r}"
    _publish_n(pub, topic, _STORED, 20)  # live after the replay ends
    total = _STORED + 20
    deadline = time.monotonic() + 60
    while len(got) < total:
        assert time.monotonic() < deadline, (
            f"{len(got)} of {total} offsets delivered after the session moved; missing "
            f"{sorted(set(range(total)) - got)[:20]} (in flight at the move: {unacked})")
        try:
            pkt = again.recv(timeout=5)
        except TimeoutError:
            continue
        if pkt.type == R.PUBLISH:
            take(pkt)
            again.ack(pkt)
    assert firsts == list(range(total)), (
        f"per-device order broken or gaps across the move: {firsts[:80]}...")
