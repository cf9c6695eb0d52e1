"""The fetch API of any node answers for every device of the cluster (issue 15): a many-device
``POST /api/v1/fetch`` is split by owner router and merged, ``GET /api/v1/logs`` lists every
router's logs, a router that does not answer is named, and the node admin's own part of
``/api/v1/cluster`` needs the admin credentials.

Real ``meshmq serve`` processes on loopback (3 nodes, one router each), with admin bearer
tokens: every relayed part must carry the caller's credentials to the owner, which checks
them itself. The last test stops node 2: keep it last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import REPO_ROOT, wait_for
from helpers.clients import V5, ClientFactory, unique
from helpers.cluster import Cluster
from helpers.clusternode import ClusterNode

from commitlog.fetch import STATUS_OK, decode_multi_fetch, decode_multi_records

pytestmark = pytest.mark.timeout(240)

TOKEN = "fetch-reader-token-0123456789"
AUTH = "Bearer " + TOKEN
RECORDS = 23  # per device


def _payload(device: str, i: int) -> bytes:
    """~110-170-byte records of varying size: a small budget ends inside a device's records
    at varying places (equal sizes could make every cut fall between devices)."""
    return f"{device}:{i}:{'x' * (7 * (i % 9))}".encode()


def _token_file(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "admin.tokens"
    path.write_text(f"reader:{TOKEN}\n")
    return str(path)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("xfetch")
    # publisher dedupe off: its per-record header (on by default in a cluster) would change
    # the record sizes _payload chose so that a small budget cuts inside a device's records
    cluster = Cluster(base, n=3, overrides={"admin": {"token_file": _token_file(base)},
                                            "mqtt": {"publisher_dedupe": "off"}})
    for node in cluster.nodes:
        node.admin_authorization = AUTH  # the helper's status calls need it too
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _request(node: Any, method: str, path: str, body: dict[str, Any] | None = None,
             auth: str | None = AUTH, timeout: float = 60.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{node.admin_port}{path}", data=data,
                                 method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if auth is not None:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _fetch(node: Any, positions: list[tuple[str, int]], **limits: int) -> tuple[int, bytes]:
    return _request(node, "POST", "/api/v1/fetch", {
        "devices": [{"device": d, "offset": o} for d, o in positions], **limits})


def _publish(clients: ClientFactory, mesh: Cluster, devices: list[str], n: int) -> None:
    """``n`` QoS 1 records per device, each device from another node than its owner's
    neighbour (the owner appends wherever the publisher is); waits for every PUBACK."""
    pubs = [clients.connected(node, protocol=V5) for node in mesh.nodes]
    infos = []
    for i in range(n):
        for k, device in enumerate(devices):
            infos.append(pubs[k % 3].publish(f"devices/{device}/t", _payload(device, i), 1,
                                             wait=False))
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()


@pytest.fixture(scope="module")
def devices(mesh: Cluster) -> list[str]:
    """Two devices owned by each node's router, interleaved (n0, n1, n2, n0, n1, n2)."""
    tag = unique("xf").replace("-", "")
    return [mesh.device_owned_by(k, f"{tag}{j}n{k}-") for j in range(2) for k in range(3)]


@pytest.fixture(scope="module")
def published(mesh: Cluster, devices: list[str]) -> list[str]:
    clients = ClientFactory()
    try:
        _publish(clients, mesh, devices, RECORDS)
    finally:
        clients.close_all()
    return devices


def _expected(device: str) -> list[bytes]:
    return [_payload(device, i) for i in range(RECORDS)]


def test_one_many_device_fetch_at_node_0_reads_every_owner(mesh: Cluster,
                                                          published: list[str]) -> None:
    status, body = _fetch(mesh.nodes[0], [(d, 0) for d in published])
    assert status == 200, body[:300]
    sections = decode_multi_fetch(body)
    assert [s.device for s in sections] == published  # request order, each once
    assert all(s.status == STATUS_OK and s.high_watermark == RECORDS for s in sections), sections
    records = decode_multi_records(body)
    for device in published:
        assert [r.offset for r in records[device]] == list(range(RECORDS))
        assert [bytes(r.payload) for r in records[device]] == _expected(device)


def test_paging_under_a_small_budget_reads_every_record_once_in_order(
        mesh: Cluster, published: list[str]) -> None:
    """A budget of a few records per request: each response stays within it (one record
    over only when it is the response's only one) and cuts a device's records where the
    budget ends; asking again from each ``next_offset`` reads every record exactly once."""
    budget = 700
    position = {d: 0 for d in published}
    got: dict[str, list[Any]] = {d: [] for d in published}
    cuts = 0  # responses that ended inside a later device's records
    for _ in range(1000):
        todo = [d for d in published if position[d] < RECORDS]
        if not todo:
            break
        status, body = _fetch(mesh.nodes[0], [(d, position[d]) for d in todo], max_bytes=budget)
        assert status == 200, body[:300]
        sections = decode_multi_fetch(body)
        assert [s.device for s in sections] == todo
        size = sum(len(s.records) for s in sections)
        count = sum(s.record_count for s in sections)
        assert count > 0, "no progress"
        assert size <= budget or count == 1, (size, count)
        records = decode_multi_records(body)
        cuts += sum(1 for s in sections if s.record_count and s.next_offset < s.high_watermark
                    and s.device != sections[0].device)
        for s in sections:
            assert s.status == STATUS_OK
            offsets = [r.offset for r in records[s.device]]
            assert offsets == list(range(position[s.device], s.next_offset)), (s, offsets)
            got[s.device] += records[s.device]
            position[s.device] = s.next_offset
    for device in published:
        assert [r.offset for r in got[device]] == list(range(RECORDS))
        assert [bytes(r.payload) for r in got[device]] == _expected(device)
    assert cuts, "no response was cut inside a device's records: the test lost its point"


