"""The forwarding router's per-topic cache of links (issue 25, cheap crossings;
``Mesh._forward_to``, emptied by ``RouteTable.cache`` at every route change).

What must hold: a topic published while no peer wanted it is forwarded as soon as a peer's
subscription is known (a cache filled with "no link" must not outlive the route that changes
it), and no longer once the peer unsubscribes (nor a stale "that link" outlive its removal).
"""

from __future__ import annotations

import time
from pathlib import Path

from helpers.broker import wait_for
from helpers.clients import V5, ClientFactory, unique
from helpers.cluster import Cluster


def test_a_route_change_reaches_a_topic_already_forwarded_or_not(
        tmp_path: Path, clients: ClientFactory) -> None:
    mesh = Cluster(tmp_path, n=2).start()
    try:
        topic = f"u/{unique('fwd')}/t"
        pub = clients.connected(mesh.nodes[0], protocol=V5)
        for i in range(20):  # nobody wants it: cached at router 0 as going nowhere
            pub.publish(topic, f"early{i}", 1)
        assert mesh.link(0, 1)["msgs_out"] == 0
        sub = clients.connected(mesh.nodes[1], protocol=V5, clean=True)
        sub.subscribe(topic, 1)
        mesh.wait_routes(1, 1)
        for i in range(20):
            pub.publish(topic, f"late{i}", 1)
        got = sub.expect_messages(20, timeout=30)
        assert [m.payload.decode() for m in got] == [f"late{i}" for i in range(20)]
        sent = mesh.link(0, 1)["msgs_out"]
        assert sent == 20
        sub.unsubscribe(topic)
        wait_for(lambda: mesh.link(0, 1)["routes_in"] == 0, 10,
                 message="router 1's route removed at router 0")
        for i in range(20):  # cached as going to router 1 before: nowhere now
            pub.publish(topic, f"gone{i}", 1)
        time.sleep(0.5)
        assert mesh.link(0, 1)["msgs_out"] == sent
        sub.expect_no_message(0.5)
    finally:
        clients.close_all()
        mesh.stop()
