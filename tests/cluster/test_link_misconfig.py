"""Misconfigured links between real nodes: refused, with one clear line naming what to fix.

The handshake logic is unit-tested in test_link_protocol.py; this checks that real processes
refuse each other, say so in their logs (rate-limited, not once per redial), and never bring
the link up."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.broker import wait_for
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("case,per_node,words", [
    ("secret", {1: {"cluster": {"secret": "another-secret-0123456789"}}}, "cluster.secret"),
    ("name", {1: {"cluster": {"name": "othermesh"}}}, "cluster.name differs"),
])
def test_a_misconfigured_peer_is_refused_with_the_key_to_fix(
        tmp_path: Path, case: str, per_node: dict, words: str) -> None:
    mesh = Cluster(tmp_path, n=2, per_node=per_node)
    try:
        mesh.start(wait_links=False)
        wait_for(lambda: all(words in node.log_text() for node in mesh.nodes), 15,
                 message=f"both nodes logging {words!r}")
        time.sleep(2.0)  # several redials later: still refused, and not one line per redial
        for i in (0, 1):
            assert all(link["state"] != "up" for link in mesh.links(i))
        lines = [ln for ln in mesh.nodes[0].log_text().splitlines() if words in ln]
        assert 1 <= len(lines) <= 6, lines
    finally:
        mesh.stop()


def test_a_router_id_missing_from_the_peers_list_is_refused(tmp_path: Path) -> None:
    """Node n1's list has a node "a0" that n1 itself lacks... from n1's side: a0 dials it
    (a0 sorts first) and n1 says a0 is not in its [[cluster.nodes]]."""
    mesh = Cluster(tmp_path, n=2)
    # node 0 calls itself "a0" and lists itself so; node 1's list still says "n0"
    entries = mesh.nodes[0].config["cluster"]["nodes"]
    entries[0]["id"] = "a0"
    mesh.nodes[0].config["node"]["id"] = "a0"
    from helpers.broker import to_toml

    mesh.nodes[0].config_path.write_text(to_toml(mesh.nodes[0].config))
    try:
        mesh.start(wait_links=False)
        wait_for(lambda: "not in this node's [[cluster.nodes]]" in mesh.nodes[1].log_text(),
                 15, message="node 1 refusing the unknown router a0/0")
        assert "a0/0" in mesh.nodes[1].log_text()
    finally:
        mesh.stop()
