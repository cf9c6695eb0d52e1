"""Review 12: ``route_again`` (a record a restarted router finds stored by its previous run is
routed again without QoS 0 copies, here and at the peers) and the crossings of a publisher's
run (``Mesh.forward_run`` -> ``MeshLink.deliver_run``), attacked end to end.

* **the route gap**: a restarted router knows no peer's routes until its link to that peer is
  up again (cluster/routegap.py): what it routes meanwhile is sent to the peer when its routes
  arrive. A publisher's resend routed again in that window must reach the peer as it would
  have live: marked ``frames.AGAIN`` (no QoS 0 copy there), not as a plain DELIVER (the
  duplicate ``route_again`` exists to prevent).
* **a QoS 1 subscriber that never had the record**: the restarted router's previous run died
  before routing it (its PUBACK never written): routed again, it must arrive, once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import ClientFactory, unique
from helpers.cluster import Cluster
from helpers.stream import check_stream, collect, last_unacked_on_a_peer
from helpers.tcpproxy import TcpProxy

from cluster import frames

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("version", [4, 2], ids=["v4", "subscriber-router-v2"])
def test_a_resend_routed_again_before_the_peers_routes_are_known_is_no_qos0_copy_there(
        tmp_path, clients: ClientFactory, raw, version: int) -> None:
    """Node 0 leads the log, its QoS 0 subscriber is on node 1. a5 is stored, routed (the
    subscriber has it) and node 0's router killed before its PUBACK is read. Restarted with
    its link to node 1 cut, node 0 finds the publisher's resend of a5 stored and routes it
    again while node 1's routes are unknown; b0 follows. When the link heals, node 0 sends
    node 1 what it routed meanwhile (routegap): a5 must come marked as routed again (node 1
    hands no QoS 0 copy of it on), then b0: a0..a5, b0, never a5 twice. [subscriber-router-v2]:
    node 1 speaks mesh protocol 2 (the mark read by the version-2 decoder)."""
    cluster = Cluster(tmp_path, n=2,
                      per_node={1: {"cluster": {"protocol_version": version}}})
    proxy = TcpProxy(cluster.mesh_ports[1])
    cluster.dial_via(0, 1, proxy.port)  # node 0 dials node 1: through the proxy
    try:
        cluster.start()
        n0, n1 = cluster.nodes
        topic, sub, pub, cid, want = last_unacked_on_a_peer(cluster, clients, raw, "gap", 0)
        got = collect(sub, want, timeout=30.0, settle=0, skip="")
        assert got == want, got
        pub.abort()
        proxy.cut()  # node 0's next run cannot reach node 1: node 1's routes unknown there
        old = cluster.router_pid(0)
        os.kill(old, signal.SIGKILL)
        cluster.wait_router_restarted(0, old)
        hits = n0.metric("meshmq_publish_dedupe_total", result="hit")
        again = raw(n0)
        again.connect(cid, clean=False)
        again.send(R.publish(topic, "a5", qos=1, dup=True, packet_id=6))
        ack = again.expect(R.PUBACK, timeout=30, skip=(R.PUBLISH,))
        assert ack.packet_id == 6 and ack.reason_code in (None, 0), ack
        assert n0.metric("meshmq_publish_dedupe_total", result="hit") == hits + 1
        other = raw(n0)
        other.connect(unique("gapother"))
        assert other.publish(topic, "b0", 1, packet_id=1).reason_code in (None, 0)
        assert cluster.link(0, 1)["state"] != "up"
        proxy.heal()
        got += collect(sub, ["b0"], timeout=30.0, settle=1.5, skip="")
        check_stream(want + ["b0"], got)
        assert cluster.link(0, 1)["protocol_version"] == version
    finally:
        proxy.close()
        cluster.stop()


def test_a_publishers_run_crosses_to_two_peers_each_split_by_its_window(
        tmp_path: Path) -> None:
    """One publisher's runs of plain QoS 0 publishes (in one write: ``forward_run``, the same
    ``entry_items`` list handed to both links' ``deliver_run``) reach subscribers on two peers;
    ``link_window`` 7 splits every run on each link at its own points (``Run.take``, an ACK
    at a time). Each link's run must own its entries: each subscriber gets every message
    once, in order, and both links end with nothing queued."""
    n = 600
    mesh = Cluster(tmp_path, n=3, overrides={"cluster": {"link_window": 7}})
    made: list[R.RawClient] = []
    try:
        mesh.start()
        topic = f"u/{unique('tworuns')}/t"
        subs = []
        for node in (1, 2):
            c = R.RawClient(mesh.nodes[node].host, mesh.nodes[node].port, timeout=30)
            made.append(c)
            c.send(R.connect(unique(f"tworuns-sub{node}")))
            c.expect(R.CONNACK)
            c.send(R.subscribe(1, [(topic, 0)]))
            c.expect(R.SUBACK)
            subs.append(c)
        mesh.wait_routes(1, 1)
        mesh.wait_routes(2, 1)
        pub = R.RawClient(mesh.nodes[0].host, mesh.nodes[0].port, timeout=30)
        made.append(pub)
        pub.send(R.connect(unique("tworuns-pub")))
        pub.expect(R.CONNACK)
        # runs of 64 (RUN_MAX), one write each, a tick apart: each link's queue gets one
        # new run per tick (a second one in the tick would be appended to it, a list of its
        # own); payloads of varied length: a repeat, a loss or an entry of the other link's
        # split shows in them
        payloads = [str(i) * (1 + i % 23) for i in range(n)]
        for k in range(0, n, 64):
            pub.send(b"".join(R.publish(topic, p) for p in payloads[k:k + 64]))
            time.sleep(0.05)
        for c in subs:
            got = []
            while len(got) < n:
                p = c.recv(10)
                if p.type == R.PUBLISH:
                    got.append(p.payload.decode())
            assert got == payloads
        for peer in (1, 2):
            wait_for(lambda peer=peer: mesh.link(0, peer)["unacked"] == 0, 30,
                     message="every entry acked")
            link = mesh.link(0, peer)
            assert link["queued"] == 0 and link["queued_bytes"] == 0, link
            assert link["msgs_out"] == n and link["dropped_full"] == 0, link
    finally:
        for c in made:
            c.sock.close()
        mesh.stop()


_MUTATING_QOS = """
from cluster import frames
payloads = [b"x" * 10 for _ in range(2000)]
class Qos:
    def __index__(self):
        payloads.clear()
        return 0
made = frames.c_entry_items("t", payloads, Qos(), "c", 0)
assert made is None or made[0] == [] or len(made[0]) == 3 * 2000, made
print("ok")
"""


@pytest.mark.skipif(not frames.SPEEDUPS, reason="cluster._speedups not built")
def test_entry_items_reads_no_payload_a_qos_conversion_removed() -> None:
    """``_speedups.entry_items`` converts its arguments before it reads the payload list: a
    qos that is not an int runs Python code (``__index__``) that may empty the list; read
    after it, the C walked 2,000 freed slots (a segfault). In a child process: a crash fails
    this test, not the worker."""
    run = subprocess.run([sys.executable, "-c", _MUTATING_QOS], capture_output=True,
                         text=True, timeout=30, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr)
