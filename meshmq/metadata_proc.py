"""The node's metadata process (``cluster/metaserver.py``), started, watched and stopped by
the node supervisor when ``cluster.placement = "raft"``.

Why beside the routers and not in one (docs/replication.md): pysyncobj's tick thread and
pickling would add tens of milliseconds to a router's event-loop lag. Why restarted like a
router: a node without its voter still serves MQTT, but the Raft group has one voter fewer
until it is back, so it comes back at once (backoff 0.5-5 s, as for routers) and catches up
from its journal and the leader. It exits by itself if the supervisor is killed -9
(``--parent-pid``), so a restarted node never finds a stale voter on its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import sys
import tempfile
import time

from cluster.settings import ClusterSettings

log = logging.getLogger("meshmq.metadata")

_BACKOFF_MIN = 0.5
_BACKOFF_MAX = 5.0


class MetadataProcess:
    def __init__(self, cluster: ClusterSettings, data_dir: str) -> None:
        self.cluster = cluster
        own = cluster.node(cluster.node_id)
        self.addr = f"{own.host}:{own.raft_port}"
        self.peers = [a for a in cluster.raft_voters() if a != self.addr]
        self.dir = os.path.join(data_dir, "metadata")
        self.socket = socket_path(self.dir)
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._stopping = False
        self._task: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    async def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        await self._spawn()
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _spawn(self) -> None:
        argv = [sys.executable, "-m", "cluster.metaserver", "--self", self.addr,
                "--data-dir", self.dir, "--socket", self.socket,
                "--parent-pid", str(os.getpid())]
        for peer in self.peers:
            argv += ["--peer", peer]
        # the controller's node map and liveness timeout (cluster/controller.py)
        for n in self.cluster.nodes:
            argv += ["--node", f"{n.id}={n.host}:{n.raft_port}"]
        argv += ["--node-timeout", repr(self.cluster.node_timeout)]
        env = dict(os.environ)
        env["MESHMQ_META_SECRET"] = self.cluster.secret.decode("utf-8", "replace")
        self.proc = await asyncio.create_subprocess_exec(*argv, env=env)
        log.info("metadata process started", extra={"pid": self.proc.pid, "raft": self.addr,
                                                     "peers": self.peers})

    async def _watch(self) -> None:
        backoff = _BACKOFF_MIN
        while not self._stopping:
            assert self.proc is not None
            started = time.monotonic()
            code = await self.proc.wait()
            if self._stopping:
                return
            log.error("metadata process exited (%s): restarting it in %.1f s; until then this "
                      "node's Raft voter is missing", _exit(code), backoff,
                      extra={"pid": self.proc.pid})
            await asyncio.sleep(backoff)
            if self._stopping:
                return
            backoff = _BACKOFF_MIN if time.monotonic() - started > 30 else \
                min(_BACKOFF_MAX, backoff * 2)
            self.restarts += 1
            await self._spawn()

    async def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                log.warning("metadata process did not stop in %.0f s: killing it", timeout,
                            extra={"pid": proc.pid})
                proc.kill()
                await proc.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def status(self, voters: bool = False) -> dict:
        """The Raft group as this node's voter sees it (leader, term, commit index), or why
        it cannot say; with ``voters``, also every voter's liveness as the Raft leader sees
        it (``MetadataServer.voters``: may ask the leader, up to about a second)."""
        out: dict = {"pid": self.pid, "raft": self.addr, "restarts": self.restarts}
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.socket), 2.0)
        except (TimeoutError, OSError) as err:
            out["error"] = f"metadata process not reachable: {err}"
            return out
        try:
            writer.write(b'{"op":"status","id":1,"voters":true}\n' if voters
                         else b'{"op":"status","id":1}\n')
            line = await asyncio.wait_for(reader.readline(), 4.0 if voters else 2.0)
            out.update(json.loads(line)["status"])
        except (TimeoutError, OSError, ValueError, KeyError) as err:
            out["error"] = f"metadata process did not answer: {err}"
        finally:
            writer.close()
        return out


def metadata_socket(node_data_dir: str) -> str:
    """The metadata process's socket for the node whose data_dir is ``node_data_dir``: what
    its routers and node admin connect to."""
    return socket_path(os.path.join(node_data_dir, "metadata"))


def socket_path(directory: str) -> str:
    """``<dir>/meta.sock``, or, when that is longer than a Unix socket path may be (108 bytes
    on Linux, with deep data directories), a socket in a private (0700) directory under the
    temp dir named by a hash of ``directory``: only this user's processes can propose."""
    path = os.path.join(directory, "meta.sock")
    if len(path.encode()) <= 100:
        return path
    digest = hashlib.sha1(os.path.abspath(directory).encode()).hexdigest()[:16]
    private = os.path.join(tempfile.gettempdir(), f"meshmq-meta-{os.getuid()}-{digest}")
    os.makedirs(private, mode=0o700, exist_ok=True)
    os.chmod(private, 0o700)
    return os.path.join(private, "meta.sock")


def _exit(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
