"""``meshmq dev-cluster``: a whole cluster on loopback, for trying it out and for tests.

Node *i* (from 0) is ``node-<i>``: MQTT on ``--mqtt-port`` + *i* (1883, 1884, ...), admin HTTP
on ``--admin-port`` + *i* (9883, ...), its ``--routers`` mesh ports from ``--mesh-port`` + *i* x
routers (7883, ...), its config, data and log in ``<dir>/node-<i>/`` (``./meshmq-dev/`` by
default). Each node is a real ``meshmq serve -c <dir>/node-<i>/meshmq.toml`` process, the same
supervisor and routers a production node runs; only the addresses are loopback. The configs stay
on disk: they are a working example of a cluster config, and a node can be restarted by hand
with the same command.

The cluster secret is generated once (``<dir>/cluster.secret``, mode 0600) and reused, so a
second run restarts the same cluster over the same data. Ctrl-C or SIGTERM stops every node by
its PID (SIGTERM, each drains, SIGKILL after 30 s) and exits 0. The nodes also get SIGTERM from
the kernel if this process is killed outright (``PR_SET_PDEATHSIG``), so no cluster is left
behind holding the ports.

Why the port overrides: a test (or a second dev cluster) must never bind the default ports, and
a developer may already run a broker on 1883. Every port the cluster will use (MQTT, admin and
mesh, of every node) is tried before anything is written or started: one taken port exits 2
naming it, rather than a banner, one node failing and the others running on as half a cluster.
Readiness is a node's own ``/readyz``: the answer must carry the PID of the process started
here, so another broker on the same admin port never passes for a node.

``MESHMQ_*`` variables reach every node (the README's "any key can be overridden by an
environment variable" holds here too: an ACL file, a log format, a limit), except the keys this
command sets per node (ids, data dirs, ``*.bind`` ports, ``commitlog.dir``, ``[cluster]``),
which would make every node the same; those are named at start with the reason and left out.
The passed ones are validated with each node's file before anything starts (exit 2 naming the
key, as ``meshmq serve`` would). One dev-cluster per ``--dir`` (meshmq/dirlock.py's lock on it):
a second one, on other ports, would rewrite the configs of nodes that are running (a router
restarted later reads them) before its own nodes failed on the data locks.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from meshmq.config import ENV_PREFIX, ConfigError, load_config
from meshmq.dirlock import DataDirInUse, DataDirLock
from meshmq.portcheck import bind_conflict
from meshmq.preflight import StartupError

__all__ = ["add_dev_cluster_parser", "run_dev_cluster", "DevNode", "wait_ready"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class DevNode:
    index: int
    node_id: str
    mqtt: int
    admin: int
    mesh: int
    dir: Path
    raft: int = 0  # the metadata process's Raft port (0: static placement, no Raft)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.dir / "meshmq.toml"

    @property
    def log_path(self) -> Path:
        return self.dir / "meshmq.log"


def add_dev_cluster_parser(sub: Any) -> None:
    p = sub.add_parser(
        "dev-cluster", help="run a local cluster on loopback (trying it out, tests)",
        description="Start NODES cluster nodes on 127.0.0.1: node i serves MQTT on "
        "MQTT_PORT+i and admin HTTP on ADMIN_PORT+i, with data under DIR/node-i. Prints the "
        "nodes with their ports and PIDs; Ctrl-C or SIGTERM stops them all.")
    p.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    p.add_argument("--routers", type=int, default=1, help="routers per node (default 1)")
    p.add_argument("--mqtt-port", type=int, default=1883, metavar="PORT",
                   help="MQTT port of node 0; node i uses PORT+i (default 1883)")
    p.add_argument("--admin-port", type=int, default=9883, metavar="PORT",
                   help="admin HTTP port of node 0; node i uses PORT+i (default 9883)")
    p.add_argument("--mesh-port", type=int, default=7883, metavar="PORT",
                   help="mesh base port of node 0; node i's routers use PORT+i*ROUTERS+r "
                   "(default 7883)")
    p.add_argument("--raft-port", type=int, default=6883, metavar="PORT",
                   help="Raft port of node 0's metadata process; node i uses PORT+i "
                   "(default 6883)")
    p.add_argument("--placement", choices=("raft", "static"), default="raft",
                   help="where device logs live: 'raft' (default: placed on first publish, "
                   "replicated, failing over: issue 24) or 'static' (hashed over the routers, "
                   "one copy)")
    p.add_argument("--dir", default="./meshmq-dev", metavar="DIR",
                   help="configs, data and logs (default ./meshmq-dev)")
    p.add_argument("--name", default="dev", help="cluster name (default dev)")


def _plan(args: argparse.Namespace) -> list[DevNode] | str:
    """The nodes and their ports, or a one-line usage error."""
    if not 1 <= args.nodes <= 64:
        return "--nodes must be between 1 and 64"
    if not 1 <= args.routers <= 64:
        return "--routers must be between 1 and 64"
    ranges = {"--mqtt-port": (args.mqtt_port, args.nodes),
              "--admin-port": (args.admin_port, args.nodes),
              "--mesh-port": (args.mesh_port, args.nodes * args.routers)}
    raft = args.placement == "raft"
    if raft:
        ranges["--raft-port"] = (args.raft_port, args.nodes)
    for flag, (start, count) in ranges.items():
        if start < 1 or start + count - 1 > 65535:
            return f"{flag} {start}: ports {start}-{start + count - 1} are outside 1-65535"
    flags = list(ranges)
    for i, a in enumerate(flags):
        for b in flags[i + 1:]:
            (sa, ca), (sb, cb) = ranges[a], ranges[b]
            if sa < sb + cb and sb < sa + ca:
                return (f"{a} range {sa}-{sa + ca - 1} overlaps {b} range {sb}-{sb + cb - 1}: "
                        "pick ports further apart")
    root = Path(args.dir).resolve()
    return [DevNode(i, f"node-{i}", args.mqtt_port + i, args.admin_port + i,
                     args.mesh_port + i * args.routers, root / f"node-{i}",
                     args.raft_port + i if raft else 0)
            for i in range(args.nodes)]


def _taken_ports(nodes: list[DevNode], routers: int) -> list[str]:
    """Every port the cluster will bind that cannot be bound now, one line each (empty: all
    free; meshmq/portcheck.py says why a plain bind is the test)."""
    wanted: list[tuple[int, str]] = []
    for n in nodes:
        wanted += [(n.mqtt, f"{n.node_id} MQTT, --mqtt-port"),
                   (n.admin, f"{n.node_id} admin HTTP, --admin-port")]
        wanted += [(n.mesh + r, f"{n.node_id} router {r} mesh, --mesh-port")
                   for r in range(routers)]
        if n.raft:
            wanted.append((n.raft, f"{n.node_id} Raft, --raft-port"))
    taken = []
    for port, what in wanted:
        why = bind_conflict("127.0.0.1", port)
        if why is not None:
            taken.append(f"port {port} ({what}) on 127.0.0.1: {why}")
    return taken


# Keys dev-cluster writes per node: one value from the environment would make every node the
# same node, share one directory, or share one port between nodes (SO_REUSEPORT would let it).
_PER_NODE = {
    "node.id": "each node is node-<i>",
    "node.data_dir": "each node's data is <--dir>/node-<i>/data",
    "commitlog.dir": "one directory for every node's logs; use --dir",
    "listener.tcp.bind": "each node has its own port; use --mqtt-port",
    "listener.tls.bind": "every node would get the same port",
    "listener.ws.bind": "every node would get the same port",
    "admin.bind": "each node has its own port; use --admin-port",
}


def _split_env(environ: dict[str, str]) -> tuple[dict[str, str], list[str], list[str]]:
    """(the nodes' environment, the MESHMQ_ names passed, "NAME (key): why" for those left
    out). A name that is no key at all is passed: the nodes' config check names it (exit 2)."""
    env, passed, ignored = {}, [], []
    for name, value in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            env[name] = value
            continue
        key = ".".join(name[len(ENV_PREFIX):].lower().split("__"))
        why = _PER_NODE.get(key)
        if why is None and key.startswith("cluster."):
            why = "dev-cluster writes [cluster] itself (--name, --routers, --mesh-port)"
        if why is None:
            env[name] = value
            passed.append(name)
        else:
            ignored.append(f"{name} ({key}): {why}")
    return env, sorted(passed), sorted(ignored)


