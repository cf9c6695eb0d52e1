"""One chaos run: build the net and the cluster, start the workload, apply a seeded fault
schedule, heal, settle, read every device log through the fetch API, check the history.

``run(opts)`` returns (exit status, Result); everything it created (namespaces, bridge, tc
rules, tmpfs mounts, proxies, processes) is removed in ``finally`` and on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitlog.fetch import decode_fetch_response
from tests.chaos.checker import Result, check
from tests.chaos.faults import RaftFaults
from tests.chaos.net import NetnsNet, ProxyNet, can_use_netns, free_port_block
from tests.chaos.nodes import ADMIN_PORT, MESH_PORT, MQTT_PORT, RAFT_PORT, Node
from tests.chaos.replicas import dump_nodes, newest_snapshot, replication_missing
from tests.chaos.workload import DevicePublisher, Sub

# Fault kinds. "wipe" (a node lost with its disk) is opt-in until replication lands; "disk"
# needs root (a tmpfs data directory). The kinds of issue 24 need ``--placement raft`` (they
# find their target in the Raft records: faults.py says what each does).
RAFT_KINDS = ("kill-leader", "raft-cut", "fetch-cut", "freeze-leader", "diverge")
ALL_KINDS = ("kill-router", "kill-node", "sigstop", "partition", "cut", "disk", "sigterm",
             "wipe", *RAFT_KINDS)
DEFAULT_KINDS = ("kill-router", "kill-node", "sigstop", "partition", "cut", "disk", "sigterm")
NODE_KINDS = {"kill-router", "kill-node", "sigstop", "partition", "disk", "sigterm", "wipe",
              *RAFT_KINDS}


@dataclass
class Fault:
    at: float  # seconds after the workload started
    kind: str
    node: int
    peer: int | None
    duration: float
    router: int = 0


def make_schedule(seed: int, count: int, kinds: list[str], nodes: int, routers: int,
                  min_s: float, max_s: float, gap_s: float, overlap: bool) -> list[Fault]:
    """The same seed gives the same schedule. Without ``overlap`` faults follow one another
    (each starts ``gap_s`` after the previous one ended); with it, link cuts run on a lane of
    their own beside the node faults, so a cut often overlaps a node fault (never two node
    faults at once: a majority of the nodes stays up)."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    lanes = {"node": 0.0, "link": 0.0}
    for _ in range(count):
        kind = rng.choice(kinds)
        node = rng.randrange(nodes)
        peer = None
        if kind in ("cut", "fetch-cut"):  # fetch-cut: the pair if Raft names none
            peer = rng.choice([j for j in range(nodes) if j != node])
        duration = round(rng.uniform(min_s, max_s), 2)
        if kind == "sigterm":
            duration = 0.0  # a restart: stop gracefully, start again at once
        lane = "link" if (overlap and kind == "cut") else "node"
        at = lanes[lane] + (rng.uniform(gap_s / 2, gap_s) if overlap else gap_s)
        faults.append(Fault(round(at, 2), kind, node, peer, duration, rng.randrange(routers)))
        lanes[lane] = at + duration
        if not overlap:
            lanes["link"] = lanes["node"]
    return sorted(faults, key=lambda f: f.at)


