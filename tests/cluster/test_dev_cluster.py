"""``meshmq dev-cluster`` and ``meshmq cluster status`` as a user runs them: real processes on
free loopback ports (the port overrides keep every test off 1883/9883/7883), every PID the test
saw killed at the end whatever happened."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.broker import REPO_ROOT, wait_for
from helpers.cluster import free_port_range
from helpers.clusternode import mqtt_connect, pid_alive

from meshmq.clustercli import render_status

pytestmark = pytest.mark.timeout(120)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _meshmq(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())


def test_dev_cluster_starts_and_stops_three_nodes(tmp_path: Path) -> None:
    mqtt, admin, mesh = free_port_range(3), free_port_range(3), free_port_range(3)
    out_path = tmp_path / "dev.out"
    seen: set[int] = set()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "meshmq", "dev-cluster", "--nodes", "3",
             "--mqtt-port", str(mqtt), "--admin-port", str(admin), "--mesh-port", str(mesh),
             "--raft-port", str(free_port_range(3)),
             "--dir", str(tmp_path / "dev")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env())
    try:
        wait_for(lambda: "Ctrl-C stops every node" in out_path.read_text() or proc.poll(),
                 timeout=90, message="dev-cluster's table")
        text = out_path.read_text()
        assert proc.poll() is None, text
        rows = {m.group(1): m for m in re.finditer(
            r"^(node-\d)\s+(\d+)\s+127\.0\.0\.1:(\d+)\s+127\.0\.0\.1:(\d+)\s+(\d+)\s+([\d,]+)",
            text, re.M)}
        assert sorted(rows) == ["node-0", "node-1", "node-2"], text
        for i in range(3):
            row = rows[f"node-{i}"]
            assert (int(row.group(3)), int(row.group(4)), int(row.group(5))) == \
                (mqtt + i, admin + i, mesh + i)
            seen.add(int(row.group(2)))
            seen.update(int(p) for p in row.group(6).split(","))
            mqtt_connect(mqtt + i, f"dev-{i}").close()
            assert (tmp_path / "dev" / f"node-{i}" / "meshmq.toml").is_file()
        assert len(seen) == 6 and all(pid_alive(p) for p in seen)

        # dev-cluster's default placement is Raft (issue 24): a device log is placed by its
        # first publish, at the router its publisher is connected to
        sock = mqtt_connect(mqtt + 1, "dev-pub")
        topic = b"devices/d1/t"
        sock.sendall(bytes([0x32, 2 + len(topic) + 2 + 1]) + len(topic).to_bytes(2, "big")
                     + topic + b"\x00\x01x")
        assert sock.recv(4) == b"\x40\x02\x00\x01"  # PUBACK: placed, stored
        sock.close()
        status = _meshmq("cluster", "status", "--admin", f"127.0.0.1:{admin + 1}",
                         "--device", "d1", "--json")
        doc = json.loads(status.stdout)
        assert doc["node"] == "node-1" and doc["cluster"] == "dev"
        assert doc["router_ids"] == ["node-0/0", "node-1/0", "node-2/0"]
        assert doc["owner"]["router"] in doc["router_ids"]

        def links_up() -> str | None:  # node-1's one router links to node-0/0 and node-2/0
            human = _meshmq("cluster", "status", "--admin", f"127.0.0.1:{admin + 1}")
            return human.stdout if human.returncode == 0 else None

        human = wait_for(links_up, timeout=30, message="node-1's links up in cluster status")
        assert "links: 2 up, 0 down" in human
        assert re.search(r"node-1/0\s+node-0/0\s+up", human), human

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "stopping every node" in out_path.read_text()
        for pid in seen:
            assert not pid_alive(pid), f"pid {pid} outlived dev-cluster"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in seen:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_dev_cluster_refuses_overlapping_ports(tmp_path: Path) -> None:
    base = free_port_range(8)
    proc = _meshmq("dev-cluster", "--nodes", "3", "--routers", "2", "--mqtt-port", str(base),
                   "--admin-port", str(base + 3), "--mesh-port", str(base + 4),
                   "--dir", str(tmp_path / "dev"))
    assert proc.returncode == 2, proc.stderr
    assert "--admin-port range" in proc.stderr and "--mesh-port range" in proc.stderr
    assert not (tmp_path / "dev").exists()  # refused before anything was written or started


def test_cluster_status_on_a_single_node_says_it_is_not_a_cluster(start_broker) -> None:
    b = start_broker(ws=False)
    proc = _meshmq("cluster", "status", "--admin", f"127.0.0.1:{b.admin_port}")
    assert proc.returncode == 1
    assert "is not a cluster node" in proc.stderr


def test_cluster_status_renders_routers_links_and_owner() -> None:
    now = time.time()
    link = {"peer": "b/0", "state": "up", "since": now - 125, "rtt_ms": 0.42, "msgs_out": 10,
            "msgs_in": 7, "bytes_out": 4096, "bytes_in": 300, "routes_in": 3, "routes_out": 2,
            "queued": 0, "window": 1024}
    doc = {"cluster": "c", "node": "a", "routers_per_node": 1, "router_ids": ["a/0", "b/0",
                                                                             "c/0"],
           "routers": [{"router": "a/0", "pid": 42, "state": "up", "up_since": now - 3700,
                        "restarts": 2, "last_exit": "killed by SIGKILL",
                        "mesh": {"router": "a/0", "local_filters": 5, "links": [
                            link, {**link, "peer": "c/0", "state": "down", "since": now - 8,
                                   "rtt_ms": None}]}}],
           "owner": {"device": "d1", "router": "c/0", "local": False}}
    out = io.StringIO()
    assert render_status(doc, out, now=now) is False  # a link is down
    text = out.getvalue()
    assert re.search(r"a/0\s+42\s+up\s+1h01m\s+2\s+killed by SIGKILL\s+5", text), text
    assert re.search(r"a/0\s+b/0\s+up\s+2m05s\s+0\.42ms\s+10/7\s+4\.0KiB/300B\s+2/3\s+0\s+1024",
                     text), text
    assert re.search(r"a/0\s+c/0\s+down\s+8s\s+-", text), text
    assert "links: 1 up, 1 down" in text
    assert "owner of device 'd1': c/0 (node c)" in text
    out = io.StringIO()
    doc["routers"][0]["mesh"]["links"].pop()
    assert render_status(doc, out, now=now) is True
