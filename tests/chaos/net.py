"""The network the chaos suite runs its nodes on, and the faults it can put into it.

* ``NetnsNet`` (root): each node in its own network namespace (``ip netns``), joined by veth
  pairs to a bridge in the suite's namespace, which also holds an address on it for the
  clients. A partition is real packet loss (the node's veth is set down: both directions,
  clients included, as a cut cable); a one-direction cut of one link is a blackhole route
  in the sending node's namespace dropping every packet it sends to the other node (TCP
  then stalls both ways on that link only, as a half-broken path does). Every node listens
  on the same ports in its own namespace. Port cuts (``cut_ports``: the Raft port alone, or
  one node's mesh traffic to one other node alone, a follower's fetch) are policy routing
  rules matching the TCP port (``ip rule ... ipproto tcp dport/sport``, kernel >= 4.17) into
  a table holding one blackhole route: no iptables needed, egress of one namespace only.
* ``ProxyNet`` (not root): loopback, every directed node pair dialling through a TCP proxy the
  suite controls (``ChaosProxy``). A partition cuts the node's mesh proxies (its clients still
  reach it: said in the run's output); a one-direction cut drops the bytes one node sends to
  the other on their link. The Raft port cannot be cut here (a pysyncobj voter is known by
  the address it announces, so nothing can proxy it): ``cut_ports`` says why not.

``close()`` removes everything either created; it is idempotent and called from ``finally``
and from the runner's signal handlers, so Ctrl-C or a failed run leaves nothing behind.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import socket
import subprocess
import threading


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int) -> int:
    """A base port with base .. base+n-1 free now."""
    for _ in range(200):
        base = _free_port()
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def can_use_netns() -> str | None:
    """None when namespaces and veth pairs are usable here; else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no ip(8): apt-get install -y iproute2"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "ip netns does not work here (no CAP_SYS_ADMIN?)"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()}")
    return res


