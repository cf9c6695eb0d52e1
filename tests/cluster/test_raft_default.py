"""Raft placement is the cluster default (issue 24: "placement is state, not a hash").

A minimal 3-node config (node id, cluster name, secret, and ``id``/``host``/``port`` per node:
no ``placement``, no ``raft_port``) starts three real ``meshmq serve`` nodes whose metadata
processes listen on their derived Raft ports (mesh port + routers), elect one Raft leader, and
place a new device's log at the router its publisher is connected to with every node in its
ISR: the replicated cluster, not the static hash (which loses a node's acknowledged messages
with it). The config-level cases (a config without ``placement`` loads as raft, derived-port
collisions exit 2 naming the key) are in tests/meshmq/test_cluster_config.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all

from cluster.placement import Placement

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def minimal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("raftdefault"), n=3, minimal=True)
    try:
        for node in cluster.nodes:  # what the test relies on: the file says neither key
            text = node.config_path.read_text()
            assert "placement" not in text and "raft_port" not in text, text
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_a_minimal_cluster_config_runs_raft_placement_on_derived_ports(
        minimal: Cluster, raw) -> None:
    placements = [minimal.status(i).get("placement") for i in range(3)]
    assert placements == ["raft"] * 3, f"placement with no key in the config: {placements}"
    leaders: list[str | None] = []

    def one_leader() -> bool:
        leaders[:] = [minimal.status(i)["metadata"].get("leader") for i in range(3)]
        return leaders[0] is not None and len(set(leaders)) == 1
    wait_for(one_leader, 60, message=f"one Raft leader named by every node: {leaders}")
    # the derived ports (mesh port + routers) are the voters' addresses
    assert leaders[0] in {f"127.0.0.1:{p}" for p in minimal.raft_ports}, leaders
    # a device the static hash would put elsewhere: a fallback to the hash is caught
    hashed = Placement([f"n{i}/0" for i in range(3)])
    device = next(d for d in (unique("dflt") + f"x{k}" for k in range(1000))
                  if hashed.leader_of(d).router != "n1/0")
    pub = raw(minimal.nodes[1], version=5)
    pub.connect(unique("pub"))
    pub.send(R.publish(f"devices/{device}/t", b"first", qos=1, packet_id=1, version=5))
    ack = pub.expect(R.PUBACK, timeout=60)
    assert ack.reason_code == 0, ack
    owner: dict = {}

    def placed() -> bool:
        owner.update(minimal.status(0, device)["owner"])
        return owner.get("router") == "n1/0" and len(owner.get("isr") or []) == 3
    wait_for(placed, 30, message=f"{device} led by n1/0 with 3 in-sync replicas: {owner}")
    assert sorted(owner["isr"]) == ["n0/0", "n1/0", "n2/0"]
    assert [bytes(r.payload) for r in fetch_all(minimal.nodes[2], device)] == [b"first"]
