"""``python -m bench.cluster``: the cluster benchmarks of issue 15, ratios measured in one run.

* ``scale``: one node with ``routers = 2`` vs ``routers = 1`` (same config otherwise), QoS 0
  from many publishers to many subscribers on unlogged topics, every connection placed by the
  kernel (``SO_REUSEPORT``) as real clients would be. Aggregate msg/s, the ratio, the share of
  messages that crossed a link, and the CPU of every process (routers, supervisor, generator).
  ``--routers 1,2,4,8`` runs every N and ``--pairs`` sets the load (bench/scale.py).
* ``single`` + ``mesh``: a plain single node (no ``[cluster]``) vs 3 nodes on loopback with the
  publisher on node 0 and the subscriber on node 2 (every message crosses a link): QoS 0 1->1,
  QoS 1 on a logged topic whose owner router is node 1 (APPEND n0->n1, fsync on n1, DELIVER
  n1->n2, the PUBACK back n1->n0), and p99 publish->deliver at half of each one's QoS 0 rate.
* ``replicated``: issue 24's figures (bench/replicated.py): 3 nodes with Raft placement and
  RF 3 vs one node: QoS 1 throughput, PUBACK p99 at half load, event-loop lag p99 with the
  metadata process busy, and the time a killed leader's log takes to accept writes again.
* ``stall``: does a stalled peer slow the other links? 3 nodes, publisher on n0, subscriber on
  n2, n1's router SIGSTOPped in *both* windows, so the same processes run and the same link
  state machine turns (n0 declares the link to n1 dead after ``link_timeout`` and redials it)
  in both. Only the subscription n1 took before it was stopped differs: ``stall_idle`` (the
  baseline) has n1 subscribed to a topic nobody publishes, so n0 sends it nothing;
  ``stall_full`` has n1 subscribed to the published topic, so n0's link to n1 fills its window
  and its ``link_max_queued_bytes`` and then drops every delivery for n1 (counted in
  ``meshmq_link_dropped_total``). The ratio is therefore the cost of a full link to a stalled
  peer. (The first design compared n1 stopped with n1 running: stopping n1 freed the CPU that
  n1 used and that n0 spent sending to it, and on this 2-core box n0->n2 got *faster*, 1.21x:
  freed CPU, not a property of links.) ``--groups stall`` runs only this.

It reuses the load generator (``bench/loadgen.py``), the coordinator (``bench/runner.py``) and the
broker process handling (``bench/brokers.py``): every process is started by the bench and stopped
by PID. Results go to ``bench/results/cluster-*.json|md``; ``--update-readme`` writes the tables
into README.md's Performance section between ``<!-- bench-cluster:start/end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, replace
from pathlib import Path

from bench import loadgen as lg
from bench import report, scale
from bench.brokers import REPO, Broker, cpu_seconds, free_port, meshmq_config
from bench.hosttune import cpu_latency_request
from bench.loadgen import raise_nofile
from bench.runner import (
    DEVICE_TOPIC,
    FULL,
    QUICK,
    Mode,
    Phase,
    _cpu_stats,
    _throughput,
    run_latency,
    run_qos1,
)

SECRET = "bench-cluster-secret-0123456789abcdef"
PAIRS = 32  # scale: publisher i -> subscriber i on bench/p<i>, 32 of each (--pairs)
GROUPS = ["scale", "single", "mesh", "stall", "replicated"]
# The generator's QoS 0 window (sent - received, messages) of every QoS 0 run here: --window
QOS0_WINDOW = {"n": 2000}
# [cluster] keys set on every node (--link-window): empty means meshmq's defaults
CLUSTER_OVERRIDES: dict[str, int] = {}
# [cluster] keys set on the stall group's nodes only (--stall-queue-bytes)
STALL_OVERRIDES: dict[str, int] = {}

# workload -> (label, unit, higher is better)
WORKLOADS = {
    "scale_r1": ("1 node, routers = 1: 32 pub -> 32 sub, QoS 0", "msg/s", True),
    "scale_r2": ("1 node, routers = 2: 32 pub -> 32 sub, QoS 0", "msg/s", True),
    "single_qos0": ("single node 1 -> 1 QoS 0", "msg/s", True),
    "mesh_qos0": ("3 nodes, pub n0 -> sub n2, QoS 0", "msg/s", True),
    "single_qos1": ("single node 1 -> 1 QoS 1 (logged)", "msg/s", True),
    "mesh_qos1": ("3 nodes, pub n0 -> sub n2, QoS 1 logged, owner n1", "msg/s", True),
    "single_latency": ("single node p99 at 50% of its qos0", "ms", False),
    "mesh_latency": ("3 nodes n0 -> n2 p99 at 50% of mesh qos0", "ms", False),
    "stall_idle": ("n0 -> n2 QoS 0, n1's router SIGSTOPped, no matching subscription "
                   "(baseline: n0 sends it nothing)", "msg/s", True),
    "stall_full": ("n0 -> n2 QoS 0, n1's router SIGSTOPped holding a matching subscription "
                   "(n0's link to it full, dropping)", "msg/s", True),
    # issue 24 (bench/replicated.py): 3 nodes, placement = "raft", RF 3 vs a single node
    "replicated_single_qos1": ("single node 1 -> 1 QoS 1 (logged)", "msg/s", True),
    "replicated_qos1": ("3 nodes raft RF 3, pub+sub n0 (leader n0/0), QoS 1 logged", "msg/s",
                        True),
    "replicated_single_ack": ("single node PUBACK p99 at 50% of its QoS 1", "ms", False),
    "replicated_ack": ("3 nodes raft RF 3 PUBACK p99 at 50% of its QoS 1", "ms", False),
    "replicated_single_lag": ("single node event-loop lag p99, 100 new logs/s + 25% QoS 1",
                              "ms", False),
    "replicated_lag_idle": ("3 nodes raft n0/0 event-loop lag p99, no new logs (metadata idle) "
                            "+ 25% of single QoS 1", "ms", False),
    "replicated_lag": ("3 nodes raft n0/0 event-loop lag p99, 100 new logs/s (Raft "
                       "proposals) + 25% of single QoS 1", "ms", False),
    "replicated_failover": ("kill -9 of a log's leader node: s to the next PUBACK (<= 2 s)",
                            "s", False),
}
GROUP_OF = {w: w.split("_")[0] for w in WORKLOADS}

# (name, numerator, denominator or None for a plain value, target, direction)
TARGETS = [
    ("2 routers / 1 router, aggregate QoS 0", "scale_r2", "scale_r1", 1.5, ">="),
    ("3-node QoS 0 n0->n2 / single-node QoS 0", "mesh_qos0", "single_qos0", 0.6, ">="),
    ("3-node QoS 1 (owner n1) / single-node logged QoS 1", "mesh_qos1", "single_qos1", 0.5, ">="),
    ("3-node p99 / single-node p99 (reported, no target)", "mesh_latency", "single_latency",
     None, ""),
    ("n0->n2 with a full link to stopped n1 / with stopped n1 sent nothing", "stall_full",
     "stall_idle", 0.1, "|1-x|<"),
    ("3 nodes raft RF 3 QoS 1 / single-node QoS 1", "replicated_qos1",
     "replicated_single_qos1", 0.5, ">="),
    ("3 nodes raft RF 3 PUBACK p99 / single-node (reported, no target)", "replicated_ack",
     "replicated_single_ack", None, ""),
    ("raft event-loop lag p99 / single node (issue 24: <= single + 1 ms, see details)",
     "replicated_lag", "replicated_single_lag", None, ""),
    ("raft event-loop lag p99, 100 new logs/s / metadata idle (the Raft proposals' share)",
     "replicated_lag", "replicated_lag_idle", None, ""),
]
STALL = ("stall_idle", "stall_full")
#: Seconds from the SIGSTOP to the measurement, in both stall windows: past cluster.link_timeout
#: (6 s by default), so n0 has declared the link dead and is redialling in both.
STALL_SETTLE = {"s": 8.0}  # --stall-settle
#: At most this long for n0's link to the stopped n1 to reach link_max_queued_bytes (64 MiB by
#: default: ~450k 64-byte deliveries) in stall_full; measured anyway past it, and said so.
STALL_FILL_MAX_S = 60.0


def _say(msg: str) -> None:
    print(msg, flush=True)


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def free_port_range(n: int) -> int:
    """A base port with base .. base+n-1 free now (router r of a node listens on base + r)."""
    for _ in range(200):
        base = free_port()
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base + 1, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


# ------------------------------------------------------------------------------------ the cluster


class MeshNode(Broker):
    """One ``meshmq serve`` with a ``[cluster]`` section: the node's supervisor (by PID)."""

    def __init__(self, node_id: str, cluster_toml) -> None:
        super().__init__("meshmq")
        self.node_id = node_id
        self.cluster_toml = cluster_toml  # () -> the [cluster] tables
        self.admin_port = 0

    def _command(self, tmp: Path) -> list[str]:
        self.port = free_port()
        self.admin_port = free_port()
        data = tmp / "data"
        data.mkdir()
        text = meshmq_config(str(data), self.port, self.admin_port)
        text = text.replace("[node]\n", f'[node]\nid = "{self.node_id}"\n', 1)
        cfg = tmp / "meshmq.toml"
        cfg.write_text(text + self.cluster_toml())
        return [sys.executable, "-m", "meshmq", "serve", "-c", str(cfg)]

    def dropped(self, timeout: float = 5.0) -> dict[str, float]:
        """meshmq_messages_dropped_total per reason, summed over the node's routers (the
        supervisor's /metrics carries every router's): for a stalled run's report."""
        url = f"http://127.0.0.1:{self.admin_port}/metrics"
        out: dict[str, float] = {}
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
            for line in r.read().decode().splitlines():
                if line.startswith("meshmq_messages_dropped_total{"):
                    reason = line.split('reason="', 1)[1].split('"', 1)[0]
                    out[reason] = out.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
                elif line.startswith(("meshmq_messages_received_total",
                                      "meshmq_messages_sent_total")):
                    # PUBLISHes the routers took from clients / wrote to clients: a stall
                    # with these moving is the generator's, with these still the broker's
                    key = "_in" if "received" in line.split(" ", 1)[0] else "_out"
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def status(self, timeout: float = 5.0) -> dict:
        url = f"http://127.0.0.1:{self.admin_port}/api/v1/cluster"
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
            return json.loads(r.read())


