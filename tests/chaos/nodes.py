"""The cluster under test: one real ``python -m meshmq serve`` supervisor per node (inside the
node's network namespace when the net is ``NetnsNet``), with the process-level faults the
schedule applies to it: kill -9 of a router or of the whole node, SIGSTOP/SIGCONT, SIGTERM
restart, a data directory removed, a disk that fills (the data directory is a small tmpfs
when root).

Every PID the suite has seen (supervisor and routers) is remembered, and ``close()`` kills each
one still alive by its PID, and unmounts what it mounted: nothing outlives a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.helpers.broker import to_toml

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = "chaos-cluster-secret-0123456789abcdef"
MQTT_PORT, ADMIN_PORT, MESH_PORT = 1883, 9883, 7883  # netns: the same in every namespace
RAFT_PORT = 8883  # the metadata process's port (placement "raft"), clear of any mesh range


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Node:
    """One node: its config, process, PIDs and data directory."""

    def __init__(self, index: int, workdir: Path, net: Any, routers: int,
                 ports: tuple[int, int, int], tmpfs_mb: int | None, raft_port: int = 0,
                 placement: str = "static", replication_factor: int = 3) -> None:
        self.index = index
        self.id = f"n{index}"
        self.net = net
        self.routers = routers
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(exist_ok=True)
        self.host = net.ip(index)
        self.mqtt_port, self.admin_port, self.mesh_port = ports
        # cluster.placement = "raft": the node runs a metadata process (Raft voter) on this
        # port; every node's config names the real port (pysyncobj knows a voter by the
        # address it announces, so no proxy can stand in between: net.py cuts it by port)
        self.raft_port = raft_port
        self.placement = placement
        self.replication_factor = replication_factor
        self.meta_pid: int | None = None
        self.tmpfs_mb = tmpfs_mb
        self.mounted = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen_pids: set[int] = set()
        self.router_pids: list[int] = []
        self.log_path = workdir / "node.log"
        self.config_path = workdir / "meshmq.toml"
        self.stopped = False  # SIGSTOPped now

    def write_config(self, entries: list[dict[str, Any]]) -> None:
        cluster: dict[str, Any] = {
            "name": "chaos", "routers": self.routers, "secret": SECRET, "reconnect_max": 0.5,
            "link_timeout": 3.0, "nodes": entries,
            "placement": self.placement}  # "static" said explicitly: raft is the default
        if self.placement == "raft":
            cluster["replication_factor"] = self.replication_factor
        config = {
            "node": {"id": self.id, "data_dir": str(self.data_dir)},
            "listener": {"tcp": {"bind": f"{self.host}:{self.mqtt_port}"},
                         "ws": {"bind": ""}, "tls": {"bind": ""}},
            "admin": {"bind": f"{self.host}:{self.admin_port}"},
            "auth": {"allow_anonymous": True},
            "log": {"level": "info", "format": "text"},
            "mqtt": {"max_session_expiry": 0},
            "cluster": cluster,
            "commitlog": {"rules": [{"filter": "devices/{device}/#"}]},
        }
        self.config_path.write_text(to_toml(config))

    # -- processes ---------------------------------------------------------------------------
    def mount(self) -> None:
        if self.tmpfs_mb and not self.mounted:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_mb}m", "tmpfs",
                            str(self.data_dir)], check=True, capture_output=True)
            self.mounted = True

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start at {time.time():.3f} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [*self.net.prefix(self.index), sys.executable, "-m", "meshmq", "serve", "-c",
                 str(self.config_path)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=str(self.workdir),
                env=env)
        self.seen_pids.add(self.proc.pid)
        self.stopped = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def http(self, path: str, timeout: float = 5.0) -> tuple[int, bytes, dict[str, str]]:
        url = f"http://{self.host}:{self.admin_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, resp.read(), {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}

    def status(self) -> dict[str, Any] | None:
        try:
            code, body, _ = self.http("/api/v1/cluster", timeout=3)
        except OSError:
            return None
        return json.loads(body) if code == 200 else None

    def refresh_pids(self) -> list[int]:
        st = self.status()
        if st is None:
            return self.router_pids
        pids = [r["pid"] for r in st.get("routers", []) if r.get("state") == "up" and r.get("pid")]
        self.router_pids = pids
        self.seen_pids.update(pids)
        meta = st.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("pid"), int):
            self.meta_pid = meta["pid"]
            self.seen_pids.add(meta["pid"])
        return pids

    @property
    def meta_socket(self) -> str:
        """The Unix socket of this node's metadata process (placement "raft")."""
        from meshmq.metadata_proc import metadata_socket

        return metadata_socket(str(self.data_dir))

    def ready(self) -> bool:
        try:
            code, _, _ = self.http("/readyz", timeout=2)
        except OSError:
            return False
        return code == 200

    def wait_ready(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            if self.ready():
                self.refresh_pids()
                return True
            time.sleep(0.2)
        return False

    def links_up(self) -> int:
        st = self.status()
        if st is None:
            return 0
        count = 0

        def walk(obj: Any) -> None:
            nonlocal count
            if isinstance(obj, dict):
                if isinstance(obj.get("links"), list):
                    count += sum(1 for lk in obj["links"] if lk.get("state") == "up")
                for v in obj.values():
                    if isinstance(v, dict | list):
                        walk(v)
            elif isinstance(obj, list):
                for v in obj:
                    walk(v)

        walk(st)
        return count

    def _signal_all(self, sig: int) -> None:
        pids = ([self.proc.pid] if self.proc is not None else []) + list(self.router_pids)
        if self.meta_pid is not None:  # a whole node: its Raft voter too
            pids.append(self.meta_pid)
        for pid in pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def kill9(self) -> None:
        """The whole node: supervisor and every router, SIGKILL at once (a lost machine)."""
        self.refresh_pids()
        self._signal_all(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self._reap_routers()

    def _reap_routers(self) -> None:
        deadline = time.monotonic() + 10
        pids = list(self.router_pids) + ([self.meta_pid] if self.meta_pid else [])
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill_router(self, r: int) -> int | None:
        pids = self.refresh_pids()
        if r >= len(pids):
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[r], signal.SIGKILL)
        return pids[r]

    def sigstop(self) -> None:
        self.refresh_pids()
        self._signal_all(signal.SIGSTOP)
        self.stopped = True

    def sigcont(self) -> None:
        self._signal_all(signal.SIGCONT)
        self.stopped = False

    def sigterm(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        self.refresh_pids()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
        self._reap_routers()

    def wipe(self) -> None:
        """Remove the data directory's contents (the node must be down): a lost server."""
        for child in self.data_dir.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    child.unlink()

    def fill_disk(self) -> int:
        """Fill the tmpfs data directory to ENOSPC with one file; return bytes written."""
        written = 0
        fd = os.open(self.data_dir / "chaos-filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for size in (1 << 20, 4096, 1):  # down to the last byte
                block = b"\0" * size
                while True:
                    try:
                        n = os.write(fd, block)
                    except OSError:
                        break
                    if n <= 0:
                        break
                    written += n
        finally:
            os.close(fd)
        return written

    def empty_disk(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "chaos-filler").unlink()

    def close(self) -> None:
        """Stop everything of this node by PID, then unmount its tmpfs."""
        if self.stopped:
            self.sigcont()
        if self.alive:
            with contextlib.suppress(Exception):
                self.sigterm(timeout=15)
        for pid in self.seen_pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(5)
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.data_dir)], capture_output=True)
            self.mounted = False

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
