"""A slow or offline subscriber at a router that does not own the device log is a lag, never a
drop (issue 18's promise, across the mesh): its session falls behind onto the owner's log and
reads it back over the link (FETCH/RECORDS), and the positions it holds survive a restart of
its router.

Two nodes, a queue bound of 20 messages so that a burst of hundreds overflows it at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.clients import V5, ClientFactory, PacketTypes, props, unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

_BURST = 600


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("lag"), n=2,
                      overrides={"mqtt": {"max_queued_messages": 20}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _persistent(clients: ClientFactory, node, cid: str, **extra):
    return clients.connected(node, cid, protocol=V5, clean=False, connect={
        "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=3600, **extra)})


def _burst(clients: ClientFactory, node, topic: str) -> None:
    pub = clients.connected(node, protocol=V5)
    for i in range(_BURST - 1):
        pub.publish(topic, f"b{i}", 1, wait=False)
    pub.publish(topic, f"b{_BURST - 1}", 1)


def _queue_drops(node) -> float:
    return node.metric("meshmq_messages_dropped_total", reason="queue_full")


def test_a_stalled_subscriber_at_a_non_owner_reads_the_burst_back_from_the_owner(
        pair: Cluster, clients: ClientFactory) -> None:
    """The subscriber stops reading while 600 messages arrive from the owner: the window and
    the queue fill, its session falls behind, and when it reads again it gets every message
    once, in order, with nothing dropped at its router."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("slow"))
    sub = clients.connected(n0, protocol=V5, connect={
        "properties": props(PacketTypes.CONNECT, ReceiveMaximum=4)})
    sub.subscribe(f"devices/{device}/#", 1)
    pair.wait_routes(0, 1)
    drops = _queue_drops(n0)
    sub.stop_loop_only()  # stops reading: its socket and then the broker's window fill
    _burst(clients, n1, f"devices/{device}/t")
    sub.mqtt.loop_start()
    got = sub.expect_messages(_BURST, timeout=60)
    assert [m.payload.decode() for m in got] == [f"b{i}" for i in range(_BURST)]
    sub.expect_no_message(0.5)
    assert _queue_drops(n0) == drops


def test_an_offline_session_at_a_non_owner_keeps_its_position_across_a_restart(
        pair: Cluster, clients: ClientFactory) -> None:
    """Offline at node 0 while 600 messages of a log node 1 owns arrive: the session holds a
    position in that log, not copies; node 0 restarts (SIGTERM); the client comes back and
    reads all of them from the owner, once and in order."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("off"))
    cid = unique("offline")
    first = _persistent(clients, n0, cid)
    first.subscribe(f"devices/{device}/#", 1)
    pair.wait_routes(0, 1)
    first.disconnect()
    _burst(clients, n1, f"devices/{device}/t")
    n0.stop(timeout=20)
    n0.start(wait=False)
    n0.wait_ready()
    pair.wait_links_up()
    again = _persistent(clients, n0, cid)
    assert again.session_present
    got = again.expect_messages(_BURST, timeout=60)
    assert [m.payload.decode() for m in got] == [f"b{i}" for i in range(_BURST)]
    again.expect_no_message(0.5)
    assert _queue_drops(n0) == 0
