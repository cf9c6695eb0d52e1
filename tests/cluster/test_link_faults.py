"""Link faults: a cut link, a stopped router, a killed owner (issue 15's "Link faults").

What must hold: QoS>=1 messages are delivered exactly once after a link heals (the link's
sequence numbers, acks and resend); the other links keep flowing while one is stalled; a
publish on a logged topic at a non-owner router is acknowledged only once the owner stored it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, ClientFactory, PacketTypes, props, unique
from helpers.cluster import Cluster
from helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Cluster, TcpProxy]]:
    """3 nodes; node 0 reaches node 2 through a proxy the test cuts and heals."""
    # queues big enough for the burst: what is tested is the link, not the subscriber's queue
    cluster = Cluster(tmp_path, n=3, overrides={"mqtt": {"max_queued_messages": 100_000}})
    proxy = TcpProxy(cluster.mesh_ports[2])
    cluster.dial_via(0, 2, proxy.port)
    try:
        cluster.start()
        yield cluster, proxy
    finally:
        cluster.stop()
        proxy.close()


@pytest.mark.parametrize("logged", [False, True], ids=["unlogged", "logged"])
def test_a_cut_link_heals_and_delivers_each_qos1_message_exactly_once(
        proxied: tuple[Cluster, TcpProxy], clients: ClientFactory, logged: bool) -> None:
    """Mid-stream the link first loses what is in flight (blackhole), then drops; it heals.
    Unlogged: node 0 forwards to node 2's subscriber. Logged: node 0 sends APPENDs to node 2,
    the owner (resent ones it already stored must not be stored twice)."""
    mesh, proxy = proxied
    n0, n1, n2 = mesh.nodes
    if logged:
        topic = f"devices/{mesh.device_owned_by(2, unique('cut'))}/t"
    else:
        topic = f"u/{unique('cut')}/t"
    sub = clients.connected(n2, protocol=V5)
    sub.subscribe(topic, 1)
    mesh.wait_routes(2, 1)
    pub = clients.connected(n0, protocol=V5)
    side = clients.connected(n1, protocol=V5)
    stop = threading.Event()
    sent: list = []

    def publish_steadily() -> None:
        # a steady stream, so entries are in flight whenever the blackhole starts
        while not stop.is_set():
            sent.append(pub.publish(topic, str(len(sent)), 1, wait=False))
            if len(sent) % 50 == 0:
                time.sleep(0.005)

    publisher = threading.Thread(target=publish_steadily)
    publisher.start()
    try:
        first = sub.expect_messages(200, timeout=30)  # traffic flows over the link ...
        proxy.blackhole()  # ... what is sent now is lost in transit, unacknowledged ...
        time.sleep(0.3)
        proxy.cut()  # ... and the connection drops
        wait_for(lambda: mesh.link(0, 2)["state"] != "up", 10, message="the link seen down")
        # the other links keep flowing while this one is down
        for i in range(20):
            side.publish(topic, f"side{i}", 1)
        time.sleep(1.0)
        proxy.heal()
        time.sleep(0.3)
    finally:
        stop.set()
        publisher.join(30)
    total = len(sent)
    wait_for(lambda: all(i.mid in pub.pubacks for i in sent), 90,
             message="every PUBACK at node 0")
    got = [m.payload.decode() for m in first]
    deadline = time.monotonic() + 60
    while len(got) < total + 20 and time.monotonic() < deadline:
        got.extend(m.payload.decode() for m in sub.drain())
        time.sleep(0.1)
    time.sleep(1.0)
    got.extend(m.payload.decode() for m in sub.drain())  # nothing more: no duplicate
    mine = sorted(int(p) for p in got if not p.startswith("side"))
    missing = sorted(set(range(total)) - set(mine))
    dups = len(mine) - len(set(mine))
    link = mesh.link(0, 2)
    assert not missing and not dups, (
        f"{len(missing)} missing (first {missing[:5]}, last {missing[-5:]}), {dups} duplicates;"
        f" link n0->n2: {link}; n2 dropped: "
        f"{mesh.nodes[2].metric('meshmq_messages_dropped_total')}")
    assert sorted(p for p in got if p.startswith("side")) == sorted(
        f"side{i}" for i in range(20))
    assert link["state"] == "up" and link["reconnects"] >= 2
    assert link["resent"] > 0, "the blackhole lost nothing in flight: the test proved nothing"
    assert proxy.accepted >= 2


def test_a_replay_through_a_cut_link_resumes_where_it_was(
        proxied: tuple[Cluster, TcpProxy], clients: ClientFactory) -> None:
    """An offset replay at node 0 of a log node 2 owns reads its history over the proxied
    link. The link is cut mid-replay: the replay waits (a subscribe asking for an offset
    meanwhile is refused, the owner being unreachable), and once the link heals it resumes
    where it was, with what was published during the cut, each message once and in order."""
    mesh, proxy = proxied
    n0, n1, n2 = mesh.nodes
    device = mesh.device_owned_by(2, unique("rcut"))
    topic = f"devices/{device}/t"
    pub = clients.connected(n2, protocol=V5)
    for i in range(2999):
        pub.publish(topic, f"m{i}", 1, wait=False)
    pub.publish(topic, "m2999", 1)
    sub = clients.connected(n0, protocol=V5, connect={
        "properties": props(PacketTypes.CONNECT, ReceiveMaximum=4)})
    replay = props(PacketTypes.SUBSCRIBE, UserProperty=[("offset", "earliest")])
    assert sub.subscribe(f"devices/{device}/#", 1, properties=replay) == [1]
    got = sub.expect_messages(300, timeout=30)
    proxy.cut()
    wait_for(lambda: mesh.link(0, 2)["state"] != "up", 10, message="the link seen down")
    late = clients.connected(n0, protocol=V5)
    assert late.subscribe(f"devices/{device}/#", 1, properties=replay) == [0x83]
    for i in range(3000, 3050):
        pub.publish(topic, f"m{i}", 1)
    got.extend(sub.drain())
    proxy.heal()
    wait_for(lambda: mesh.link(0, 2)["state"] == "up", 20, message="the link up again")
    got.extend(sub.expect_messages(3050 - len(got), timeout=60))
    sub.expect_no_message(1.0)
    offsets = [int(dict(m.properties.UserProperty)["offset"]) for m in got]
    assert offsets == list(range(3050)), (
        f"missing {sorted(set(range(3050)) - set(offsets))[:10]}, "
        f"duplicated {sorted({o for o in offsets if offsets.count(o) > 1})[:10]}")
    assert [m.payload.decode() for m in got] == [f"m{i}" for i in range(3050)]
    assert mesh.link(0, 2)["reconnects"] >= 1


def test_a_stopped_router_does_not_stall_the_other_links(tmp_path: Path,
                                                         clients: ClientFactory) -> None:
    """More messages than a link's window (1,024) while router 1 is frozen: its link's window
    fills and stays full; router 2's link must not care."""
    N = 1500
    mesh = Cluster(tmp_path, n=3, overrides={"mqtt": {"max_queued_messages": 10_000},
                                             "cluster": {"link_window": 1024}}).start()
    try:
        n0, n1, n2 = mesh.nodes
        topic = f"u/{unique('stop')}/t"
        at1 = clients.connected(n1, protocol=V5, clean=True)
        at1.subscribe(topic, 1)
        at2 = clients.connected(n2, protocol=V5)
        at2.subscribe(topic, 1)
        mesh.wait_routes(1, 1)
        mesh.wait_routes(2, 1)
        pub = clients.connected(n0, protocol=V5)
        router1 = mesh.router_pid(1)
        os.kill(router1, signal.SIGSTOP)
        try:
            infos = [pub.publish(topic, str(i), 1, wait=False) for i in range(N)]
            wait_for(lambda: all(i.mid in pub.pubacks for i in infos), 60,
                     message="every PUBACK")
            # node 2 gets everything while node 1 is frozen
            got = at2.expect_messages(N, timeout=20)
            assert [m.payload.decode() for m in got] == [str(i) for i in range(N)]
            time.sleep(1.0)
        finally:
            os.kill(router1, signal.SIGCONT)
        # and node 1's subscriber gets its copies once it runs again, each once
        got1 = at1.expect_messages(N, timeout=30)
        assert sorted(int(m.payload) for m in got1) == list(range(N))
        at1.expect_no_message(1.0)
    finally:
        mesh.stop()


