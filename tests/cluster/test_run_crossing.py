"""Runs across the mesh (broker/publishrun.py, issue 25): a fast publisher's run of plain QoS 0
publishes on one topic is routed once on its router, forwarded as one (``Mesh.forward_run``)
and, on the receiving router, routed as one again (``Mesh.on_deliveries`` -> ``route_run``).
Every subscriber on either router must get exactly what the per-message path gives it: every
message once, in order, in its protocol's shape, Maximum Packet Size honoured; a shared group
on a peer sends runs back to the per-message path (each message's share is picked alone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

N = 400


def _publishes(c: R.RawClient, n: int, timeout: float = 30) -> list[R.Packet]:
    got = []
    while len(got) < n:
        p = c.recv(timeout)
        if p.type == R.PUBLISH:
            got.append(p)
    return got


@pytest.mark.parametrize("shared", [False, True], ids=["runs", "peer-shared-group"])
def test_a_run_crosses_the_mesh_whole_and_in_order(tmp_path: Path, shared: bool) -> None:
    mesh = Cluster(tmp_path, n=2)
    made: list[R.RawClient] = []

    def client(node: int, version: int, cid: str, props: dict | None = None) -> R.RawClient:
        c = R.RawClient(mesh.nodes[node].host, mesh.nodes[node].port, version=version,
                        timeout=30)
        made.append(c)
        c.connect(unique(cid), properties=props)
        return c

    try:
        mesh.start()
        topic = f"u/{unique('run')}/t"
        far4 = client(1, 4, "far4")
        far5 = client(1, 5, "far5")
        far_max = client(1, 5, "farmax", {R.MAXIMUM_PACKET_SIZE: 200})
        near = client(0, 4, "near")
        for c in (far4, far5, near, far_max):
            c.subscribe(topic, 0)
        member = None
        if shared:  # a member of a shared group on router 0's peer: no runs on router 0
            member = client(1, 5, "member")
            member.subscribe(f"$share/g/{topic}", 0)
        wait_for(lambda: mesh.link(0, 1)["routes_in"] >= (2 if shared else 1), 30,
                 message="router 0 knows router 1's filters")
        payloads = [(b"L%04d" % i) * 60 if i % 7 == 3 else b"m%04d" % i for i in range(N)]
        pub = client(0, 4, "pub")
        pub.send(b"".join(R.publish(topic, p) for p in payloads))
        for c in (far4, far5, near):
            got = _publishes(c, N)
            assert [p.payload for p in got] == payloads
            assert all(p.topic == topic and p.qos == 0 and not p.retain for p in got)
            c.expect_none(0.3)
        small = [p for p in payloads if len(p) < 150]
        got = _publishes(far_max, len(small))
        assert [p.payload for p in got] == small
        far_max.expect_none(0.3)
        if member is not None:
            assert [p.payload for p in _publishes(member, N)] == payloads
            member.expect_none(0.3)
        link = mesh.link(0, 1)
        assert link["dropped_full"] == 0, link
    finally:
        for c in made:
            c.close()
        mesh.stop()
