"""The admin API and CLI answer for the whole cluster at any node (issue 27): ``meshmq clients
list`` at node 0 shows the clients of every node, ``meshmq clients kick`` at node 0 disconnects
a client held by node 2 (v5 0x98), sessions offline on another node are listed, a retained
delete at one node clears it everywhere, and a router that does not answer is named (exit 1),
never silently left out.

Real ``meshmq serve`` nodes (3 x 1 router) with an admin token: every relayed part carries the
caller's credentials. The last test stops node 2: keep it last.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.broker import REPO_ROOT, wait_for
from helpers.clients import V5, ClientFactory, props, unique
from helpers.cluster import Cluster
from paho.mqtt.packettypes import PacketTypes

pytestmark = pytest.mark.timeout(240)

TOKEN = "admin-ops-token-0123456789"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    base = tmp_path_factory.mktemp("xadmin")
    tokens = base / "admin.tokens"
    tokens.write_text(f"ops:{TOKEN}\n")
    cluster = Cluster(base, n=3, overrides={"admin": {"token_file": str(tokens)}})
    for node in cluster.nodes:
        node.admin_authorization = "Bearer " + TOKEN
    try:
        cluster.start()
        yield cluster, str(tokens)
    finally:
        cluster.stop()


def cli(node: Any, tokens: str, *args: str) -> tuple[int, str, str]:
    res = subprocess.run([sys.executable, "-m", "meshmq", *args, "--admin",
                          f"127.0.0.1:{node.admin_port}", "--token-file", tokens],
                         capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
    return res.returncode, res.stdout, res.stderr


def rows(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_clients_of_every_node_listed_and_kicked_from_node_0(
        mesh: tuple[Cluster, str], clients: ClientFactory) -> None:
    cluster, tokens = mesh
    tag = unique("xc")
    held = [clients(cluster.nodes[i], f"{tag}-{i}", protocol=V5).connect() for i in range(3)]
    code, out, err = cli(cluster.nodes[0], tokens, "clients", "list", "--prefix", tag, "--json")
    assert code == 0, err
    listed = rows(out)
    assert [r["client_id"] for r in listed] == [f"{tag}-0", f"{tag}-1", f"{tag}-2"], listed
    assert [r["router"] for r in listed] == ["n0/0", "n1/0", "n2/0"]
    # the table names them too
    code, out, _ = cli(cluster.nodes[1], tokens, "clients", "list", "--prefix", tag)
    assert code == 0 and out.splitlines()[0].startswith("CLIENT_ID")
    assert all(f"{tag}-{i}" in out for i in range(3))
    # paging across routers: one per page, none skipped or repeated
    seen = []
    after = None
    for _ in range(5):
        path = f"/api/v1/clients?prefix={tag}&limit=1" + (f"&after={after}" if after else "")
        code, body = cluster.nodes[0].http_get(path)
        page = json.loads(body)
        seen += [r["client_id"] for r in page["clients"]]
        after = page.get("next_after")
        if after is None:
            break
    assert seen == [f"{tag}-0", f"{tag}-1", f"{tag}-2"]
    # a page filled by one peer alone: its "more" must survive the merge
    other = [clients(cluster.nodes[2], f"{tag}-only-{i}", protocol=V5).connect()
             for i in range(2)]
    code, body = cluster.nodes[0].http_get(f"/api/v1/clients?prefix={tag}-only&limit=1")
    page = json.loads(body)
    assert [r["client_id"] for r in page["clients"]] == [f"{tag}-only-0"]
    assert page.get("next_after") == f"{tag}-only-0", page
    for c in other:
        c.disconnect()
    # show and kick a client held by node 2, from node 0
    code, out, err = cli(cluster.nodes[0], tokens, "clients", "show", f"{tag}-2", "--json")
    assert code == 0 and json.loads(out)["router"] == "n2/0", (out, err)
    code, out, err = cli(cluster.nodes[0], tokens, "clients", "kick", f"{tag}-2")
    assert code == 0 and "kicked at router n2/0" in out, (out, err)
    rc = held[2].wait_disconnected()
    assert int(getattr(rc, "value", rc)) == 0x98
    assert held[0].is_connected() and held[1].is_connected()
    code, _, err = cli(cluster.nodes[0], tokens, "clients", "kick", f"{tag}-none")
    assert code == 1 and "404" in err


def test_sessions_and_retained_across_nodes(mesh: tuple[Cluster, str],
                                           clients: ClientFactory) -> None:
    cluster, tokens = mesh
    tag = unique("xs")
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=600)
    c = clients(cluster.nodes[1], f"{tag}-p", protocol=V5, clean=False)
    c.connect(properties=expiry)
    c.subscribe(f"u/{tag}/#", 1)
    c.disconnect()
    wait_for(lambda: [r["connected"] for r in rows(cli(cluster.nodes[2], tokens, "sessions",
                                                        "list", "--prefix", tag,
                                                        "--json")[1])] == [False], 20)
    code, out, _ = cli(cluster.nodes[2], tokens, "sessions", "show", f"{tag}-p", "--json")
    doc = json.loads(out)
    assert doc["router"] == "n1/0" and doc["expiry_interval"] == 600
    assert [s["filter"] for s in doc["subscription_list"]] == [f"u/{tag}/#"]
    code, out, err = cli(cluster.nodes[2], tokens, "sessions", "delete", f"{tag}-p")
    assert code == 0, err
    code, _, err = cli(cluster.nodes[0], tokens, "sessions", "show", f"{tag}-p")
    assert code == 1 and "404" in err
    # retained: set through node 0, deleted through node 1, gone for a subscriber on node 2
    pub = clients(cluster.nodes[0], f"{tag}-pub", protocol=V5).connect()
    pub.publish(f"u/{tag}/r", "value", qos=1, retain=True)
    wait_for(lambda: rows(cli(cluster.nodes[2], tokens, "retained", "list", "--match",
                              f"u/{tag}/#", "--json")[1]), 20)
    code, out, err = cli(cluster.nodes[1], tokens, "retained", "delete", f"u/{tag}/r")
    assert code == 0, err
    wait_for(lambda: not rows(cli(cluster.nodes[2], tokens, "retained", "list", "--match",
                                  f"u/{tag}/#", "--json")[1]), 20)
    sub = clients(cluster.nodes[2], f"{tag}-sub", protocol=V5).connect()
    sub.subscribe(f"u/{tag}/#", 1)
    pub.publish(f"u/{tag}/sentinel", "s", qos=1)  # the retained one would come first
    assert sub.expect_message().topic == f"u/{tag}/sentinel"


def test_a_silent_router_is_named_not_left_out(mesh: tuple[Cluster, str],
                                              clients: ClientFactory) -> None:
    cluster, tokens = mesh
    cluster.nodes[2].stop()
    code, out, err = cli(cluster.nodes[0], tokens, "clients", "list", "--json")
    assert code == 1 and "n2/0" in err, (out, err)
    code, _, err = cli(cluster.nodes[0], tokens, "clients", "kick", "nobody-anywhere")
    assert code == 1 and "503" in err and "n2/0" in err, err
