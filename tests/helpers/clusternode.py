"""Cluster-node processes for the tests: a supervisor (``meshmq serve`` with ``[cluster]``) on
free loopback ports, its routers' PIDs, and bare MQTT connects that need no client library.

Every router PID a test sees is remembered (``ClusterNode.seen_pids``) so teardown can kill
a router by its PID even when the supervisor was killed first: nothing outlives a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

from helpers.broker import BrokerProc, wait_for
from helpers.cluster import free_port_range

SECRET = "test-cluster-secret-0123456789"


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class ClusterNode(BrokerProc):
    """A one-node cluster with ``routers`` routers: the shorthand ``[cluster]`` (no nodes list),
    mesh ports on a free block, a secret when there is more than one router, and placement =
    "static" said explicitly (raft is the default; these tests are about the supervisor and its
    routers, without a metadata process on a derived port outside the free block)."""

    def __init__(self, workdir: Path, routers: int = 2, overrides: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.routers = routers
        self.mesh_port = free_port_range(routers)
        cluster: dict[str, Any] = {"name": "test", "routers": routers, "port": self.mesh_port,
                                   "placement": "static"}
        if routers > 1:
            cluster["secret"] = SECRET
        merged = {"cluster": cluster, **(overrides or {})}
        super().__init__(workdir, merged, **kwargs)
        self.seen_pids: set[int] = set()

    def cluster_status(self, query: str = "") -> dict[str, Any]:
        status, body = self.http_get("/api/v1/cluster" + query)
        assert status == 200, f"/api/v1/cluster answered HTTP {status}: {body[:300]}"
        return json.loads(body)

    def router_pids(self) -> list[int | None]:
        pids = [r["pid"] if r["state"] == "up" else None
                for r in self.cluster_status()["routers"]]
        self.seen_pids.update(p for p in pids if p)
        return pids

    def wait_routers_up(self, timeout: float = 20.0) -> list[int]:
        return wait_for(lambda: (lambda p: p if all(p) else None)(self.router_pids()),
                        timeout=timeout, message="every router up")

    def kill_everything(self) -> None:
        """Teardown: the supervisor (SIGTERM, then SIGKILL), then any router still alive."""
        with contextlib.suppress(Exception):
            self.stop(timeout=15)
        self.kill()
        for pid in self.seen_pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def mqtt_connect(port: int, client_id: str, timeout: float = 5.0) -> socket.socket:
    """Open an MQTT 3.1.1 connection (clean session) and return the socket after CONNACK 0."""
    cid = client_id.encode()
    variable = b"\x00\x04MQTT\x04\x02\x00\x3c"
    payload = struct.pack("!H", len(cid)) + cid
    body = variable + payload
    packet = bytes([0x10, len(body)]) + body
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(packet)
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) < 4 and time.monotonic() < deadline:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            break
        data += chunk
    if data != b"\x20\x02\x00\x00":
        sock.close()
        raise AssertionError(f"no CONNACK 0 for {client_id}: {data!r}")
    return sock


def mqtt_publish_qos1(sock: socket.socket, topic: str, payload: bytes, packet_id: int = 1,
                      timeout: float = 10.0) -> None:
    """PUBLISH at QoS 1 on a connection from ``mqtt_connect`` and wait for its PUBACK (for a
    logged topic: stored and fsynced)."""
    t = topic.encode()
    body = struct.pack("!H", len(t)) + t + struct.pack("!H", packet_id) + payload
    assert len(body) < 128, "keep test publishes short (one-byte remaining length)"
    sock.sendall(bytes([0x32, len(body)]) + body)
    sock.settimeout(timeout)
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            raise AssertionError(f"connection closed before PUBACK of {topic}")
        data += chunk
    assert data == bytes([0x40, 0x02]) + struct.pack("!H", packet_id), data
