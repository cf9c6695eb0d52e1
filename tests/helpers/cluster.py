"""Start a real meshmq cluster on loopback for the cluster tests: one ``meshmq serve`` per node.

Each node is a ``BrokerProc`` (its own config file, data directory, MQTT and admin ports) whose
config has a ``[cluster]`` section listing every node with a mesh base port picked free for
``routers`` consecutive ports. ``dial_via`` puts a TCP proxy between two nodes: node i's list then
gives node j's address as the proxy's (node j's own entry stays its real port).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from cluster.placement import Placement
from cluster.settings import router_sort_key
from helpers.broker import (
    _HANDED_OUT,
    BrokerProc,
    deep_merge,
    free_port,
    port_range,
    to_toml,
    wait_for,
)

SECRET = "test-cluster-secret-0123456789"


def free_port_range(n: int) -> int:
    """A port p with p .. p+n-1 all free now (router r of a node listens on base + r)."""
    for _ in range(500):
        base = free_port()
        hi = port_range()[1]
        ok = not hi or base + n <= hi  # the whole block in this worker's slice
        for p in range(base + 1, base + n) if ok else ():
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok and not any(p in _HANDED_OUT for p in range(base + 1, base + n)):
            _HANDED_OUT.update(range(base, base + n))
            return base
    raise RuntimeError("no free port range")


class Cluster:
    """N nodes of one cluster; ``nodes[i]`` is a BrokerProc (stopped by PID at teardown)."""

    def __init__(self, base: Path, n: int = 3, routers: int = 1, name: str = "testmesh",
                 overrides: dict[str, Any] | None = None,
                 per_node: dict[int, dict[str, Any]] | None = None, raft: bool = False,
                 minimal: bool = False) -> None:
        """``raft``: cluster.placement = "raft", each node with a free Raft port; else
        placement = "static" (said explicitly: raft is the default), for the tests of the
        hash placement (``owner``, ``device_owned_by``) and of the mesh without Raft.
        ``minimal``: neither ``placement`` nor any ``raft_port`` written (the defaults: Raft
        placement, each Raft port derived as port + routers, kept free here with the mesh
        ports); ``raft_ports`` then lists the derived ones."""
        self.routers = routers
        self.raft_placement = raft or minimal
        self.mesh_ports = [free_port_range(routers + minimal) for _ in range(n)]
        self.raft_ports = [free_port() for _ in range(n)] if raft else []
        if minimal:
            raft, self.raft_ports = False, [p + routers for p in self.mesh_ports]
        self.nodes: list[BrokerProc] = []
        for i in range(n):
            entries = []
            for j in range(n):
                entries.append({"id": f"n{j}", "host": "127.0.0.1", "port": self.mesh_ports[j]})
                if raft:
                    entries[-1]["raft_port"] = self.raft_ports[j]
            config = {
                "node": {"id": f"n{i}"},
                "cluster": {"name": name, "routers": routers, "secret": SECRET,
                            "reconnect_max": 0.5, "link_timeout": 3.0, "nodes": entries,
                            **({} if minimal else
                               {"placement": "raft" if raft else "static"})},
                "log": {"level": "info"},
                # Every topic is logged by default (a first-level topic group); tests name
                # unlogged topics u/... so a test about the link does not depend on which
                # router happens to own "its" topic group.
                "commitlog": {"rules": [{"filter": "devices/{device}/#"},
                                        {"filter": "u/#", "log": False}]},
            }
            config = deep_merge(config, overrides or {})
            config = deep_merge(config, (per_node or {}).get(i, {}))
            self.nodes.append(BrokerProc(base / f"n{i}", config, ws=False))

    def dial_via(self, i: int, j: int, port: int) -> None:
        """Node i reaches node j at ``port`` (a TcpProxy in front of j's mesh port); before
        start. Node j's own entry keeps its real port."""
        node = self.nodes[i]
        for entry in node.config["cluster"]["nodes"]:
            if entry["id"] == f"n{j}":
                entry["port"] = port
        node.config_path.write_text(to_toml(node.config))

    def start(self, wait_links: bool = True) -> Cluster:
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        if wait_links:
            self.wait_links_up()
        return self

    def stop(self) -> None:
        """Every node SIGTERMed and waited for in turn (SIGKILL past 10 s). Side by side was
        tried for Raft clusters (0.9 s against 1.05 s a cluster): in CI a 2-node Raft cluster
        stopped that way had a node outlive its 10 s and be killed, and its metadata process
        held the data directory the next cluster of the test reused (test_raft_placement's
        adding-a-node test: that node never became ready)."""
        for node in self.nodes:
            try:
                node.stop(timeout=10)
            except Exception:  # noqa: BLE001 - reach every process
                node.kill()

    # -- observation ------------------------------------------------------------------------
    def status(self, i: int, device: str | None = None) -> dict[str, Any]:
        path = "/api/v1/cluster" + (f"?device={device}" if device else "")
        code, body = self.nodes[i].http_get(path)
        assert code == 200, f"{path} on n{i}: HTTP {code} {body[:300]}"
        return json.loads(body)

    def links(self, i: int) -> list[dict[str, Any]]:
        """Every link of every router of node i (the status may nest routers)."""
        out: list[dict[str, Any]] = []

        def walk(obj: Any) -> None:
            if isinstance(obj, dict):
                if isinstance(obj.get("links"), list):
                    out.extend(obj["links"])
                for v in obj.values():
                    if isinstance(v, dict | list):
                        walk(v)
            elif isinstance(obj, list):
                for v in obj:
                    walk(v)

        walk(self.status(i))
        return out

    def link(self, i: int, peer_node: int) -> dict[str, Any]:
        """Node i's link to router 0 of node peer_node (routers = 1 clusters)."""
        for link in self.links(i):
            if link["peer"] == f"n{peer_node}/0":
                return link
        raise AssertionError(f"n{i} has no link to n{peer_node}/0")

    def wait_links_up(self, timeout: float = 20.0) -> None:
        want = len(self.nodes) * self.routers - 1

        def all_up() -> bool:
            for i, node in enumerate(self.nodes):
                if not node.alive:
                    return False
                ups = [lk for lk in self.links(i) if lk["state"] == "up"]
                if len(ups) < want * self.routers:  # every router of node i: want links
                    return False
            return True

        wait_for(all_up, timeout, message="every mesh link up")

    def wait_routes(self, filters_at: int, count: int = 1, timeout: float = 10.0) -> None:
        """Until every other node's links to node ``filters_at`` carry ``count`` routes."""
        def known() -> bool:
            for i in range(len(self.nodes)):
                if i == filters_at:
                    continue
                for link in self.links(i):
                    if link["peer"].startswith(f"n{filters_at}/") and link["routes_in"] < count:
                        return False
            return True

        wait_for(known, timeout, message=f"routes of n{filters_at} known to every node")

    def router_pid(self, i: int, r: int = 0) -> int:
        """The PID of router r of node i (the node's own PID is its supervisor's)."""
        for router in self.status(i)["routers"]:
            if router["index"] == r and router["state"] == "up":
                return router["pid"]
        raise AssertionError(f"router {r} of n{i} is not up")

    def node_pids(self, i: int) -> list[int]:
        """Every process of node i: its supervisor, its routers, its metadata process (Raft);
        to freeze or kill the whole node (``signal_all``)."""
        status = self.status(i)
        pids = [self.nodes[i].pid] + [r["pid"] for r in status["routers"] if r.get("pid")]
        meta = (status.get("metadata") or {}).get("pid")
        return pids + ([meta] if meta else [])

    def raft_leader(self, timeout: float = 60.0) -> int:
        """The index of the node whose metadata process leads Raft, once every live node's
        voter names the same leader (``raft=True`` clusters)."""
        found: list[int] = []

        def agreed() -> bool:
            seen = {self.status(i)["metadata"].get("leader")
                    for i, node in enumerate(self.nodes) if node.alive}
            if len(seen) != 1 or None in seen:
                return False
            addr = seen.pop()
            found[:] = [j for j, p in enumerate(self.raft_ports) if addr.endswith(f":{p}")]
            return bool(found)

        wait_for(agreed, timeout, message="the live voters agree on a Raft leader")
        return found[0]

    def wait_router_restarted(self, i: int, old_pid: int, r: int = 0,
                              timeout: float = 60.0) -> int:
        """Router r of node i is up again under a new PID (its supervisor restarted it after
        ``old_pid`` died); its PID. Acks or links can come back a few ms before the supervisor
        marks the new router up, so a test that reads the PID at once can see "not up"."""
        new: list[int] = []

        def restarted() -> bool:
            try:
                pid = self.router_pid(i, r)
            except AssertionError:  # not up yet
                return False
            new[:] = [pid]
            return pid != old_pid

        wait_for(restarted, timeout, message=f"router {r} of n{i} restarted by its supervisor")
        return new[0]

    def owner(self, device: str) -> str:
        """The owner router of a device log, as node 0's admin API reports it."""
        return self.status(0, device)["owner"]["router"]

    def device_owned_by(self, node: int, prefix: str = "dev", router: int = 0) -> str:
        """A device key whose log router ``router`` of ``node`` owns (the same rendezvous hash
        the routers use; the admin API confirms it)."""
        rids = [f"n{i}/{r}" for i in range(len(self.nodes)) for r in range(self.routers)]
        placement = Placement(sorted(rids, key=router_sort_key))
        want = f"n{node}/{router}"
        for k in range(100_000):
            device = f"{prefix}{k}"
            if placement.leader_of(device).router == want:
                assert self.owner(device) == want
                return device
        raise AssertionError("no device found")


def sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` (those already gone skipped)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
