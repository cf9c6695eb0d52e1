"""Retained changes learned from peer routers survive a restart, and a resync does not undo a
clear (cluster/retainsync.py).

Real ``meshmq serve`` processes, two nodes of one router each: node 0 is the peer the changes
come from, node 1 the router that learns them and is restarted while its peer is down (the
case where the RETAIN_SYNC of a link up cannot help: there is no link). Topics under ``u/`` are
unlogged (tests/helpers/cluster.py), so a retained publish is stored by the router its client is
connected to; ``devices/<d>/...`` with ``d`` owned by node 0 covers a logged topic, stored by
its owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broker import BrokerProc, wait_for
from helpers.clients import V5, ClientFactory, unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, n=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _retained_at(clients: ClientFactory, node: BrokerProc, topic: str) -> list[str]:
    """What a new subscriber at ``node`` gets as retained on ``topic`` (empty: nothing)."""
    c = clients.connected(node, protocol=V5)
    c.subscribe(topic, 1)
    got: list[str] = []
    try:
        msg = c.expect_message(timeout=0.5, topic=topic)
        assert msg.retain, f"a live message on {topic} at {node}, not a retained one"
        got.append(msg.payload.decode())
    except AssertionError as err:
        if "no message" not in str(err):
            raise
    c.disconnect()
    return got


def test_retained_learned_from_a_peer_survives_a_restart_without_peers(
        pair: Cluster, clients: ClientFactory) -> None:
    n0, n1 = pair.nodes
    unlogged = f"u/{unique('ret')}/state"
    logged = f"devices/{pair.device_owned_by(0, prefix='ret')}/state"
    cleared = f"u/{unique('clr')}/state"
    # n1's own retained message, stored by n1 itself: only a persisted clear can keep it gone
    clients.connected(n1, protocol=V5).publish(cleared, "stale", 1, retain=True)
    wait_for(lambda: _retained_at(clients, n0, cleared) == ["stale"], 10,
             message="n1's retained message known at n0")
    pub = clients.connected(n0, protocol=V5)
    pub.publish(unlogged, "on", 1, retain=True)
    pub.publish(logged, "21.5", 1, retain=True)
    pub.publish(cleared, b"", 1, retain=True)  # the clear comes from the peer
    for topic, want in ((unlogged, ["on"]), (logged, ["21.5"]), (cleared, [])):
        wait_for(lambda t=topic, w=want: _retained_at(clients, n1, t) == w, 10,
                 message=f"n1 learned {topic} = {want} from n0")
    clients.close_all()

    n0.stop()  # for good: n1 comes back with no peer to resync from
    n1.restart()
    assert _retained_at(clients, n1, unlogged) == ["on"]
    assert _retained_at(clients, n1, logged) == ["21.5"]
    assert _retained_at(clients, n1, cleared) == [], \
        "a clear learned from a peer was not kept: the router's own old message came back"
    assert n1.metric("meshmq_persistence_restored", kind="retained") == 2


def test_a_resync_does_not_bring_back_a_message_cleared_while_apart(
        pair: Cluster, clients: ClientFactory) -> None:
    """n1 holds a retained message on disk, is stopped, the message is cleared at n0, and n1
    comes back offering it in its RETAIN_SYNC: the clear made while apart wins on both."""
    n0, n1 = pair.nodes
    topic = f"u/{unique('apart')}/state"
    clients.connected(n0, protocol=V5).publish(topic, "old", 1, retain=True)
    wait_for(lambda: _retained_at(clients, n1, topic) == ["old"], 10,
             message="n1 learned the retained message")
    clients.close_all()
    n1.stop()
    clients.connected(n0, protocol=V5).publish(topic, b"", 1, retain=True)  # while apart
    assert _retained_at(clients, n0, topic) == []
    clients.close_all()

    n1.start()
    pair.wait_links_up()
    # a marker set at n1 after the link came up crosses it after n1's RETAIN_SYNC entries:
    # once n0 has the marker, it has processed the resync
    marker = f"u/{unique('marker')}/state"
    clients.connected(n1, protocol=V5).publish(marker, "m", 1, retain=True)
    wait_for(lambda: _retained_at(clients, n0, marker) == ["m"], 10,
             message="the marker from n1 at n0")
    assert _retained_at(clients, n0, topic) == [], \
        "n1's resync brought back at n0 a message cleared there while n1 was away"
    wait_for(lambda: _retained_at(clients, n1, topic) == [], 10,
             message="the clear made while apart applied at n1")