def _secret_file(root: Path) -> Path:
    path = root / "cluster.secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
    return path


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def _write_config(node: DevNode, nodes: list[DevNode], name: str, routers: int,
                  secret: Path) -> None:
    lines = [
        f"# Written by `meshmq dev-cluster`: node {node.index} of a loopback cluster.",
        "[node]", f"id = {_toml_str(node.node_id)}",
        f"data_dir = {_toml_str(str(node.dir / 'data'))}", "",
        "[listener.tcp]", f'bind = "127.0.0.1:{node.mqtt}"', "",
        "[admin]", f'bind = "127.0.0.1:{node.admin}"', "",
        "[cluster]", f"name = {_toml_str(name)}", f"routers = {routers}",
        f"secret_file = {_toml_str(str(secret))}",
    ]
    # said either way (raft is also the config's default), so the file shows what it runs
    lines += ['placement = "raft"' if node.raft else 'placement = "static"', ""]
    for n in nodes:
        lines += ["[[cluster.nodes]]", f"id = {_toml_str(n.node_id)}", 'host = "127.0.0.1"',
                  f"port = {n.mesh}"] + ([f"raft_port = {n.raft}"] if n.raft else []) + [""]
    node.dir.mkdir(parents=True, exist_ok=True)
    node.config_path.write_text("\n".join(lines))


