"""The node admin endpoint in front of the routers: the log listing covers every router's store,
a device's log is asked of its owner when the owner is a router of this node, and readiness
names the router that is not ready."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator

import pytest
from helpers.broker import wait_for
from helpers.clusternode import ClusterNode, mqtt_connect, mqtt_publish_qos1

from cluster.placement import Placement
from commitlog.fetch import decode_multi_fetch

pytestmark = pytest.mark.timeout(120)

DEVICES = [f"adm-{i:02d}" for i in range(20)]


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[ClusterNode]:
    n = ClusterNode(tmp_path_factory.mktemp("admin") / "node", routers=2)
    try:
        n.start()
        n.wait_routers_up()
        for i, device in enumerate(DEVICES):  # one connection each: the kernel spreads them
            sock = mqtt_connect(n.port, f"pub-{device}")
            try:
                mqtt_publish_qos1(sock, f"devices/{device}/t", b"x" * (i + 1))
            finally:
                sock.close()
        yield n
    finally:
        n.kill_everything()


def _router_logs(node: ClusterNode, index: int) -> dict[str, int]:
    """The logs router ``index`` stores: its own listing alone, as a peer router asks for it
    (a router's listing covers the whole cluster otherwise)."""
    port = json.loads((node.workdir / "data" / f"router-{index}" / "router.json").read_text())[
        "admin_port"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/logs",
                                 headers={"X-Meshmq-Relayed": "1"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return {e["device"]: e["end"] for e in json.loads(resp.read())["logs"]}


def test_log_listing_merges_every_router(node):
    per_router = [_router_logs(node, r) for r in (0, 1)]
    assert all(per_router), per_router  # both routers hold some of the logs
    status, body = node.http_get("/api/v1/logs")
    assert status == 200, body
    listed = [e["device"] for e in json.loads(body)["logs"]]
    assert listed == DEVICES  # sorted, each once
    pages: list[str] = []
    after = None
    while True:  # paging through the merged listing visits every device once
        status, body = node.http_get("/api/v1/logs?limit=3" + (f"&after={after}" if after
                                                                else ""))
        page = json.loads(body)
        pages += [e["device"] for e in page["logs"]]
        if "next_after" not in page:
            break
        after = page["next_after"]
    assert pages == DEVICES


def test_device_log_is_asked_of_its_local_owner(node):
    owners = Placement(["test/0", "test/1"])
    per_router = [_router_logs(node, r) for r in (0, 1)]
    at_owner = [d for d in DEVICES if d in per_router[int(owners.leader_of(d).router[-1])]]
    assert at_owner, (per_router, "no device stored at its owner")
    for device in at_owner:
        for _ in range(2):  # twice: a round-robin pick would hit the other router once
            status, body = node.http_get(f"/api/v1/logs/{device}")
            assert status == 200, (device, body)
            assert json.loads(body)["end"] == 1


def _admin_port(node: ClusterNode, index: int) -> int:
    return int(json.loads((node.workdir / "data" / f"router-{index}" / "router.json")
                          .read_text())["admin_port"])


def test_records_and_bulk_fetch_pass_through_the_proxy(node):
    """Binary bodies come back byte for byte, and a POST's body reaches the router."""
    owners = Placement(["test/0", "test/1"])
    device = next(d for d in DEVICES
                  if d in _router_logs(node, int(owners.leader_of(d).router[-1])))
    path = f"/api/v1/logs/{device}/records?offset=0"
    direct_port = _admin_port(node, int(owners.leader_of(device).router[-1]))
    def fetch(port: int) -> tuple[bytes, dict[str, str]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            assert resp.status == 200
            return resp.read(), {k: v for k, v in resp.headers.items()
                                 if k.lower().startswith(("x-meshmq-", "content-type"))}

    direct = fetch(direct_port)
    assert direct[1]["X-Meshmq-Record-Count"] == "1"  # the offsets travel in headers
    assert fetch(node.admin_port) == direct
    body = json.dumps({"devices": [{"device": d} for d in DEVICES]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{node.admin_port}/api/v1/fetch", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        sections = decode_multi_fetch(resp.read())
    assert [s.device for s in sections] == DEVICES


def test_readyz_names_the_router_that_does_not_answer(node):
    pids = node.wait_routers_up()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        status, body = node.http_get("/readyz", timeout=15)
        assert status == 503, body
        doc = json.loads(body)
        assert doc["routers"]["test/0"] == "ready"
        assert "router test/1" in doc["reason"] and "test/0" not in doc["reason"]
    finally:
        os.kill(pids[1], signal.SIGCONT)
    wait_for(lambda: node.http_get("/readyz")[0] == 200, timeout=15, message="ready again")