def test_a_publish_at_a_non_owner_is_acked_only_once_the_owner_stored_it(
        tmp_path: Path, clients: ClientFactory) -> None:
    """The owner is frozen: no PUBACK. It is killed (kill -9 of the owner router; its node's
    supervisor restarts it): the publisher's router resends over the new link, the owner
    stores it, and only then the PUBACK comes; the record is in the owner's log exactly once.
    (cluster.append_timeout above the restart: here the publish is to wait, not be refused.)"""
    mesh = Cluster(tmp_path, n=3, overrides={"cluster": {"append_timeout": 120.0}}).start()
    try:
        n0, n1, n2 = mesh.nodes
        device = mesh.device_owned_by(1, unique("own"))
        pub = clients.connected(n0, protocol=V5)
        pub.publish(f"devices/{device}/t", "before", 1)  # owner up: acked
        owner = mesh.router_pid(1)
        os.kill(owner, signal.SIGSTOP)
        info = pub.publish(f"devices/{device}/t", "while-frozen", 1, wait=False)
        time.sleep(1.5)
        assert info.mid not in pub.pubacks, "acked while the owner could not store it"
        os.kill(owner, signal.SIGKILL)  # works on a stopped process; the supervisor restarts it
        wait_for(lambda: info.mid in pub.pubacks, 30, message="the PUBACK after the restart")

        mesh.wait_router_restarted(1, owner, timeout=60)
        assert pub.puback_code(info) == 0
        reader = clients.connected(n1, protocol=V5)
        reader.subscribe(f"devices/{device}/#", 1,
                         properties=props(PacketTypes.SUBSCRIBE,
                                          UserProperty=[("offset", "earliest")]))
        got = [m.payload.decode() for m in reader.expect_messages(2, timeout=10)]
        assert got == ["before", "while-frozen"]
        reader.expect_no_message(1.0)
    finally:
        mesh.stop()


def test_a_logged_publish_is_refused_not_acked_when_the_owner_cannot_be_reached(
        tmp_path: Path, clients: ClientFactory) -> None:
    """A v5 publisher whose owner is gone gets no false PUBACK: it waits (the link queues
    and resends) up to cluster.append_timeout, which refuses it (tests/cluster/
    test_append_outcomes.py); when its router shuts down, the pending publish is answered
    'not stored' by closing, never with success."""
    mesh = Cluster(tmp_path, n=2).start()
    try:
        n0, n1 = mesh.nodes
        device = mesh.device_owned_by(1, unique("gone"))
        pub = clients.connected(n0, protocol=V5)
        n1.kill()  # the supervisor: its router follows (PR_SET_PDEATHSIG) and nothing restarts it
        info = pub.publish(f"devices/{device}/t", "x", 1, wait=False)
        time.sleep(1.0)
        assert info.mid not in pub.pubacks
    finally:
        mesh.stop()
