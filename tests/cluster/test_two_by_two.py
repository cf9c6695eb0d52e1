"""2 nodes x 2 routers: clients land on whichever router SO_REUSEPORT gives them, and the
cluster still behaves as one broker (issue 15: "3 nodes, and 2 nodes x 2 routers")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, V311, ClientFactory, PacketTypes, props, unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("mesh2x2"), n=2, routers=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _routers_with_clients(mesh: Cluster, node: int) -> set[str]:
    """Which routers of a node hold client connections (from the merged metrics)."""
    text = mesh.nodes[node].metrics_text()
    out = set()
    for line in text.splitlines():
        if line.startswith("meshmq_clients_connected{") and not line.endswith(" 0.0"):
            out.add(line.split('router="', 1)[1].split('"', 1)[0])
    return out


@pytest.mark.parametrize("logged", [False, True], ids=["unlogged", "logged"])
def test_every_subscriber_gets_every_message_once_whichever_router_it_landed_on(
        mesh: Cluster, clients: ClientFactory, logged: bool) -> None:
    base = f"devices/{unique('d')}" if logged else f"u/{unique('x')}"
    subs = []
    k = 0
    # SO_REUSEPORT hashes each connection to a router: connect until both routers of node 1
    # hold subscribers (6 at least; 6 all landing on one router happens about 3 % of the time)
    while k < 6 or len(_routers_with_clients(mesh, 1)) < 2:
        assert k < 40, "40 connections and still one router of node 1 holds them all"
        sub = clients.connected(mesh.nodes[1], protocol=V5 if k % 2 else V311)
        sub.subscribe([(f"{base}/#", 2)] if k % 3 == 0 else
                      [(f"{base}/+", 2)] if k % 3 == 1 else [(f"{base}/t", 2)])
        subs.append((k % 3, sub))
        k += 1
    wait_for(lambda: all(lk["routes_in"] >= 1 for i in (0, 1) for lk in mesh.links(i)
                         if lk["peer"].startswith("n1/")), 10,
             message="node 1's routes known")
    pubs = [clients.connected(mesh.nodes[0], protocol=V5) for _ in range(4)]
    sent = []
    for i in range(40):
        pub = pubs[i % len(pubs)]
        payload = f"{i}"
        pub.publish(f"{base}/t", payload, i % 3)
        sent.append(payload)
    for kind, sub in subs:
        got = sorted(m.payload.decode() for m in sub.expect_messages(len(sent), timeout=20))
        assert got == sorted(sent), (kind, sub.client_id)
        sub.expect_no_message(0.3)


def test_a_persistent_session_follows_its_client_across_routers(
        mesh: Cluster, clients: ClientFactory) -> None:
    """Reconnecting lands on any router of any node: the session is there every time."""
    cid = unique("roam")
    topic = f"u/{unique('roam')}/t"
    connect = {"properties": props(PacketTypes.CONNECT, SessionExpiryInterval=600)}
    c = clients.connected(mesh.nodes[0], cid, protocol=V5, clean=False, connect=connect)
    c.subscribe(topic, 1)
    c.disconnect()
    pub = clients.connected(mesh.nodes[1], protocol=V5)
    for round_ in range(4):
        wait_for(lambda: sum(lk["routes_in"] for lk in mesh.links(1)) >= 1, 10,
                 message="the session's route known")
        pub.publish(topic, f"m{round_}", 1)
        c = clients.connected(mesh.nodes[round_ % 2], cid, protocol=V5, clean=False,
                              connect=connect)
        assert c.session_present
        got = c.expect_message(timeout=10)
        if round_ and got.payload == f"m{round_ - 1}".encode():
            # the last round's message again, resent (DUP): its PUBACK and the DISCONNECT were
            # still unread in the old router's socket when this connection took the session
            # over (seen with 4 test workers on 2 cores: the old connection's bytes_in was its
            # CONNECT alone). At least once, as with Mosquitto's takeover; never lost
            assert got.dup, got
            got = c.expect_message(timeout=10)
        assert got.payload == f"m{round_}".encode()
        c.disconnect()