class Cluster:
    """N nodes x R routers on loopback; quacks like ``Broker`` for ``runner.Phase``."""

    name = "meshmq-cluster"
    spawn_together = False  # Raft placement: a node is ready only with a majority up

    def __init__(self, nodes: int, routers: int, overrides: dict[str, int] | None = None
                 ) -> None:
        self.routers = routers
        self.overrides = {**CLUSTER_OVERRIDES, **(overrides or {})}
        self.mesh_ports = [free_port_range(routers) for _ in range(nodes)]
        self.nodes = [MeshNode(f"n{i}", self._toml_fn(i)) for i in range(nodes)]
        self.procs: dict[str, int] = {}  # "n0" (supervisor), "n0/1" (router) -> PID

    def _toml_fn(self, i: int):
        def toml() -> str:
            # The mesh bench measures the link and routing path against its earlier figures:
            # the hash placement, said explicitly since raft is the default (bench/replicated.py
            # measures Raft placement with replication).
            lines = ["", "[cluster]", 'name = "bench"', f"routers = {self.routers}",
                     f'secret = "{SECRET}"', 'placement = "static"']
            lines += [f"{k} = {v}" for k, v in self.overrides.items()]
            if len(self.mesh_ports) == 1:  # the one-host shorthand: N routers on one node
                lines.append(f"port = {self.mesh_ports[0]}")
            else:
                for j, port in enumerate(self.mesh_ports):
                    lines += ["", "[[cluster.nodes]]", f'id = "n{j}"', 'host = "127.0.0.1"',
                              f"port = {port}"]
            return "\n".join(lines) + "\n"
        return toml

    # -- Broker's interface (Phase, _measure) ----------------------------------------------
    @property
    def port(self) -> int:
        return self.nodes[0].port

    def alive(self) -> bool:
        return all(n.alive() for n in self.nodes)

    def log_tail(self, n: int = 3) -> str:
        return " || ".join(f"n{i}: {node.log_tail(n)}" for i, node in enumerate(self.nodes))

    def cpu_seconds(self) -> float:
        return sum(n.cpu_seconds() for n in self.nodes)

    def cpu_by_process(self) -> dict[str, float]:
        return {name: cpu_seconds([pid]) for name, pid in self.procs.items()}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Cluster:
        if self.spawn_together:
            # every node started before any is waited for: under Raft placement a node answers
            # CONNECT only once its session claim commits, which needs a majority of the nodes
            # up (cluster/sessionreg.py); their ports are all taken before the first spawn
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                node.wait_ready(timeout)
        else:  # one at a time: each picks its free ports after the previous one bound its own
            for node in self.nodes:
                node.start(timeout=timeout)
        deadline = time.monotonic() + timeout
        want = len(self.nodes) * self.routers - 1
        while True:
            try:
                if self._all_up(want):
                    return self
            except OSError:
                pass
            if not self.alive():
                raise RuntimeError(f"a node exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster links not all up within {timeout:.0f}s")
            time.sleep(0.1)

    def _all_up(self, want: int) -> bool:
        procs = {}
        for i, node in enumerate(self.nodes):
            st = node.status()
            procs[f"n{i}"] = node.proc.pid
            for r in st.get("routers", []):
                if r.get("state") != "up":
                    return False
                procs[r["router"]] = r["pid"]
                # "mesh" is None while the router does not answer the node's status in time
                # (a busy box): not up yet, asked again
                ups = [lk for lk in (r.get("mesh") or {}).get("links", []) if lk["state"] == "up"]
                if len(ups) < want:
                    return False
        self.procs = procs
        return True

    def stop(self) -> None:
        for name, pid in self.procs.items():  # a SIGSTOPped router must be able to drain
            if "/" in name:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
        for node in self.nodes:  # SIGTERM, then SIGKILL to its whole process tree, by PID
            node.stop()

    # -- observation -------------------------------------------------------------------------
    def links(self, nodes: list[int] | None = None) -> dict[str, dict]:
        """Every link of every router of the given nodes: "n0/0->n2/0" -> its status."""
        out = {}
        for i in nodes if nodes is not None else range(len(self.nodes)):
            for r in self.nodes[i].status().get("routers", []):
                for lk in r.get("mesh", {}).get("links", []):
                    out[f"{r['router']}->{lk['peer']}"] = lk
        return out