class Run:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.dir = Path(opts.run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        why = can_use_netns() if opts.net in ("auto", "netns") else "asked for the proxy"
        if opts.net == "netns" and why:
            raise SystemExit(f"--net netns: cannot ({why})")
        self.net: Any = None
        if why is None:
            self.net = NetnsNet(opts.nodes)
            try:
                self.net.setup()
            except (RuntimeError, OSError) as exc:
                self.net.close()
                if opts.net == "netns":
                    raise SystemExit(f"--net netns: {exc}") from exc
                why = f"network namespaces failed: {exc}"
        if why is not None:
            self.net = ProxyNet(opts.nodes, opts.routers)
        self.net_note = ("network namespaces + veth/bridge, blackhole routes (real packet loss)"
                         if why is None else
                         f"loopback + TCP proxies ({why}); a partition cuts mesh links only")
        self.kinds = [k for k in opts.kinds.split(",") if k]
        if "disk" in self.kinds and self.net.mode != "netns":
            self.kinds.remove("disk")
            self.net_note += "; no disk faults (a tmpfs needs root)"
        if "raft-cut" in self.kinds and self.net.mode != "netns":
            self.kinds.remove("raft-cut")
            self.net_note += "; no Raft port cuts (a voter cannot be proxied: needs root)"
        self.replication_note = replication_missing() if opts.placement == "raft" else None
        self.nodes: list[Node] = []
        self.stop_pub = threading.Event()
        self.attempts: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.pubs: list[DevicePublisher] = []
        self.subs: list[Sub] = []
        self._closed = False
        self.t0 = 0.0
        self.raft_faults = RaftFaults(self)

    def say(self, text: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)

    # -- set-up ------------------------------------------------------------------------------
    def build(self) -> None:
        o = self.opts
        tmpfs = o.tmpfs_mb if self.net.mode == "netns" else None
        for i in range(o.nodes):
            if self.net.mode == "netns":
                ports = (MQTT_PORT, ADMIN_PORT, MESH_PORT)
                raft_port = RAFT_PORT
            else:
                ports = (free_port_block(1), free_port_block(1), free_port_block(o.routers))
                raft_port = free_port_block(1)
            self.nodes.append(Node(i, self.dir / f"n{i}", self.net, o.routers, ports, tmpfs,
                                   raft_port if o.placement == "raft" else 0, o.placement,
                                   o.replication_factor))
        for node in self.nodes:
            entries = []
            for other in self.nodes:
                if other is node:
                    host, port = node.host, node.mesh_port
                else:
                    host, port = self.net.dial_address(node.index, other.index, other.mesh_port)
                entry = {"id": other.id, "host": host, "port": port}
                if other.raft_port:
                    entry["raft_port"] = other.raft_port
                entries.append(entry)
            node.write_config(entries)
            node.mount()
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            if not node.wait_ready(90):
                raise RuntimeError(f"{node.id} did not become ready:\n{node.log_tail()}")
        self.wait_links(90)

    def wait_links(self, timeout: float) -> bool:
        want = (len(self.nodes) * self.opts.routers - 1) * self.opts.routers
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(n.links_up() >= want for n in self.nodes):
                return True
            time.sleep(0.3)
        return False

    def addresses(self) -> list[tuple[str, int]]:
        return [(n.host, n.mqtt_port) for n in self.nodes]

    def start_workload(self) -> None:
        o = self.opts
        addrs = self.addresses()
        n = len(addrs)
        devices = [f"d{i:03d}" for i in range(o.devices)]
        self.devices = devices
        kinds = [k for k in o.subscribers.split(",") if k]
        for i in range(n):
            if "persistent" in kinds:
                self.subs.append(Sub(f"persistent{i}", "persistent", "devices/#", addrs, i))
            if "live" in kinds:
                self.subs.append(Sub(f"live{i}", "live", "devices/+/t", addrs, i))
        if "wildcard" in kinds:
            self.subs.append(Sub("wildcard", "wildcard", "#", addrs, 0))
        if "group" in kinds:
            for i in range(min(2, n)):
                self.subs.append(Sub(f"group-m{i}", "group", "$share/chaos/devices/#", addrs,
                                     (i + 1) % n))
        if "replay" in kinds:
            for i, dev in enumerate(devices[:2]):
                self.subs.append(Sub(f"replay-{dev}", "replay", f"devices/{dev}/#", addrs,
                                     (i + 2) % n, device=dev))
        for s in self.subs:
            s.start()
        for s in self.subs:
            if not s.wait_subscribed(30):
                raise RuntimeError(f"subscriber {s.name} could not subscribe")
        time.sleep(1.0)  # routes of the new filters reach every router
        self.t0 = time.time()
        for i, dev in enumerate(devices):
            p = DevicePublisher(dev, addrs, i % n, o.rate, self.attempts, self.stop_pub,
                                o.ack_timeout)
            self.pubs.append(p)
            p.start()

    # -- faults ------------------------------------------------------------------------------
    def apply(self, f: Fault) -> None:
        if f.kind in RAFT_KINDS:
            self.raft_faults.resolve(f)  # its node (and peer) from the Raft records, now
        node = self.nodes[f.node]
        rec: dict[str, Any] = {"kind": f.kind, "node": f.node, "peer": f.peer,
                               "start": time.time(), "end": None, "duration": f.duration}
        self.faults.append(rec)
        what = f"{f.kind} n{f.node}" + (f"->n{f.peer}" if f.peer is not None else "")
        self.say(f"fault {len(self.faults)}: {what} for {f.duration:.1f}s")
        if f.kind == "kill-router":
            rec["router"] = f.router
            node.kill_router(f.router)
            time.sleep(f.duration)
        elif f.kind in ("kill-node", "wipe"):
            node.kill9()
            if f.kind == "wipe":
                node.wipe()
            time.sleep(f.duration)
            node.start()
            node.wait_ready(60)
        elif f.kind == "sigstop":
            node.sigstop()
            time.sleep(f.duration)
            node.sigcont()
        elif f.kind == "partition":
            self.net.partition(f.node)
            time.sleep(f.duration)
            self.net.heal_partition(f.node)
        elif f.kind == "cut":
            assert f.peer is not None
            self.net.cut(f.node, f.peer)
            time.sleep(f.duration)
            self.net.heal_cut(f.node, f.peer)
        elif f.kind == "disk":
            rec["filled_bytes"] = node.fill_disk()
            time.sleep(f.duration)
            node.empty_disk()
        elif f.kind == "sigterm":
            node.sigterm()
            node.start()
            node.wait_ready(60)
        elif f.kind in RAFT_KINDS:
            self.raft_faults.apply(f, rec)
        rec["end"] = time.time()

    def run_schedule(self, schedule: list[Fault]) -> None:
        """Each fault at its time; a node fault also waits until the previous node fault is
        over (a restart can take longer than the schedule allowed): never two at once, so a
        majority of the nodes is always up. With ``--overlap`` link cuts run beside them."""
        threads = []
        last_node_fault: threading.Thread | None = None
        for f in schedule:
            if f.kind != "cut" and last_node_fault is not None:
                last_node_fault.join()
            delay = self.t0 + f.at - time.time()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=self.apply, args=(f,), daemon=True)
            t.start()
            threads.append(t)
            if f.kind != "cut":
                last_node_fault = t
            if not self.opts.overlap:
                t.join()
        for t in threads:
            t.join()

    # -- settle and read back ------------------------------------------------------------------
    def heal_all(self) -> None:
        for node in self.nodes:
            if node.stopped:
                node.sigcont()
            node.empty_disk()
            with contextlib.suppress(Exception):
                self.net.heal_partition(node.index)
            for name in ("raft", "mesh"):
                with contextlib.suppress(Exception):
                    self.net.heal_ports(node.index, name)
            for other in self.nodes:
                if other is not node:
                    with contextlib.suppress(Exception):
                        self.net.heal_cut(node.index, other.index)
            if not node.alive:
                node.start()
        for node in self.nodes:
            node.wait_ready(60)
        if not self.wait_links(60):
            self.say("WARNING: not every mesh link came back up within 60 s")

    def settle(self, quiet_s: float = 5.0, cap_s: float = 90.0) -> None:
        """Until no subscriber has received anything for ``quiet_s`` (at most ``cap_s``)."""
        deadline = time.monotonic() + cap_s
        last = -1
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            total = sum(len(s.received) for s in self.subs)
            if total != last:
                last, quiet_since = total, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                return
            time.sleep(0.5)

    def read_logs(self) -> dict[str, list[list[Any]]]:
        out: dict[str, list[list[Any]]] = {}
        for dev in self.devices:
            out[dev] = self._read_log(dev)
        return out

    def read_replicas(self) -> dict[str, Any]:
        """The Raft records (from the voter furthest ahead), then every node stopped cleanly
        (SIGTERM: routers drain and close their stores) and every router's log read from its
        disk: the checker's replica rules (replica_rules.py) judge them."""
        snap = self._stop_watching_raft()
        if snap is None:
            self.say("WARNING: no metadata process answered: the replica rules see no logs")
        replicas = dump_nodes([(n.id, n.data_dir) for n in self.nodes])
        self.say(f"replicas: {sum(len(v) for v in replicas.values())} logs on "
                 f"{len(replicas)} routers; Raft knows {len((snap or {}).get('logs') or {})}; "
                 + (self.replication_note or "replication built: every ISR member must hold "
                    "every acked message"))
        return {"raft": snap, "replicas": replicas,
                "replication": self.replication_note is None}

    def _stop_watching_raft(self) -> dict[str, Any] | None:
        """Stop every node at once (SIGTERM) while reading the Raft records until the last
        metadata process is gone: a node stops its routers before its voter, and stopping a
        leader may make the controller elect another (a new epoch written to a replica), so
        the newest record seen, not one read before the stop, is the state the disks hold."""
        stops = [threading.Thread(target=n.sigterm, daemon=True) for n in self.nodes]
        best = newest_snapshot([n.meta_socket for n in self.nodes])
        for t in stops:
            t.start()
        while any(t.is_alive() for t in stops):
            snap = newest_snapshot([n.meta_socket for n in self.nodes])
            if snap is not None and (best is None or snap.get("index", 0) >= best.get("index", 0)):
                best = snap
            time.sleep(0.1)
        for t in stops:
            t.join()
        return best

    def _read_log(self, device: str, timeout: float = 60.0) -> list[list[Any]]:
        deadline = time.monotonic() + timeout
        node_i = 0
        while True:
            try:
                return self._page_log(self.nodes[node_i], device)
            except (OSError, RuntimeError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot read the log of {device}: {exc}") from exc
                node_i = (node_i + 1) % len(self.nodes)
                time.sleep(0.5)

    def _page_log(self, node: Node, device: str) -> list[list[Any]]:
        rows: list[list[Any]] = []
        offset = 0
        for _ in range(100_000):
            code, body, headers = node.http(
                f"/api/v1/logs/{device}/records?offset={offset}&max_records=1000", timeout=10)
            if code == 404 and offset == 0:
                return rows  # nothing ever stored for it
            if code != 200:
                raise RuntimeError(f"HTTP {code} from {node.id}: {body[:200]!r}")
            for rec in decode_fetch_response(body):
                rows.append([rec.offset, rec.topic, rec.payload.decode("utf-8", "replace"),
                             rec.timestamp_us / 1e6])
            end = int(headers["x-meshmq-end"])
            nxt = int(headers["x-meshmq-next-offset"])
            if nxt >= end:
                return rows
            if nxt <= offset:
                raise RuntimeError(f"paging {device} made no progress at {offset}")
            offset = nxt
        raise RuntimeError("paging did not finish")

    # -- the whole run -------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop_pub.set()
        for s in self.subs:
            with contextlib.suppress(Exception):
                s.close()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.close()
        with contextlib.suppress(Exception):
            self.net.close()

    def execute(self) -> tuple[int, Result]:
        o = self.opts
        kinds = self.kinds
        schedule = make_schedule(o.seed, o.faults, kinds, o.nodes, o.routers, o.min_fault_s,
                                 o.max_fault_s, o.gap_s, o.overlap)
        self.say(f"seed={o.seed} nodes={o.nodes}x{o.routers} placement={o.placement} "
                 f"devices={o.devices} "
                 f"rate={o.rate}/s kinds={','.join(kinds)} net: {self.net_note}; "
                 f"run dir {self.dir}")
        self.build()
        self.start_workload()
        time.sleep(o.warmup_s)
        self.run_schedule(schedule)
        self.say("schedule done: healing every fault, waiting for every link")
        self.heal_all()
        time.sleep(o.tail_s)  # writes flow on a healed cluster for a while
        self.stop_pub.set()
        for p in self.pubs:
            p.join(o.ack_timeout + 5)
        self.say("publishers stopped; waiting for subscribers to go quiet")
        self.settle()
        logs = self.read_logs()
        for s in self.subs:
            s.close()
        replicas = self.read_replicas() if o.placement == "raft" else {}
        history = {
            "seed": o.seed, "net": self.net.mode, "net_note": self.net_note,
            "nodes": o.nodes, "routers": o.routers, "kinds": kinds, "t0": self.t0,
            "schedule": [f.__dict__ for f in schedule],
            "faults": self.faults, "attempts": self.attempts,
            "subscribers": [s.to_json() for s in self.subs],
            "topics": {d: f"devices/{d}/t" for d in self.devices}, "log": logs,
            "placement": o.placement, **replicas,
        }
        (self.dir / "history.json").write_text(json.dumps(history))
        result = check(history)
        (self.dir / "check.json").write_text(json.dumps(result.to_json(), indent=1))
        self.say(f"history and verdict: {self.dir}/history.json, {self.dir}/check.json")
        print(result.report(), flush=True)
        return (0 if result.ok else 1), result


def run(opts: argparse.Namespace) -> tuple[int, Result | None]:
    r = Run(opts)

    def on_signal(signum: int, frame: Any) -> None:
        r.say(f"signal {signum}: removing everything the run created")
        r.close()
        raise SystemExit(130)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    try:
        return r.execute()
    finally:
        r.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for node in r.nodes:
            if node.proc is not None and node.proc.poll() is None:
                r.say(f"WARNING: {node.id} still running after close")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    p.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                   help=f"comma-separated, of {','.join(ALL_KINDS)} (wipe is opt-in)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--routers", type=int, default=1, help="routers per node")
    p.add_argument("--devices", type=int, default=30)
    p.add_argument("--rate", type=float, default=2.0, help="messages/s per device")
    p.add_argument("--subscribers", default="persistent,live,wildcard,group,replay")
    p.add_argument("--min-fault-s", type=float, default=2.0)
    p.add_argument("--max-fault-s", type=float, default=6.0)
    p.add_argument("--gap-s", type=float, default=2.0, help="quiet time between faults")
    p.add_argument("--overlap", action="store_true", help="link cuts overlap node faults")
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--tail-s", type=float, default=5.0)
    p.add_argument("--ack-timeout", type=float, default=10.0,
                   help="a PUBACK not seen in this long is an unknown outcome")
    p.add_argument("--tmpfs-mb", type=int, default=64, help="data dir size (root only)")
    p.add_argument("--net", choices=("auto", "netns", "proxy"), default="auto")
    p.add_argument("--placement", choices=("static", "raft"), default="static",
                   help="raft: device logs placed by the metadata processes (issue 24); "
                        "the replica rules run and the kinds " + ",".join(RAFT_KINDS)
                        + " are available")
    p.add_argument("--replication-factor", type=int, default=3, help="with --placement raft")
    p.add_argument("--lease-s", type=float, default=3.0,
                   help="the routers' leader lease: freeze-leader holds a leader stopped for "
                        "at least this + 2 s, diverge waits up to this + 10 s for an election")
    p.add_argument("--run-dir", default=None, help="default: $TMPDIR/meshmq-chaos/<time>-<seed>")
    return p


def finish_opts(opts: argparse.Namespace) -> argparse.Namespace:
    if opts.seed is None:
        opts.seed = random.randrange(1, 1_000_000)
    if opts.run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        opts.run_dir = str(Path(tempfile.gettempdir()) / "meshmq-chaos" / f"{stamp}-{opts.seed}")
    bad = [k for k in opts.kinds.split(",") if k and k not in ALL_KINDS]
    if bad:
        raise SystemExit(f"--kinds: unknown {bad}; known: {','.join(ALL_KINDS)}")
    if opts.nodes < 2:
        raise SystemExit("--nodes: at least 2")
    raft_only = [k for k in opts.kinds.split(",") if k in RAFT_KINDS]
    if raft_only and opts.placement != "raft":
        raise SystemExit(f"--kinds: {','.join(raft_only)} need --placement raft (their "
                         "targets come from the Raft records)")
    return opts
