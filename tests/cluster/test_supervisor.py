"""A cluster node's supervisor with real router processes on loopback: shared MQTT port,
restart of a killed router, signals passed on, every child stopped by PID, and the node's one
admin endpoint (merged metrics with a ``router`` label, aggregated readiness and status).

The routers of a node here mesh with each other like any others; what crosses their links is
the mesh tests' subject (test_mesh_routing.py, test_link_faults.py), not these.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import urllib.request
from collections.abc import Iterator

import pytest
from helpers.broker import metric_sum, parse_metrics, wait_for
from helpers.certs import self_signed
from helpers.clusternode import ClusterNode, mqtt_connect, pid_alive
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(120)

ROUTERS = ("test/0", "test/1")


@pytest.fixture
def node(tmp_path) -> Iterator[ClusterNode]:
    n = ClusterNode(tmp_path / "node", routers=2)
    try:
        n.start()
        n.wait_routers_up()
        yield n
    finally:
        n.kill_everything()


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory) -> Iterator[ClusterNode]:
    n = ClusterNode(tmp_path_factory.mktemp("shared") / "node", routers=2)
    try:
        n.start()
        n.wait_routers_up()
        yield n
    finally:
        n.kill_everything()


def _router_metric(node: ClusterNode, index: int, name: str) -> float:
    """A metric read from router ``index``'s own admin port (not through the supervisor)."""
    port = json.loads((node.workdir / "data" / f"router-{index}" / "router.json").read_text())[
        "admin_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return metric_sum(parse_metrics(resp.read().decode()), name)


def test_routers_share_the_mqtt_port(tmp_path):
    # Its own node, started in the test: a node that cannot start (routers failing to share
    # the port) is this test failing, not a fixture error.
    shared_node = ClusterNode(tmp_path / "node", routers=2)
    try:
        shared_node.start()
        _connect_many_and_see_both_routers(shared_node)
    finally:
        shared_node.kill_everything()


def _connect_many_and_see_both_routers(shared_node: ClusterNode) -> None:
    pids = shared_node.wait_routers_up()
    assert len(set(pids)) == 2 and shared_node.pid not in pids
    socks: list[socket.socket] = []
    try:
        for i in range(40):
            socks.append(mqtt_connect(shared_node.port, f"share-{i}"))
        # SO_REUSEPORT hashes each connection to one router: 40 all on one is 2**-39.
        counts = [_router_metric(shared_node, r, "meshmq_connections_total") for r in (0, 1)]
        assert sum(counts) >= 40 and all(c > 0 for c in counts), counts
    finally:
        for s in socks:
            s.close()
    for r in (0, 1):  # each router keeps its store in its own directory
        assert (shared_node.workdir / "data" / f"router-{r}" / "log").is_dir()


def test_tls_and_websocket_ports_are_shared_too(tmp_path):
    """Every listener of a router shares the node's port, not only plain TCP: both routers
    report the same TLS and WebSocket addresses, and TLS clients get through."""
    node = ClusterNode(tmp_path / "node", routers=2, tls=self_signed(tmp_path))
    try:
        node.start()
        node.wait_routers_up()
        bound = [json.loads((node.workdir / "data" / f"router-{r}" / "router.json").read_text())[
            "mqtt"] for r in (0, 1)]
        assert bound[0] == bound[1]
        assert bound[0]["tls"] == f"127.0.0.1:{node.tls_port}"
        assert bound[0]["ws"] == f"127.0.0.1:{node.ws_port}"
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        for i in range(4):
            with socket.create_connection(("127.0.0.1", node.tls_port), timeout=5) as raw, \
                    ctx.wrap_socket(raw) as tls:
                tls.sendall(b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x02t" + str(i).encode())
                assert tls.recv(4) == b"\x20\x02\x00\x00"
    finally:
        node.kill_everything()


def test_merged_metrics_carry_the_router_label(shared_node):
    text = shared_node.metrics_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    sessions = families["meshmq_sessions"].samples
    assert sorted(s.labels["router"] for s in sessions) == list(ROUTERS)
    up = {s.labels["router"]: s.value for s in families["meshmq_router_up"].samples}
    assert up == {"test/0": 1.0, "test/1": 1.0}
    for fam in families.values():  # every sample says which router it is from
        for s in fam.samples:
            assert "router" in s.labels or "source_router" in s.labels, s
    req = urllib.request.Request(f"http://127.0.0.1:{shared_node.admin_port}/metrics",
                                 headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        body = resp.read().decode()
    assert body.rstrip().endswith("# EOF")
    assert 'meshmq_router_up{router="test/1"} 1.0' in body
    # A valid OpenMetrics page (strict parser: no family twice, _created inside its family),
    # with the router label on the routers' samples there too.
    om = {f.name: f for f in openmetrics_families(body)}
    assert sorted(s.labels["router"] for s in om["meshmq_sessions"].samples) == list(ROUTERS)
    assert {s.name for s in om["meshmq_event_loop_lag_seconds"].samples} >= {
        "meshmq_event_loop_lag_seconds_bucket", "meshmq_event_loop_lag_seconds_count"}


def test_readyz_and_cluster_status(shared_node):
    status, body = shared_node.http_get("/readyz")
    assert status == 200, body
    assert json.loads(body)["routers"] == {"test/0": "ready", "test/1": "ready"}
    doc = shared_node.cluster_status("?device=d1")
    assert doc["cluster"] == "test" and doc["node"] == "test"
    assert [r["router"] for r in doc["routers"]] == list(ROUTERS)
    assert doc["owner"]["router"] in ROUTERS and doc["owner"]["local"] is True


def test_sighup_reaches_every_router(shared_node):
    offset = shared_node.log_size()
    os.kill(shared_node.pid, signal.SIGHUP)

    def reloaded() -> bool:
        lines = [ln for ln in shared_node.log_since(offset).splitlines()
                 if "SIGHUP: nothing to reload" in ln]
        return all(any(f"router={rid}" in ln for ln in lines) for rid in ROUTERS)

    wait_for(reloaded, timeout=10, message="both routers logging their SIGHUP reload")
    assert shared_node.alive and all(shared_node.router_pids())


def test_killed_router_is_restarted(node):
    old = node.wait_routers_up()
    offset = node.log_size()
    os.kill(old[1], signal.SIGKILL)
    new = wait_for(lambda: (lambda p: p if p[1] and p[1] != old[1] else None)(node.router_pids()),
                   timeout=20, message="router 1 restarted with a new PID")
    assert new[0] == old[0]  # the other router was left alone
    assert node.cluster_status()["routers"][1]["restarts"] == 1
    assert "died (killed by SIGKILL)" in node.log_since(offset)
    wait_for(lambda: node.http_get("/readyz")[0] == 200, timeout=10, message="ready again")
    mqtt_connect(node.port, "after-restart").close()


def test_sigterm_drains_and_stops_every_router(node):
    pids = node.wait_routers_up()
    os.kill(node.pid, signal.SIGTERM)
    assert node.proc is not None
    assert node.proc.wait(timeout=30) == 0
    for pid in pids:
        assert not pid_alive(pid), f"router {pid} outlived the supervisor"
    assert node.log_text().count("meshmq node stopped") >= 3  # two routers and the node


def test_routers_die_with_a_killed_supervisor(node):
    pids = node.wait_routers_up()
    os.kill(node.pid, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=15,
             message="routers exiting after their supervisor was killed")


def test_router_start_failure_stops_the_node_with_exit_1(tmp_path):
    # Router 1's mesh port held: that router cannot start. (A taken MQTT port is refused by
    # the supervisor before any router starts: test_orphan_routers.py.)
    n = ClusterNode(tmp_path / "node", routers=2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", n.mesh_port + 1))
    blocker.listen()
    try:
        n.start(wait=False)
        assert n.proc is not None
        assert n.proc.wait(timeout=60) == 1
        text = n.log_text()
        assert "before it was ready" in text and "stopping the node" in text
        started = [int(w.split("=")[1]) for line in text.splitlines() if "router started" in line
                   for w in line.split() if w.startswith("pid=")]
        assert started and not any(pid_alive(p) for p in started)
    finally:
        blocker.close()
        n.kill_everything()
