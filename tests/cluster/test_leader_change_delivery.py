"""A subscriber across a change of a device log's leader: every message once per session,
never an older one after a newer one (cluster/deliverfence.py, broker/delivery.py).

Three seams, each made deterministic (a 3-node Raft cluster, the third a 2-node static one):

* **a frozen leader's queued DELIVERs**: node 0 leads the log, its link to node 2 (the
  subscriber's) loses every byte while messages are committed (node 1 still fetches), then
  node 0 freezes (SIGSTOP, whole node) and node 1 is elected. Node 1 knew those messages were
  committed, so it never routes them; they exist for node 2 only in node 0's link queue. The
  subscriber must get them anyway (read from the log from its session's position when the
  epoch rises) and before node 1's newer ones; when node 0 resumes and its link heals, its
  late DELIVERs (the old epoch's) must not come through again.
* **a restarted leader's re-routing**: node 0's router is killed (-9) and re-elected with its
  logs; it routes what it cannot know its previous process routed, from its checkpointed
  high-water mark (long before its log end), so copies of old messages reach the subscriber
  after newer ones. The subscriber's router must drop what is below the session's position.
* **a restarted leader's re-routing of a resend**: node 0's router is killed (-9) after it
  routed a publish whose PUBACK its publisher never read; restarted, it finds the publisher's
  resend in its log (broker/pubdedupe.py) and, since its previous run may have died before
  routing it, routes it again. The subscriber on node 1 had it, and a newer message since:
  the copy is below its position and must not be handed on. (Recovery no longer re-routes
  from a checkpointed mark, so this seam is the one that reaches that check today.)

All three check the subscriber's stream by payload: each expected message present, and strictly
increasing (a repeat of an older message after a newer one fails: per-device order).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import V5, ClientFactory, unique
from helpers.cluster import Cluster, signal_all
from helpers.stream import check_stream, collect, last_unacked_on_a_peer
from helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(240)


def _leader(cluster: Cluster, i: int, device: str) -> tuple[str | None, int]:
    owner = cluster.status(i, device).get("owner") or {}
    return owner.get("router"), int(owner.get("epoch", -1))


def _publish_until_acked(raw, cluster: Cluster, i: int, topic: str, deadline: float) -> None:
    """Probe publishes at node i until one is acknowledged: the log accepts writes again (the
    probes are not part of the checked sequence; a refused one may still be stored)."""
    pub = None
    pid = 0
    while time.monotonic() < deadline:
        pid += 1
        try:
            if pub is None:
                pub = raw(cluster.nodes[i], version=5)
                pub.connect(unique("probe"))
            pub.send(R.publish(topic, f"probe{pid}", qos=1, packet_id=pid, version=5))
            if pub.expect(R.PUBACK, timeout=10).reason_code == 0:
                pub.close()
                return
        except AssertionError:  # refused by a close, or no answer: a fresh connection
            if pub is not None:
                pub.close()
            pub = None
        time.sleep(0.1)
    raise AssertionError(f"no publish to {topic} acknowledged at n{i} in time")


def _isr(cluster: Cluster, i: int, device: str) -> list[str]:
    return (cluster.status(i, device).get("owner") or {}).get("isr") or []


def _kill_node(cluster: Cluster, i: int) -> None:
    """kill -9 of every process of node i (supervisor first: it restarts nothing)."""
    pids = cluster.node_pids(i)
    signal_all(pids, signal.SIGKILL)
    cluster.nodes[i].kill()  # reaps the supervisor


@pytest.fixture
def raft_trio_via_proxy(tmp_path) -> Iterator[tuple[Cluster, TcpProxy]]:
    """Three Raft nodes; node 0 reaches node 2 through a proxy the test can cut."""
    cluster = Cluster(tmp_path, n=3, raft=True)
    proxy = TcpProxy(cluster.mesh_ports[2])
    cluster.dial_via(0, 2, proxy.port)
    try:
        cluster.start()
        yield cluster, proxy
    finally:
        proxy.close()
        cluster.stop()


def test_a_frozen_leader_s_queued_deliveries_are_read_from_the_log_in_order(
        raft_trio_via_proxy: tuple[Cluster, TcpProxy], clients: ClientFactory, raw) -> None:
    cluster, proxy = raft_trio_via_proxy
    n0, n1, n2 = cluster.nodes
    device = unique("fz")
    topic = f"devices/{device}/t"
    sub = clients.connected(n2, protocol=V5)
    sub.subscribe(f"devices/{device}/#", 1)
    cluster.wait_routes(2, 1)
    pub = clients.connected(n0, protocol=V5)
    pub.publish(topic, "a0", 1)  # places the log: its leader is node 0 (affinity)
    wait_for(lambda: _leader(cluster, 2, device)[0] == "n0/0", 30,
             message="node 2 names n0/0 the leader")
    want = [f"a{i}" for i in range(10)]
    for p in want[1:]:
        pub.publish(topic, p, 1)
    got = collect(sub, want, settle=0)
    assert set(want) <= set(got), got

    pids = cluster.node_pids(0)
    proxy.blackhole()  # node 0's DELIVERs to node 2 wait in its link; node 2 stops fetching
    held = [f"h{i}" for i in range(10)]
    for p in held:  # committed with node 1 once node 2 left the ISR
        assert pub.puback_code(pub.publish(topic, p, 1)) == 0
    signal_all(pids, signal.SIGSTOP)
    try:
        wait_for(lambda: _leader(cluster, 1, device)[0] not in (None, "n0/0"), 60,
                 interval=0.05, message="another leader elected for the frozen node's log")
        new = _leader(cluster, 1, device)[0]
        at = 1 if new == "n1/0" else 2
        _publish_until_acked(raw, cluster, at, topic, time.monotonic() + 60)
        after = [f"b{i}" for i in range(10)]
        pub2 = clients.connected(cluster.nodes[at], protocol=V5)
        for p in after:
            assert pub2.puback_code(pub2.publish(topic, p, 1)) == 0
        got += collect(sub, held + after)
    finally:
        signal_all(pids, signal.SIGCONT)
    proxy.heal()  # node 0's late DELIVERs (its old epoch) reach node 2 now
    cluster.wait_links_up(60)
    last = ["c0"]
    assert pub2.puback_code(pub2.publish(topic, "c0", 1)) == 0
    got += collect(sub, last, settle=2.0)
    check_stream(want + held + after + last, got)


def test_a_restarted_leader_s_copies_of_old_messages_are_not_delivered_again(
        tmp_path, clients: ClientFactory, raw) -> None:
    """The chaos suite's seed 4242: a router checkpointed its high-water mark as a follower
    (a clean restart), later led the log, and was killed (-9): re-elected with its logs, it
    recovered that old mark and routed everything above it again."""
    cluster = Cluster(tmp_path, n=3, raft=True)
    try:
        cluster.start()
        n0, n1, n2 = cluster.nodes
        device = unique("rs")
        topic = f"devices/{device}/t"
        sub = clients.connected(n2, protocol=V5)
        sub.subscribe(f"devices/{device}/#", 1)
        cluster.wait_routes(2, 1)
        want = [f"a{i}" for i in range(30)]
        pub = clients.connected(n1, protocol=V5)
        for p in want[:10]:  # the log is placed with its leader on node 1
            assert pub.puback_code(pub.publish(topic, p, 1)) == 0
        wait_for(lambda: set(_isr(cluster, 2, device)) == {"n0/0", "n1/0", "n2/0"}, 30,
                 message="all three in the ISR")
        time.sleep(1.0)  # node 0's fetches learn the mark (a10)
        old = cluster.router_pid(0)
        os.kill(old, signal.SIGTERM)  # a clean stop: its checkpoint holds the mark a10
        cluster.wait_router_restarted(0, old)
        wait_for(lambda: "n0/0" in _isr(cluster, 2, device), 60,
                 message="node 0 back in the ISR")
        # the device's publisher at node 0 (its client id is the device: the controller
        # elects the router a device is connected to)
        pub = clients.connected(n0, device, protocol=V5)
        for p in want[10:]:
            assert pub.puback_code(pub.publish(topic, p, 1)) == 0
        got = collect(sub, want, settle=0)
        _kill_node(cluster, 1)
        wait_for(lambda: _leader(cluster, 2, device)[0] == "n0/0", 60,
                 message="node 0 elected leader")
        _, epoch = _leader(cluster, 2, device)
        old = cluster.router_pid(0)
        os.kill(old, signal.SIGKILL)  # recovers the mark of its checkpoint: a10
        cluster.wait_router_restarted(0, old)
        wait_for(lambda: _leader(cluster, 2, device)[1] > epoch, 60,
                 message="node 0 re-elected with its logs at a new epoch")
        _publish_until_acked(raw, cluster, 0, topic, time.monotonic() + 60)
        pub = clients.connected(n0, protocol=V5)
        after = [f"b{i}" for i in range(10)]
        for p in after:
            assert pub.puback_code(pub.publish(topic, p, 1)) == 0
        got += collect(sub, after, settle=2.0)
        check_stream(want + after, got)
    finally:
        cluster.stop()


@pytest.mark.parametrize("sub_qos", [1, 0], ids=["qos1-sub", "qos0-sub"])
def test_a_resend_routed_again_by_a_restarted_leader_is_not_delivered_below_the_position(
        tmp_path, clients: ClientFactory, raw, sub_qos: int) -> None:
    """A restarted leader routes a resent publish it finds stored by its previous run again
    (broker/ingest.py ``_resend_committed``: that run may have died before routing it); the
    subscriber had it, and newer messages of the device since: the copy must not be handed
    on. At QoS 1 it is below the session's position there (broker/delivery.py ``deliver``);
    at QoS 0 (no position) no copy goes at all (``route_again``, and the DELIVER marked
    ``frames.AGAIN`` so node 1 does the same): a5 again after b0 was the duplicate out of
    order. Node 0 leads the log (static placement); the subscriber is on node 1, connected
    throughout."""
    cluster = Cluster(tmp_path, n=2)
    try:
        cluster.start()
        n0, n1 = cluster.nodes
        # a5: stored, committed and routed (the subscriber gets it), its PUBACK never read:
        # the router is killed -9 as if between routing it and acknowledging it
        topic, sub, pub, cid, want = last_unacked_on_a_peer(cluster, clients, raw, "rr",
                                                            sub_qos)
        got = collect(sub, want, settle=0)
        pub.abort()
        since = cluster.link(1, 0)["since"]
        old = cluster.router_pid(0)
        os.kill(old, signal.SIGKILL)
        cluster.wait_router_restarted(0, old)
        # node 1's link to the new incarnation up: the subscriber's position in node 0's log
        # is read back from there (broker/positions.py owner_back), nothing new; the read
        # goes live at the log end
        wait_for(lambda: cluster.link(1, 0)["state"] == "up"
                 and cluster.link(1, 0)["since"] > since, 60, message="n1's link to n0 back")
        wait_for(lambda: n1.metric("meshmq_sessions_lagging") == 0, 30,
                 message="the subscriber's read of node 0's log at its end")
        # a newer message, live: the read's seam is passed (broker/catchup.py divert), so
        # what follows is checked against the position alone
        other = raw(n0)
        other.connect(unique("rrother"))
        assert other.publish(topic, "b0", 1, packet_id=1).reason_code in (None, 0)
        got += collect(sub, ["b0"], settle=0)
        arrived = cluster.link(1, 0)["msgs_in"]
        # the publisher resends a5 (DUP=1, same packet id): found in the log, acknowledged
        # with its offset, and routed again (stored before this router started)
        hits = n0.metric("meshmq_publish_dedupe_total", result="hit")
        again = raw(n0)
        again.connect(cid, clean=False)
        again.send(R.publish(topic, "a5", qos=1, dup=True, packet_id=6))
        ack = again.expect(R.PUBACK, timeout=30, skip=(R.PUBLISH,))
        assert ack.packet_id == 6 and ack.reason_code in (None, 0), ack
        assert n0.metric("meshmq_publish_dedupe_total", result="hit") == hits + 1
        # b1 goes on the same link after the copy of a5: once it is in, the copy has been
        # decided on node 1
        assert other.publish(topic, "b1", 1, packet_id=2).reason_code in (None, 0)
        got += collect(sub, ["b1"], settle=1.0)
        # the copy of a5 did reach node 1 (else this test would check nothing)
        assert cluster.link(1, 0)["msgs_in"] == arrived + 2, cluster.link(1, 0)
        check_stream(want + ["b0", "b1"], got)
    finally:
        cluster.stop()