def _list_all(node: Any, limit: int) -> list[tuple[str, int]]:
    listed: list[tuple[str, int]] = []
    after: str | None = None
    while True:
        path = f"/api/v1/logs?limit={limit}" + (f"&after={after}" if after else "")
        status, body = _request(node, "GET", path)
        assert status == 200, body[:300]
        page = json.loads(body)
        assert "unreachable" not in page, page
        listed += [(e["device"], e["end"]) for e in page["logs"]]
        after = page.get("next_after")
        if after is None:
            return listed


def test_the_listing_at_every_node_lists_every_log_once(mesh: Cluster,
                                                        published: list[str]) -> None:
    for node in mesh.nodes:
        for limit in (1000, 2):  # one page, and pages that cut through the routers' lists
            listed = _list_all(node, limit)
            names = [d for d, _ in listed]
            assert names == sorted(set(names)), names  # sorted, each once
            assert {d: e for d, e in listed if d in published} == {d: RECORDS
                                                                  for d in published}


def test_a_long_poll_over_several_owners_returns_a_record_committed_while_it_waits(
        mesh: Cluster, clients: ClientFactory) -> None:
    tag = unique("lp").replace("-", "")
    devs = [mesh.device_owned_by(k, f"{tag}n{k}-") for k in (1, 2)]
    pub = clients.connected(mesh.nodes[0], protocol=V5)
    for d in devs:
        pub.publish(f"devices/{d}/t", "first", 1)
    answer: dict[str, Any] = {}

    def poll() -> None:
        answer["r"] = _fetch(mesh.nodes[0], [(d, 1) for d in devs], max_wait_ms=20_000)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.0)  # (not an assertion: the record may also land before the poll waits)
    pub.publish(f"devices/{devs[1]}/t", "second", 1)
    thread.join(90)
    status, body = answer["r"]
    assert status == 200, body[:300]
    records = decode_multi_records(body)
    assert records[devs[0]] == []
    assert [(r.offset, bytes(r.payload)) for r in records[devs[1]]] == [(1, b"second")]


def test_an_unreachable_owner_is_named_not_skipped(mesh: Cluster,
                                                   published: list[str]) -> None:
    """Last test: stops node 2."""
    mesh.nodes[2].stop(timeout=15)
    wait_for(lambda: mesh.link(0, 2)["state"] != "up", 20, message="n0's link to n2 down")
    status, body = _fetch(mesh.nodes[0], [(d, 0) for d in published])
    assert status == 503, body[:300]
    doc = json.loads(body)
    assert doc["router"] == "n2/0" and "n2/0" in doc["error"], doc
    status, body = _request(mesh.nodes[0], "GET", "/api/v1/logs")
    assert status == 200, body[:300]
    page = json.loads(body)
    assert list(page.get("unreachable", {})) == ["n2/0"], page
    listed = {e["device"] for e in page["logs"]}
    assert listed & set(published) == set(published[0::3] + published[1::3])
    res = subprocess.run([sys.executable, "-m", "meshmq", "log", "list", "--admin",
                          f"127.0.0.1:{mesh.nodes[0].admin_port}", "--token-file",
                          str(mesh.nodes[0].config["admin"]["token_file"])],
                         capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
    assert res.returncode == 1 and "n2/0" in res.stderr, (res.returncode, res.stderr)
    assert published[0] in res.stdout  # what was listed is still printed


# ------------------------------------------------------------------ node admin fallback


@pytest.fixture
def guarded_node(tmp_path: Path) -> Iterator[ClusterNode]:
    node = ClusterNode(tmp_path / "node", routers=1,
                       overrides={"admin": {"token_file": _token_file(tmp_path)}})
    node.admin_authorization = AUTH
    try:
        node.start()
        node.wait_routers_up()
        yield node
    finally:
        node.kill_everything()


def test_the_node_admins_own_cluster_status_needs_credentials(
        guarded_node: ClusterNode) -> None:
    """With its router not answering, the supervisor answers /api/v1/cluster alone: still
    only to a caller with credentials (401 and the routers' challenge otherwise)."""
    (pid,) = guarded_node.wait_routers_up()
    os.kill(pid, signal.SIGSTOP)
    try:
        for auth in (None, "Bearer not-the-token-0123456789"):
            req = urllib.request.Request(
                f"http://127.0.0.1:{guarded_node.admin_port}/api/v1/cluster")
            if auth:
                req.add_header("Authorization", auth)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=20)
            assert err.value.code == 401
            assert "Bearer" in err.value.headers.get("WWW-Authenticate", "")
        status, body = guarded_node.http_get("/api/v1/cluster", timeout=20)
        assert status == 200, body[:300]
        assert json.loads(body)["routers"][0]["error"] == "no answer"
    finally:
        os.kill(pid, signal.SIGCONT)
