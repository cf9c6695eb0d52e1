"""``meshmq log`` hints that know the deployment (issue 27): ``log inspect`` given a cluster
node's data directory names its routers' stores (``<data_dir>/router-<r>/log``), and a listing
the read ACL emptied says so on stderr (exit 0, as Kafka's ``kafka-topics --list`` without
Describe rights) instead of printing an empty table with no word.

Real ``meshmq serve`` processes and the real CLI (subprocesses).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.authfiles import auth_overrides
from helpers.broker import REPO_ROOT, BrokerProc
from helpers.clients import ClientFactory, unique
from helpers.clusternode import ClusterNode

pytestmark = pytest.mark.timeout(180)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "meshmq", "log", *args], text=True,
                          capture_output=True, cwd=REPO_ROOT, env=env, timeout=60)


def test_inspect_of_a_cluster_data_dir_names_the_router_stores(tmp_path: Path,
                                                               clients: ClientFactory) -> None:
    node = ClusterNode(tmp_path / "c", routers=2)
    node.start()
    try:
        c = clients(node, unique("p")).connect()
        c.publish("devices/d1/t", "x", qos=1)
        c.stop()
    finally:
        node.stop()
    data = Path(node.config["node"]["data_dir"])
    result = cli("inspect", str(data))
    assert result.returncode == 1
    assert str(data / "router-0" / "log") in result.stderr, result.stderr
    assert str(data / "router-1" / "log") in result.stderr
    assert cli("inspect", str(data / "router-0" / "log")).returncode == 0


def test_a_listing_the_acl_empties_says_why(tmp_path: Path, clients: ClientFactory) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("stranger:stranger-token-0123456789\nreader:reader-token-0123456789\n")
    acl = "topic readwrite devices/#\n\nuser reader\ntopic read devices/#\n"
    overrides = auth_overrides(tmp_path / "auth", {"alice": "pw-alice"}, acl,
                               allow_anonymous=True)
    overrides["admin"] = {"token_file": str(tokens)}
    node = BrokerProc(tmp_path / "n", overrides, ws=False).start()
    try:
        c = clients(node, unique("p")).connect()
        c.publish("devices/d1/t", "x", qos=1)
        c.stop()
        admin = f"127.0.0.1:{node.admin_port}"
        one = tmp_path / "one"
        one.write_text("stranger-token-0123456789\n")
        result = cli("list", "--admin", admin, "--token-file", str(one))
        assert result.returncode == 0
        assert "d1" not in result.stdout
        assert "read ACL hides 1 device log" in result.stderr, result.stderr
        assert "no device log is listed" in result.stderr
        one.write_text("reader-token-0123456789\n")
        result = cli("list", "--admin", admin, "--token-file", str(one))
        assert result.returncode == 0 and "d1" in result.stdout and result.stderr == ""
    finally:
        node.stop()