class NetnsNet:
    """Nodes in network namespaces on one bridge (see the module docstring)."""

    mode = "netns"

    def __init__(self, n: int) -> None:
        # names and subnet apart from the other xdist worker's: the PID in both, and the OS's
        # randomness (hypothesis seeds the global ``random``, so two workers drew alike)
        rnd = random.SystemRandom()
        tag = f"{os.getpid() % 10000:04d}{rnd.randrange(100):02d}"
        self.n = n
        self.bridge = f"mqbr{tag}"
        self.ns = [f"mmqc{tag}n{i}" for i in range(n)]
        self.host_if = [f"mq{tag}h{i}" for i in range(n)]
        self.subnet = f"10.{100 + os.getpid() % 150}.{rnd.randrange(0, 250)}"
        self.cuts: set[tuple[int, int]] = set()
        # port cuts: (node, name) -> (routing table, the rule selectors added)
        self.port_cuts: dict[tuple[int, str], tuple[int, list[list[str]]]] = {}
        self._next_table = 100
        self._made_ns: list[str] = []
        self._made_links: list[str] = []

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def dial_address(self, i: int, j: int, mesh_port: int) -> tuple[str, int]:
        """Where node i's config says node j is."""
        return self.ip(j), mesh_port

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a process inside node i's namespace."""
        return ["ip", "netns", "exec", self.ns[i]]

    def setup(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made_links.append(self.bridge)
        _run("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, hif = self.ns[i], self.host_if[i]
            _run("ip", "netns", "add", ns)
            self._made_ns.append(ns)
            _run("ip", "link", "add", hif, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made_links.append(hif)
            _run("ip", "link", "set", hif, "master", self.bridge)
            _run("ip", "link", "set", hif, "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ip(i)}/24", "dev",
                 "eth0")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def partition(self, i: int) -> None:
        _run("ip", "link", "set", self.host_if[i], "down")

    def heal_partition(self, i: int) -> None:
        _run("ip", "link", "set", self.host_if[i], "up")

    def cut(self, i: int, j: int) -> None:
        """Drop every packet node i sends to node j: a blackhole route in i's namespace
        (egress only, so j's packets still reach i; works without the tc qdisc modules a
        container often lacks)."""
        _run("ip", "netns", "exec", self.ns[i], "ip", "route", "add", "blackhole",
             f"{self.ip(j)}/32")
        self.cuts.add((i, j))

    def heal_cut(self, i: int, j: int) -> None:
        if (i, j) in self.cuts:
            _run("ip", "netns", "exec", self.ns[i], "ip", "route", "del", "blackhole",
                 f"{self.ip(j)}/32", check=False)
            self.cuts.discard((i, j))

    def cut_ports(self, i: int, name: str, lo: int, hi: int, to: int | None = None) -> str | None:
        """Drop the TCP segments node i sends from or to ports ``lo``..``hi`` (to node ``to``
        only, or to every node): both directions of every connection on those ports die
        from i's side, everything else flows. ``name`` tells cuts apart for ``heal_ports``.
        Returns None (done), or why it cannot."""
        if (i, name) in self.port_cuts:
            return None
        table = self._next_table
        self._next_table += 1
        dest = f"{self.ip(to)}/32" if to is not None else f"{self.subnet}.0/24"
        ports = f"{lo}-{hi}" if hi > lo else str(lo)
        rules = [["to", dest, "ipproto", "tcp", "dport", ports],
                 ["to", dest, "ipproto", "tcp", "sport", ports]]
        ns = ["ip", "netns", "exec", self.ns[i]]
        _run(*ns, "ip", "route", "add", "blackhole", "default", "table", str(table))
        self.port_cuts[(i, name)] = (table, [])
        for sel in rules:
            _run(*ns, "ip", "rule", "add", *sel, "lookup", str(table))
            self.port_cuts[(i, name)][1].append(sel)
        return None

    def heal_ports(self, i: int, name: str) -> None:
        cut = self.port_cuts.pop((i, name), None)
        if cut is None:
            return
        table, rules = cut
        ns = ["ip", "netns", "exec", self.ns[i]]
        for sel in rules:
            _run(*ns, "ip", "rule", "del", *sel, "lookup", str(table), check=False)
        _run(*ns, "ip", "route", "flush", "table", str(table), check=False)

    def close(self) -> None:
        for i, name in list(self.port_cuts):
            self.heal_ports(i, name)
        for ns in self._made_ns:
            _run("ip", "netns", "del", ns, check=False)
        for link in reversed(self._made_links):
            _run("ip", "link", "del", link, check=False)
        self._made_ns.clear()
        self._made_links.clear()


class ChaosProxy:
    """A TCP proxy for one directed node pair (``src`` dials ``dst`` through it). ``cut``
    closes every connection and refuses new ones until ``heal``; ``drop_src_to_dst`` /
    ``drop_dst_to_src`` silently lose the bytes one side sends (a one-way packet loss)."""

    def __init__(self, target_port: int, listen_port: int = 0) -> None:
        self.target = ("127.0.0.1", target_port)
        self._l = socket.socket()
        self._l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._l.bind(("127.0.0.1", listen_port))
        self._l.listen(64)
        self.port = int(self._l.getsockname()[1])
        self.cut_all = False
        self.drop_src_to_dst = False
        self.drop_dst_to_src = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="chaos-proxy")
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self.cut_all = True
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                s.close()

    def heal(self) -> None:
        self.cut_all = False
        self.drop_src_to_dst = self.drop_dst_to_src = False

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._l.close()

    def _loop(self) -> None:
        while not self._stop:
            with self._lock:
                socks = [self._l] + [s for p in self._pairs for s in p]
            try:
                readable, _, _ = select.select(socks, [], [], 0.05)
            except (OSError, ValueError):
                continue
            for s in readable:
                if s is self._l:
                    self._accept()
                else:
                    self._pump(s)

    def _accept(self) -> None:
        try:
            client, _ = self._l.accept()
        except OSError:
            return
        if self.cut_all:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            client.close()
            return
        with self._lock:
            self._pairs.append((client, upstream))

    def _pump(self, s: socket.socket) -> None:
        with self._lock:
            pair = next((p for p in self._pairs if s in p), None)
        if pair is None:
            return
        from_src = s is pair[0]
        other = pair[1] if from_src else pair[0]
        try:
            data = s.recv(65536)
            if data:
                dropped = self.drop_src_to_dst if from_src else self.drop_dst_to_src
                if not dropped:
                    other.sendall(data)
                return
        except OSError:
            pass
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        for x in pair:
            x.close()


class ProxyNet:
    """Loopback with a ChaosProxy per directed node pair (see the module docstring)."""

    mode = "proxy"

    def __init__(self, n: int, routers: int = 1) -> None:
        self.n = n
        self.routers = routers
        # (i, j) -> one proxy per router of node j, on consecutive ports (router r of a node
        # is dialled at the node's port + r)
        self.proxies: dict[tuple[int, int], list[ChaosProxy]] = {}
        self.port_cuts: dict[tuple[int, str], int] = {}

    def ip(self, i: int) -> str:
        return "127.0.0.1"

    def prefix(self, i: int) -> list[str]:
        return []

    def setup(self) -> None:
        pass

    def dial_address(self, i: int, j: int, mesh_port: int) -> tuple[str, int]:
        proxies = self.proxies.get((i, j))
        if proxies is None:
            base = free_port_block(self.routers)
            proxies = self.proxies[(i, j)] = [ChaosProxy(mesh_port + r, base + r)
                                              for r in range(self.routers)]
        return "127.0.0.1", proxies[0].port

    def partition(self, i: int) -> None:
        for (a, b), ps in self.proxies.items():
            if i in (a, b):
                for p in ps:
                    p.cut()

    def heal_partition(self, i: int) -> None:
        for (a, b), ps in self.proxies.items():
            if i in (a, b):
                for p in ps:
                    p.heal()

    def cut(self, i: int, j: int) -> None:
        for p in self.proxies.get((i, j), []):
            p.drop_src_to_dst = True
        for p in self.proxies.get((j, i), []):
            p.drop_dst_to_src = True

    def heal_cut(self, i: int, j: int) -> None:
        for key in ((i, j), (j, i)):
            for p in self.proxies.get(key, []):
                p.heal()

    def cut_ports(self, i: int, name: str, lo: int, hi: int, to: int | None = None) -> str | None:
        """Only node i's mesh bytes to node ``to`` can be cut here (every proxy carries mesh
        links only: that is ``cut``); any other port cut returns why not."""
        if name == "mesh" and to is not None:
            self.cut(i, to)
            self.port_cuts[(i, name)] = to
            return None
        return ("the proxy network carries mesh links only; a Raft voter is dialled at the "
                "address it announces (needs network namespaces: run as root)")

    def heal_ports(self, i: int, name: str) -> None:
        to = self.port_cuts.pop((i, name), None)
        if to is not None:
            self.heal_cut(i, to)

    def close(self) -> None:
        for ps in self.proxies.values():
            for p in ps:
                p.close()
        self.proxies.clear()