def drain_links(cl: Cluster, timeout: float = 10.0) -> bool:
    """Between runs on one cluster: until no link holds queued or unacknowledged entries, so a
    run does not start with the previous run's backlog still crossing."""
    return _links_until(cl, lambda links: all(lk["queued"] == 0 and lk["unacked"] == 0
                                              for lk in links.values()), timeout, 0.1)


def _links_until(cl: Cluster, done, timeout: float, step: float) -> bool:
    """Poll every link's status until ``done(links)`` (False at ``timeout``; a node that does
    not answer this time is asked again)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            if done(cl.links()):
                return True
        time.sleep(step)
    return False


def wait_routes(cl: Cluster, filters: int, timeout: float = 15.0) -> bool:
    """Until every router knows every other router's subscriptions (each link's ``routes_in``
    summed: ``filters`` x (routers - 1)). A QoS 0 publish that reaches a router before the
    route does is not delivered (at most once), and the generator's window counts it as in
    flight for ever: with 8 routers a fixed 0.5 s was once too short, and the run stalled
    ("nothing delivered during the measurement window"). Gives up at ``timeout`` (the run
    then shows what it shows)."""
    want = filters * (len(cl.nodes) * cl.routers - 1)
    return _links_until(cl, lambda links: sum(lk.get("routes_in", 0)
                                              for lk in links.values()) >= want, timeout, 0.05)


def _dropped(cl: Cluster) -> dict[str, float] | str:
    try:
        out: dict[str, float] = {}
        for node in cl.nodes:
            for reason, n in node.dropped().items():
                out[reason] = out.get(reason, 0.0) + n
        return out
    except OSError as err:
        return f"unreadable: {err}"


def link_summary(links: dict[str, dict]) -> dict[str, int]:
    """What every link of the cluster holds and dropped, summed: a stalled run says whether
    links were down, full or dropping (the generator's QoS 0 window never gets back what a
    link or a congested subscriber dropped)."""
    keys = ("queued", "unacked", "dropped_full", "dropped_reconnect", "routes_in")
    out = {k: sum(lk.get(k, 0) or 0 for lk in links.values()) for k in keys}
    out["links"] = len(links)
    out["links_up"] = sum(1 for lk in links.values() if lk.get("state") == "up")
    return out


def _msgs_out(links: dict[str, dict]) -> int:
    return sum(lk.get("msgs_out", 0) for lk in links.values())


# -------------------------------------------------------------------------------------- workloads


def run_pairs(cl: Cluster, mode: Mode, pairs: int = PAIRS) -> dict:
    """``pairs`` publishers (bench/p<i>) -> ``pairs`` subscribers (one filter each), QoS 0, all
    connecting to the node's one MQTT port: the kernel places each connection on a router."""
    topics = [f"bench/p{i:03d}" for i in range(pairs)]
    ph = Phase(cl, mode, "pr")
    try:
        # one publisher process per 32 pairs, each with two subscriber processes and its own
        # window over their counts (bench/scale.py): 32 pairs is the historic 1 + 2 processes
        for a, b in scale.generator_shape(pairs):
            group = topics[a:b]
            half = max(1, len(group) // 2)
            recv_slots = [ph.add("sub", n=len(chunk), filters=chunk, filter=chunk[0],
                                 topic=chunk[0], qos=0, payload_len=64) + lg.RECV
                          for chunk in (group[:half], group[half:]) if chunk]
            ph.add("pub0", topics=group, payload_len=64, window=2 * QOS0_WINDOW["n"], batch=16,
                   recv_slots=recv_slots, fanout=1)
        ph.start()
        why = ph.wait_ready(mode.ready_timeout)
        if why:
            return {"status": "failed", "error": why}
        routes_ready = wait_routes(cl, pairs)  # (was a fixed 0.5 s: see wait_routes)
        links0, recv0 = _msgs_out(cl.links()), ph.total(lg.RECV, ("sub",))
        res = _measure_rate(ph, lambda: ph.total(lg.RECV, ("sub",)), mode.warmup, mode.duration)
        links1, recv1 = _msgs_out(cl.links()), ph.total(lg.RECV, ("sub",))
        if isinstance(res, str):
            # where the messages stopped: never sent (the generator), or sent and never
            # delivered (the broker)
            return {"status": "stalled" if res.startswith("stalled") else "failed",
                    "error": res, "routes_ready": routes_ready,
                    "links": link_summary(cl.links()), "dropped": _dropped(cl),
                    "sent": ph.total(lg.SENT, ("pub0",)), "received": recv1,
                    "generator_errors": ph.total(lg.ERR, ("pub0", "sub")),
                    "workers": [w for w in ph.worker_states()
                                if w["ready"] != 1 or not w["alive"] or w["error"]]}
        failed = ph.lost_workers()
        if failed:
            # a generator process that died mid-run (a connection the broker closed: two
            # publishers once shared client ids, and each takeover killed one) leaves a
            # rate of the survivors: not a measurement of the asked pairs
            return {"status": "failed", "error": f"{len(failed)} generator worker(s) failed "
                    "during the run", "workers": ph.worker_states(wait=0.5)}
        share = (links1 - links0) / max(1, recv1 - recv0)
        return {**res, "crossed_link_share": round(share, 3), "pairs": pairs,
                "routes_ready": routes_ready}
    finally:
        ph.stop()


def _measure_rate(ph: Phase, counter, warmup: float, duration: float, go: bool = True):
    """Warm up, then the counter's rate over ``duration`` with the CPU of every process."""
    if go:
        ph.go()
    end = time.monotonic() + warmup
    while time.monotonic() < end:
        if not ph.broker.alive():
            return f"broker died: {ph.broker.log_tail()}"
        time.sleep(0.02)
    s0, c0 = ph.snapshot({}), counter()
    time.sleep(duration)
    s1, c1 = ph.snapshot({}), counter()
    if not ph.broker.alive():
        return f"broker died: {ph.broker.log_tail()}"
    if c1 == c0:
        return "stalled: nothing delivered during the measurement window"
    rate = (c1 - c0) / (s1["t"] - s0["t"])
    return {"status": "ok", "value": rate, **_cpu_stats(s0, s1), "loadavg": loadavg()}


def device_owned_by(cl: Cluster, router: str) -> str:
    from cluster.placement import Placement
    from cluster.settings import router_sort_key

    rids = sorted((f"n{i}/{r}" for i in range(len(cl.nodes)) for r in range(cl.routers)),
                  key=router_sort_key)
    placement = Placement(rids)
    return next(f"bench-{k:04d}" for k in range(100_000)
                if placement.leader_of(f"bench-{k:04d}").router == router)


def run_mesh(cl: Cluster, mode: Mode) -> dict[str, dict]:
    n0, n2 = cl.nodes[0].port, cl.nodes[2].port
    out: dict[str, dict] = {}
    links0 = cl.links()
    q0 = _throughput(cl, mode, "m0", qos=0, topics=["bench/0"], sub_filter="bench/0",
                     sub_topic="bench/0", pub_port=n0, sub_port=n2, window=QOS0_WINDOW["n"])
    out["mesh_qos0"] = _crossed(cl, links0, q0)
    drain_links(cl)
    device = device_owned_by(cl, "n1/0")
    topic = DEVICE_TOPIC.replace("bench-0001", device)
    links0 = cl.links()
    q1 = _throughput(cl, mode, "m1", qos=1, topics=[topic], sub_filter=topic, sub_topic=topic,
                     window=1000, pub_port=n0, sub_port=n2)
    out["mesh_qos1"] = {**_crossed(cl, links0, q1), "device": device, "owner": "n1/0"}
    rate = q0.get("value") if q0.get("status") == "ok" else None
    drain_links(cl)
    with cpu_latency_request(0) as held:
        lat = run_latency(cl, mode, {"qos0": rate, "sub_port": n2})
    out["mesh_latency"] = {**lat, "cpu_latency_qos": held, "loadavg": loadavg()}
    return out


def _crossed(cl: Cluster, links0: dict, res: dict) -> dict:
    """Messages that crossed each link during a run (whole run, warm-up included)."""
    links1 = cl.links()
    moved = {k: lk["msgs_out"] - links0.get(k, {}).get("msgs_out", 0)
             for k, lk in links1.items()}
    return {**res, "link_msgs": {k: v for k, v in moved.items() if v}, "loadavg": loadavg()}


def run_single(mode: Mode) -> dict[str, dict]:
    out = {}
    def qos0(b: Broker, m: Mode, ctx: dict) -> dict:  # runner.run_qos0 with this run's window
        return _throughput(b, m, "q0", qos=0, topics=["bench/0"], sub_filter="bench/0",
                           sub_topic="bench/0", window=QOS0_WINDOW["n"])

    for name, fn in (("single_qos0", qos0), ("single_qos1", run_qos1)):
        b = Broker("meshmq")
        try:
            b.start()
            out[name] = {**fn(b, mode, {}), "loadavg": loadavg()}
        except RuntimeError as exc:
            out[name] = {"status": "failed", "error": str(exc)}
        finally:
            b.stop()
    b = Broker("meshmq")
    rate = out["single_qos0"].get("value") if out["single_qos0"].get("status") == "ok" else None
    try:
        b.start()
        with cpu_latency_request(0) as held:
            lat = run_latency(b, mode, {"qos0": rate})
        out["single_latency"] = {**lat, "cpu_latency_qos": held, "loadavg": loadavg()}
    except RuntimeError as exc:
        out["single_latency"] = {"status": "failed", "error": str(exc)}
    finally:
        b.stop()
    return out


def run_stall(cl: Cluster, mode: Mode) -> dict[str, dict]:
    """The baseline (stopped n1 sent nothing), then the stall (stopped n1's link full), in one
    cluster; n1 resumes in between and the links drain before the second window."""
    out = {"stall_idle": _stall_window(cl, mode, "si", full=False)}
    drain_links(cl, timeout=30.0)
    end = time.monotonic() + 10  # the idle window's filter gone from n0's routes of n1
    while cl.links([0])["n0/0->n1/0"]["routes_in"] > 0:
        if time.monotonic() > end:
            out["stall_full"] = {"status": "failed",
                                 "error": "n1's previous subscription still routed at n0"}
            return out
        time.sleep(0.05)
    out["stall_full"] = _stall_window(cl, mode, "sf", full=True)
    return out


def _stall_window(cl: Cluster, mode: Mode, tag: str, full: bool) -> dict:
    """n0 -> n2 QoS 0 with n1's router SIGSTOPped. A subscriber at n1 subscribes before the
    stop, to the published topic (``full``) or to one nobody publishes; n0 must know that
    filter before the stop, so both windows differ in nothing else. Measured from
    ``--stall-settle`` seconds after the stop, and with ``full`` not before n0's link to n1
    drops."""
    n0, n1, n2 = (n.port for n in cl.nodes)
    topic = "bench/stall"
    n1_filter = topic if full else "bench/stall-idle"
    victim = cl.procs["n1/0"]
    link = "n0/0->n1/0"
    ph = Phase(cl, mode, tag)
    stopped = False
    try:
        s2 = ph.add("sub", n=1, filter=topic, topic=topic, qos=0, payload_len=64, port=n2)
        ph.add("sub", n=1, filter=n1_filter, topic=n1_filter, qos=0, payload_len=64, port=n1)
        # the window follows n2's subscriber only: n1's gets nothing while n1 is stopped
        ph.add("pub0", topics=[topic], payload_len=64, window=QOS0_WINDOW["n"], batch=64,
               recv_slots=[s2 + lg.RECV], fanout=1, port=n0)
        ph.start(extra_time=STALL_SETTLE["s"] + STALL_FILL_MAX_S + mode.duration + 10)
        why = ph.wait_ready(mode.ready_timeout)
        if why:
            return {"status": "failed", "error": why}
        end = time.monotonic() + 10
        while cl.links([0])[link]["routes_in"] < 1:  # n1's filter known at n0
            if time.monotonic() > end:
                return {"status": "failed", "error": "n1's subscription never reached n0"}
            time.sleep(0.05)
        l0 = cl.links([0])[link]
        os.kill(victim, signal.SIGSTOP)
        stopped = True
        t_stop = time.monotonic()
        ph.go()
        filled = None
        while True:  # the same polling of n0's admin API in both windows
            time.sleep(0.25)
            if not cl.alive():
                return {"status": "failed", "error": f"a node died: {cl.log_tail()}"}
            lk = cl.links([0])[link]
            waited = time.monotonic() - t_stop
            if filled is None and lk["dropped_full"] > l0["dropped_full"]:
                filled = round(waited, 1)
            if waited >= STALL_SETTLE["s"] and (not full or filled is not None
                                             or waited >= STALL_FILL_MAX_S):
                break
        la = cl.links([0])[link]
        res = _measure_rate(ph, lambda: ph.slot(s2, lg.RECV), 0.0, mode.duration, go=False)
        lb = cl.links([0])[link]
        if isinstance(res, str):
            return {"status": "failed", "error": res}
        return {**res, "settle_s": round(time.monotonic() - t_stop - res["window_s"], 1),
                "n1_link": {"state": lb["state"], "queued": lb["queued"],
                            "queued_bytes": lb["queued_bytes"], "unacked": lb["unacked"],
                            "full_after_s": filled,
                            "dropped_in_window": lb["dropped_full"] - la["dropped_full"],
                            "dropped_total": lb["dropped_full"] - l0["dropped_full"]}}
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        ph.stop()


# --------------------------------------------------------------------------------------- the run


def _with_cluster(nodes: int, routers: int, fn, names: list[str],
                  overrides: dict[str, int] | None = None) -> dict[str, dict]:
    cl = Cluster(nodes, routers, overrides)
    try:
        cl.start()
        return fn(cl)
    except (RuntimeError, OSError) as exc:  # OSError: an admin API that did not answer
        return {w: {"status": "failed", "error": f"{type(exc).__name__}: {exc}"} for w in names}
    finally:
        cl.stop()


def _median(doc: dict, w: str) -> float | None:
    vals = [r["result"]["value"] for r in doc["runs"]
            if r["workload"] == w and r["result"].get("status") == "ok"]
    return statistics.median(vals) if vals else None


def _median_run(doc: dict, w: str) -> dict | None:
    runs = sorted((r["result"] for r in doc["runs"]
                   if r["workload"] == w and r["result"].get("status") == "ok"),
                  key=lambda r: r["value"])
    return runs[(len(runs) - 1) // 2] if runs else None


def summarize(doc: dict) -> None:
    summary = {w: _median(doc, w) for w in WORKLOADS}
    doc["summary"] = summary
    rows = []
    rounds_seen = sorted({r["round"] for r in doc["runs"]})
    ran = {r["workload"] for r in doc["runs"]}
    for name, num, den, target, how in TARGETS:
        if GROUP_OF[num] not in doc["groups"]:  # a group not run this time: no row
            continue
        if num.startswith("scale_") and not {num, den} <= ran:  # --routers without 2
            continue
        a, b = summary.get(num), summary.get(den)
        rounds = []
        for rnd in rounds_seen:
            va = [r["result"]["value"] for r in doc["runs"] if r["round"] == rnd
                  and r["workload"] == num and r["result"].get("status") == "ok"]
            vb = [r["result"]["value"] for r in doc["runs"] if r["round"] == rnd
                  and r["workload"] == den and r["result"].get("status") == "ok"]
            if va and vb:
                rounds.append(va[0] / vb[0])
        # the median of the per-round ratios (each from runs minutes apart), else of medians
        x = statistics.median(rounds) if rounds else (a / b if a and b else None)
        if x is None or target is None:
            result = "N/A" if target is not None else "-"
        elif how == ">=":
            result = "PASS" if x >= target else "FAIL"
        else:
            result = "PASS" if abs(1 - x) < target else "FAIL"
        label = ("no target" if target is None else f"target >= {target}x" if how == ">="
                 else f"target within {target * 100:.0f}%")
        rows.append({"name": name, "ratio": x, "per_round": [round(v, 3) for v in rounds],
                     "target": label, "result": result})
    doc["ratios"] = rows


def _cpu_cell(r: dict | None, w: str = "") -> str:
    if not r or "broker_cpu" not in r:
        return "-"
    if "us_per_msg" not in r and r.get("value") and WORKLOADS.get(w, ("", ""))[1] == "msg/s":
        r = {**r, "us_per_msg": r["broker_cpu"] * 1e6 / r["value"]}
    procs = r.get("broker_procs_cpu") or {}
    parts = [f"{k} {v * 100:.0f}%" for k, v in procs.items()]
    per_msg = ""
    if r.get("value") and "us_per_msg" in r:
        per_msg = f", {r['us_per_msg']:.1f} us/msg"
    return (f"broker {r['broker_cpu'] * 100:.0f}%{per_msg} "
            f"({', '.join(parts) or 'one process'}); "
            f"generator {r['gen_cpu_total'] * 100:.0f}% (busiest {r['gen_cpu_busiest'] * 100:.0f}%)"
            f"; other {r['other_cpu'] * 100:.0f}%; steal {r['steal_cpu'] * 100:.0f}%")


def _extra(w: str, r: dict | None) -> str:
    if not r:
        return ""
    bits = []
    if "crossed_link_share" in r:
        bits.append(f"{r['crossed_link_share'] * 100:.0f}% of messages crossed a link")
    if "link_msgs" in r and w != "mesh_latency":
        bits.append("links: " + ", ".join(f"{k} {v:,}" for k, v in r["link_msgs"].items()))
    if "p50_ms" in r:
        bits.append(f"p50 {r['p50_ms']:.2f} / p99 {r['p99_ms']:.2f} / p999 {r['p999_ms']:.2f} ms "
                    f"at {r['target_rate']:,.0f} msg/s")
    if "lag_p99_ms" in r:
        bits.append(f"loop lag p99 {r['lag_p99_ms']:.1f} ms over {r['samples']:,.0f} samples, "
                    f"{r.get('new_logs') or 0:,} new logs ({r.get('new_logs_acked') or 0:,} "
                    f"acked) at {r.get('offered_per_s', 0):,.0f} msg/s"
                    + (f"; {r['over_single_ms']:+.1f} ms vs single node" if "over_single_ms"
                       in r else "")
                    + (f", {r['over_idle_ms']:+.1f} ms vs metadata idle" if "over_idle_ms"
                       in r else ""))
    if w == "replicated_failover" and r.get("leader"):
        bits.append(f"killed the node of leader {r['leader']}"
                    + (f"; answered by {r['answered_by']}" if r.get("answered_by") else "")
                    + (f"; {r['sent_after_kill']:,} sent after the kill, "
                       f"{r.get('unanswered', 0):,} never acknowledged"
                       if "sent_after_kill" in r else ""))
    if "n0_links" in r:  # results of the first stall design (stall_before/stopped/after)
        bits.append("; ".join(f"{k}: {v['state']}, {v['msgs_out']:,} out, queued "
                              f"{v['queued']:,}, unacked {v['unacked']}"
                              for k, v in r["n0_links"].items()))
    if "n1_link" in r:
        v = r["n1_link"]
        full = (f"full {v['full_after_s']} s after the stop" if v["full_after_s"] is not None
                else "never full")
        bits.append(f"n0/0->n1/0: {v['state']}, queued {v['queued']:,} "
                    f"({v['queued_bytes'] / 2**20:.0f} MiB), unacked {v['unacked']:,}, {full}; "
                    f"dropped {v['dropped_in_window']:,} in the window "
                    f"({v['dropped_total']:,} since the stop); measured from "
                    f"{r['settle_s']} s after the stop")
    return "; ".join(bits)


def _us_per_msg(doc: dict, w: str) -> float | None:
    """Broker CPU per delivered message of ``w``'s median run (None: not run, or no rate)."""
    r = _median_run(doc, w)
    if not r or not r.get("value") or "broker_cpu" not in r:
        return None
    return r.get("us_per_msg") or r["broker_cpu"] * 1e6 / r["value"]


def crossing_costs(doc: dict) -> list[tuple[float, str]]:
    """What a message crossing a link costs in broker CPU on top of a local delivery (issue
    25's target: at most 4 us), from the median runs: ``scale`` (the extra CPU per message of
    2 routers over 1, divided by the share of messages that crossed) and ``mesh`` (3 nodes,
    every message crossing once, over the single node's QoS 0)."""
    out = []
    r1, r2 = _us_per_msg(doc, "scale_r1"), _us_per_msg(doc, "scale_r2")
    share = (_median_run(doc, "scale_r2") or {}).get("crossed_link_share")
    if r1 is not None and r2 is not None and share:
        out.append(((r2 - r1) / share, f"scale: ({r2:.1f} - {r1:.1f} us/msg) / "
                                       f"{share * 100:.0f}% crossed"))
    single, mesh = _us_per_msg(doc, "single_qos0"), _us_per_msg(doc, "mesh_qos0")
    if single is not None and mesh is not None:
        out.append((mesh - single, f"mesh: {mesh:.1f} (mesh_qos0) - {single:.1f} "
                                   "(single_qos0) us/msg, every message crossing once"))
    return out


def tables(doc: dict) -> list[tuple[list[str], list[list[str]]]]:
    main = []
    ran = {r["workload"] for r in doc["runs"]}
    for w, (label, unit, _) in WORKLOADS.items():
        if GROUP_OF[w] not in doc["groups"] or w not in ran:
            continue
        per = [r["result"] for r in doc["runs"] if r["workload"] == w]
        per_s = " / ".join(report.fmt(r.get("value"), unit) if r.get("status") == "ok"
                           else r.get("status", "?").upper() for r in per)
        loads = " / ".join(r.get("loadavg", "?").split()[0] for r in per)
        main.append([w, label, f"{report.fmt(doc['summary'].get(w), unit)} {unit}", per_s, loads])
    rat = [[r["name"], report.fmt(r["ratio"]), " / ".join(f"{v:.2f}" for v in r["per_round"]),
            r["target"], r["result"]] for r in doc["ratios"] if r["ratio"] is not None
           or r["result"] == "N/A"]
    cpu = [[w, _cpu_cell(_median_run(doc, w), w), _extra(w, _median_run(doc, w))]
           for w in WORKLOADS if GROUP_OF[w] in doc["groups"] and w in ran]
    cpu += [["crossing", f"{us:.1f} us/crossing", how] for us, how in crossing_costs(doc)]
    out = [(["workload", "what", "median", "per round", "load avg (1 min) per round"], main),
           (["ratio", "median", "per round", "target", "result"], rat),
           (["workload (median run)", "CPU, % of one core (us/msg: broker CPU per message)",
             "details"], cpu)]
    if "scale" in doc["groups"]:
        out.append(scale.table(doc))
    return [t for t in out if t[1]]  # no empty table (e.g. no ratio row for --routers 1,3)


def render_markdown(doc: dict) -> str:
    m = doc["meta"]
    cores = m.get("cpus") or 2  # results written before the field: the 2-core CI box
    out = [f"Measured with `python -m bench.cluster` on {m['machine']} ({m['date']}, "
           f"{'quick' if m['quick'] else 'full'} mode, {m['rounds']} round(s), median shown; "
           f"load average {m['loadavg_start']} at the start). Nodes, routers and the load "
           f"generator share the same {cores} cores.\n"]
    for head, body in tables(doc):
        out.append(report.md_table(head, body))
        out.append("")
    other = [r["result"]["other_cpu"] for r in doc["runs"] if "other_cpu" in r["result"]]
    if other and statistics.median(other) > 0.3:
        out.append(f"**A disturbed run**: other processes on the machine (not the nodes, not the "
                   f"generator) took a median {statistics.median(other) * 100:.0f}% of a core "
                   "during the measurement windows (column \"other\"), so the nodes got only "
                   "the scheduler's share of the cores: compare the us/msg figures (broker CPU "
                   "per delivered message) more than the rates, and rerun on a quiet machine.\n")
    return "\n".join(out)


def render_text(doc: dict) -> str:
    return "\n\n".join(report.text_table(h, b) for h, b in tables(doc))


README_START = "<!-- bench-cluster:start -->"
README_END = "<!-- bench-cluster:end -->"


def update_readme(markdown: str) -> None:
    """Write the tables between the cluster markers in README.md (after the single-node ones)."""
    from bench.__main__ import README_END as SINGLE_END

    readme = REPO / "README.md"
    text = readme.read_text()
    if README_START not in text:
        head, sep, tail = text.partition(SINGLE_END)
        if not sep:
            _say(f"README.md has no {SINGLE_END} marker; not updated")
            return
        text = f"{head}{sep}\n\n### Cluster\n\n{README_START}\n{README_END}{tail}"
    head, _, rest = text.partition(README_START)
    _, _, tail = rest.partition(README_END)
    readme.write_text(f"{head}{README_START}\n{markdown}{README_END}{tail}")
    _say("updated README.md (Performance, cluster)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round, 0.3 s warm-up, 1 s runs")
    ap.add_argument("--groups", default=",".join(GROUPS),
                    help=f"comma list of {','.join(GROUPS)} (default: all)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 1)")
    ap.add_argument("--duration", type=float, default=None, help="seconds measured per run")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up per run")
    ap.add_argument("--window", type=int, default=2000, metavar="N",
                    help="the generator's QoS 0 window, sent - received messages (default 2000, "
                         "as bench's qos0; the 32 pairs of 'scale' get twice it)")
    ap.add_argument("--link-window", type=int, default=None, metavar="N",
                    help="set cluster.link_window on every node (default: meshmq's default)")
    ap.add_argument("--stall-settle", type=float, default=STALL_SETTLE["s"], metavar="S",
                    help="stall: seconds from n1's SIGSTOP to the measurement in both windows "
                         "(default 8: past cluster.link_timeout, so n0 has declared the link "
                         "dead in both)")
    ap.add_argument("--stall-queue-bytes", type=int, default=None, metavar="N",
                    help="stall: cluster.link_max_queued_bytes on its nodes (default meshmq's "
                         "64 MiB; smaller fills the stopped peer's link sooner)")
    ap.add_argument("--routers", default="1,2", metavar="LIST",
                    help="scale: routers per run, e.g. 1,2,4,8 (default 1,2; 1 is always run: "
                         "every ratio is to it)")
    ap.add_argument("--pairs", type=int, default=PAIRS, metavar="N",
                    help=f"scale: publisher -> subscriber pairs (default {PAIRS}; one publisher "
                         f"process per {scale.PAIRS_PER_PUBLISHER} pairs)")
    ap.add_argument("--out", default="bench/results", help="output folder (git-ignored)")
    ap.add_argument("--markdown", metavar="RESULTS_JSON",
                    help="only print an earlier run's tables (with --update-readme: write them "
                         "into README.md)")
    ap.add_argument("--update-readme", action="store_true",
                    help="write the tables into README.md's Performance section")
    args = ap.parse_args(argv)
    bad = [g for g in args.groups.split(",") if g not in GROUPS]
    if bad:
        ap.error(f"unknown group(s) {bad}; choose from {GROUPS}")
    try:
        args.routers = scale.parse_routers(args.routers)
    except ValueError as exc:
        ap.error(f"--routers: {exc}")
    if not 2 <= args.pairs <= scale.MAX_PAIRS:
        ap.error(f"--pairs must be 2..{scale.MAX_PAIRS}")
    return args


def run(args: argparse.Namespace) -> int:
    mode = replace(QUICK if args.quick else FULL)
    if args.rounds:
        mode.rounds = args.rounds
    if args.duration:
        mode.duration = args.duration
    if args.warmup is not None:
        mode.warmup = args.warmup
    groups = [g for g in GROUPS if g in args.groups.split(",")]
    QOS0_WINDOW["n"] = args.window
    if args.link_window:
        CLUSTER_OVERRIDES["link_window"] = args.link_window
    STALL_SETTLE["s"] = args.stall_settle
    if args.stall_queue_bytes:
        STALL_OVERRIDES["link_max_queued_bytes"] = args.stall_queue_bytes
    scale.register(args.routers, args.pairs, WORKLOADS, GROUP_OF)
    raise_nofile()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    from bench.__main__ import machine_info

    info = machine_info()
    doc = {"meta": {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "quick": args.quick,
                    "rounds": mode.rounds, "mode": asdict(mode), "argv": sys.argv[1:],
                    "loadavg_start": loadavg(), "cluster_overrides": dict(CLUSTER_OVERRIDES),
                    "stall_overrides": dict(STALL_OVERRIDES),
                    "stall_settle_s": STALL_SETTLE["s"],
                    "qos0_window": QOS0_WINDOW["n"],
                    "scale_routers": args.routers, "scale_pairs": args.pairs,
                    **info,
                    "machine": f"{info['cpu'] or 'unknown CPU'}, {os.cpu_count()} cores"},
           "groups": groups, "runs": []}
    _say(f"groups: {', '.join(groups)}; rounds: {mode.rounds}; {mode.duration:g}s per run after "
         f"{mode.warmup:g}s warm-up; load average {loadavg()}")
    t_start = time.monotonic()
    interrupted = False

    def record(rnd: int, results: dict[str, dict], t0: float) -> None:
        for w, r in results.items():
            if r.get("status") == "ok" and WORKLOADS[w][1] == "msg/s" and "broker_cpu" in r:
                # broker CPU (every router and supervisor) per delivered message: what the
                # cores cost per message whatever share of them the scheduler gave the broker
                r["us_per_msg"] = round(r["broker_cpu"] * 1e6 / r["value"], 2)
            doc["runs"].append({"round": rnd, "workload": w, "result": r})
            unit = WORKLOADS[w][1]
            val = (f"{report.fmt(r['value'], unit)} {unit}" if r.get("status") == "ok"
                   else f"{r.get('status', 'failed').upper()}: {r.get('error', '')}")
            _say(f"[round {rnd + 1}/{mode.rounds}] {w:<15} {val:>16}  {_extra(w, r)}  "
                 f"| {_cpu_cell(r)} | load {r.get('loadavg', '?')}  [{time.monotonic() - t0:.0f}s]")

    try:
        for rnd in range(mode.rounds):
            if "scale" in groups:
                for routers in scale.order(args.routers, rnd):  # A/B then B/A: drift cancels
                    t0 = time.monotonic()
                    w = scale.workload(routers)
                    record(rnd, _with_cluster(
                        1, routers, lambda cl, w=w: {w: run_pairs(cl, mode, args.pairs)}, [w]),
                        t0)
            if "single" in groups:
                t0 = time.monotonic()
                record(rnd, run_single(mode), t0)
            if "mesh" in groups:
                t0 = time.monotonic()
                record(rnd, _with_cluster(3, 1, lambda cl: run_mesh(cl, mode),
                                          ["mesh_qos0", "mesh_qos1", "mesh_latency"]), t0)
            if "replicated" in groups:
                from bench.replicated import run_replicated

                t0 = time.monotonic()
                record(rnd, run_replicated(mode), t0)
            if "stall" in groups:
                t0 = time.monotonic()
                record(rnd, _with_cluster(3, 1, lambda cl: run_stall(cl, mode), list(STALL),
                                          STALL_OVERRIDES), t0)
    except KeyboardInterrupt:
        interrupted = True
        _say("\ninterrupted: every process stopped; writing partial results")
    doc["meta"]["elapsed_s"] = round(time.monotonic() - t_start, 1)
    doc["meta"]["interrupted"] = interrupted
    doc["meta"]["loadavg_end"] = loadavg()
    summarize(doc)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    report.write_json(doc, out / f"cluster-results-{stamp}.json")
    report.write_json(doc, out / "cluster-latest.json")
    md = render_markdown(doc)
    (out / "cluster-latest.md").write_text(md)
    _say("")
    _say(render_text(doc))
    _say(f"\nwrote {out}/cluster-latest.json, {out}/cluster-results-{stamp}.json, "
         f"{out}/cluster-latest.md  ({doc['meta']['elapsed_s']}s)")
    if args.update_readme and not interrupted:
        update_readme(md)
    return 130 if interrupted else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:  # with --update-readme: that run's tables into README.md
        doc = json.loads(Path(args.markdown).read_text())
        scale.register(doc["meta"].get("scale_routers") or [1, 2],
                       doc["meta"].get("scale_pairs") or PAIRS, WORKLOADS, GROUP_OF)
        md = render_markdown(doc)
        if args.update_readme:
            update_readme(md)
        else:
            sys.stdout.write(md)
        return 0

    def _term(signum, frame) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
