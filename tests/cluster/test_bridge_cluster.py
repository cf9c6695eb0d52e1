"""A bridge in a cluster runs on exactly one router, and moves when that router's node dies
(meshmq/bridge.py, "Which router runs it"): two real nodes, a real Mosquitto."""

from __future__ import annotations

import time
from pathlib import Path

from helpers.broker import wait_for
from helpers.clients import V5, Client
from helpers.cluster import Cluster
from helpers.mosquitto import ALL_MOSQUITTOS, MosquittoProc


def test_one_router_runs_the_bridge_and_it_moves_when_that_node_dies(tmp_path: Path) -> None:
    mosq = MosquittoProc(tmp_path / "mosquitto").start()
    bridge = {"name": "up", "address": f"{mosq.host}:{mosq.port}", "reconnect_min": 0.2,
              "reconnect_max": 1.0, "topics": [{"pattern": "devices/#", "direction": "out"}]}
    cluster = Cluster(tmp_path, n=2, overrides={"bridge": [bridge]})
    clients: list[Client] = []
    try:
        cluster.start()

        def active() -> list[float]:
            return [n.metric("meshmq_bridge_active", bridge="up") if n.alive else 0.0
                    for n in cluster.nodes]

        wait_for(lambda: sum(active()) == 1 and any(
            n.metric("meshmq_bridge_up", bridge="up") == 1 for n in cluster.nodes if n.alive),
            timeout=30, message="exactly one router running a connected bridge")
        # stays one (every router re-checks every second): a sentinel of a few checks
        for _ in range(6):
            time.sleep(0.5)
            assert sum(active()) == 1, f"bridge running on {active()} routers"
        runs = active().index(1)
        other = 1 - runs

        sub = Client(host=mosq.host, port=mosq.port, protocol=V5)
        sub.connect()
        clients.append(sub)
        sub.subscribe("devices/#", qos=1)
        for i, node in enumerate(cluster.nodes):  # published at either node, bridged once
            pub = Client(node, protocol=V5)
            pub.connect()
            clients.append(pub)
            pub.publish(f"devices/d{i}/x", f"via-n{i}".encode(), qos=1)
        got = sorted(m.payload for m in sub.expect_messages(2, timeout=30))
        assert got == [b"via-n0", b"via-n1"]

        device = cluster.device_owned_by(other)  # (a log on the dead node waits for it)
        cluster.nodes[runs].kill()
        wait_for(lambda: cluster.nodes[other].metric("meshmq_bridge_active", bridge="up") == 1
                 and cluster.nodes[other].metric("meshmq_bridge_up", bridge="up") == 1,
                 timeout=60, message="the surviving node to take the bridge over")
        pub = Client(cluster.nodes[other], protocol=V5)
        pub.connect()
        clients.append(pub)
        assert pub.puback_code(pub.publish(f"devices/{device}/y", b"after-failover",
                                           qos=1)) == 0
        m = sub.expect_message(timeout=30)
        assert m.payload == b"after-failover"
    finally:
        for c in clients:
            c.stop()
        cluster.stop()
        mosq.stop()
        ALL_MOSQUITTOS.remove(mosq)