def _die_with_parent(parent: int) -> None:
    """preexec_fn of each node: SIGTERM from the kernel when dev-cluster dies. The kernel only
    signals a death after the prctl, so a parent already gone (not ``parent`` any more, also
    under a subreaper) means exit now."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _get_json(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class _Stop(Exception):
    pass


def run_dev_cluster(args: argparse.Namespace, out: TextIO | None = None,
                    err: TextIO | None = None) -> int:
    """Start the cluster, print it, wait for Ctrl-C/SIGTERM, stop it. The exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    plan = _plan(args)
    if isinstance(plan, str):
        print(f"meshmq dev-cluster: {plan}", file=err)
        return 2
    nodes = plan
    taken = _taken_ports(nodes, args.routers)
    if taken:
        for line in taken:
            print(f"meshmq dev-cluster: {line}", file=err)
        print("meshmq dev-cluster: nothing started: stop what listens there, or move the "
              "cluster with --mqtt-port, --admin-port and --mesh-port", file=err)
        return 2
    env, passed, ignored = _split_env(dict(os.environ))
    for line in ignored:
        print(f"meshmq dev-cluster: ignoring {line}", file=err)
    if passed:
        print(f"meshmq dev-cluster: passing to every node: {', '.join(passed)}", file=out)
    root = Path(args.dir).resolve()
    try:  # one dev-cluster per --dir: a second would rewrite the configs of running nodes
        dirlock = DataDirLock.acquire(str(root))
    except (DataDirInUse, StartupError) as exc:
        print(f"meshmq dev-cluster: --dir {exc}; nothing started", file=err)
        return 2
    try:
        return _run_in(root, nodes, env, args, out, err)
    finally:
        dirlock.release()


def _run_in(root: Path, nodes: list[DevNode], env: dict[str, str], args: argparse.Namespace,
            out: TextIO, err: TextIO) -> int:
    """The rest of run_dev_cluster, with ``root`` locked: configs, start, wait, stop."""
    secret = _secret_file(root)
    for node in nodes:
        _write_config(node, nodes, args.name, args.routers, secret)
    try:  # the nodes' own check, before any starts: a bad MESHMQ_ value stops all of them
        load_config(str(nodes[0].config_path), env)
    except ConfigError as exc:
        print(f"meshmq dev-cluster: {exc}; nothing started", file=err)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        raise _Stop

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        for node in nodes:
            with open(node.log_path, "ab") as log:
                node.proc = subprocess.Popen(
                    [sys.executable, "-m", "meshmq", "serve", "-c", str(node.config_path)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                    start_new_session=True,
                    preexec_fn=functools.partial(_die_with_parent, os.getpid()))
        failed = wait_ready(nodes, err)
        if failed:
            return 1
        _print_table(nodes, args, root, out)
        while True:
            for node in nodes:
                assert node.proc is not None
                if node.proc.returncode is None and node.proc.poll() is not None:
                    print(f"meshmq dev-cluster: {node.node_id} (pid {node.proc.pid}) exited "
                          f"with code {node.proc.returncode}; see {node.log_path}", file=err)
            time.sleep(0.5)
    except _Stop:
        print("meshmq dev-cluster: stopping every node", file=out, flush=True)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        code = max(code, _stop(nodes, err))
    return code


def wait_ready(nodes: list[DevNode], err: TextIO, timeout: float = READY_TIMEOUT_S) -> bool:
    """Wait for every node's /readyz; on a node that exits or times out, or a ready answer from
    a process that is not the node (another broker on its admin port), say so (True)."""
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending:
        for node in list(pending):
            assert node.proc is not None
            if node.proc.poll() is not None:
                print(f"meshmq dev-cluster: {node.node_id} exited with code "
                      f"{node.proc.returncode} before it was ready; {node.log_path}:\n"
                      f"{_tail(node.log_path)}", file=err)
                return True
            status, doc = _get_json(node.admin, "/readyz")
            if status != 200:
                continue
            pid = doc.get("pid") if isinstance(doc, dict) else None
            if pid != node.proc.pid:
                print(f"meshmq dev-cluster: 127.0.0.1:{node.admin} answers /readyz for "
                      f"{'pid ' + str(pid) if pid else 'a process that names no pid'}, not "
                      f"{node.node_id} (pid {node.proc.pid}): another process holds "
                      f"{node.node_id}'s admin port", file=err)
                return True
            pending.remove(node)
        if pending and time.monotonic() > deadline:
            print("meshmq dev-cluster: not ready within "
                  f"{timeout:.0f}s: " + ", ".join(n.node_id for n in pending), file=err)
            return True
        time.sleep(0.1)
    return False


def _print_table(nodes: list[DevNode], args: argparse.Namespace, root: Path,
                 out: TextIO) -> None:
    print(f"meshmq dev-cluster {args.name!r}: {len(nodes)} nodes x {args.routers} router(s) on "
          f"127.0.0.1, data in {root}", file=out)
    header = ("NODE", "PID", "MQTT", "ADMIN", "MESH PORTS", "ROUTER PIDS", "LOG")
    rows = [header]
    for node in nodes:
        assert node.proc is not None
        status, doc = _get_json(node.admin, "/api/v1/cluster")
        rpids = ",".join(str(r.get("pid")) for r in doc.get("routers", [])) \
            if status == 200 and isinstance(doc, dict) else "?"
        last = node.mesh + args.routers - 1
        mesh = str(node.mesh) if last == node.mesh else f"{node.mesh}-{last}"
        rows.append((node.node_id, str(node.proc.pid), f"127.0.0.1:{node.mqtt}",
                     f"127.0.0.1:{node.admin}", mesh, rpids, str(node.log_path)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
    first, last_node = nodes[0], nodes[-1]
    print(f"\ntry:  mosquitto_sub -p {last_node.mqtt} -t 'devices/#' -v &\n"
          f"      mosquitto_pub -p {first.mqtt} -t devices/d1/temp -m 21.5 -q 1\n"
          f"      meshmq cluster status --admin 127.0.0.1:{first.admin}\n"
          "Ctrl-C stops every node.", file=out, flush=True)


def _stop(nodes: list[DevNode], err: TextIO) -> int:
    """SIGTERM every node by PID, wait for the drains, SIGKILL what is left. 0 if all drained."""
    live = [n for n in nodes if n.proc is not None and n.proc.poll() is None]
    for node in live:
        assert node.proc is not None
        try:
            node.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    code = 0
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for node in live:
        assert node.proc is not None
        try:
            node.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"meshmq dev-cluster: {node.node_id} (pid {node.proc.pid}) did not stop in "
                  f"{STOP_TIMEOUT_S:.0f}s: killed", file=err)
            node.proc.kill()
            node.proc.wait(5)
            code = 1
    return code
