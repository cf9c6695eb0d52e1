"""One router process of a cluster node: ``meshmq serve -c FILE --router R``, started by the
node's supervisor (``meshmq/supervisor.py``, wired in ``meshmq/cluster_node.py``), never by hand.

A router is today's ``Node`` with four differences, all made here so ``Node`` stays the single
node it was:

* **Its own state directory**, ``<node.data_dir>/router-<r>/`` (its commit log in ``log/`` under
  it, or ``<commitlog.dir>/router-<r>/`` when ``commitlog.dir`` is set): each router owns the
  device logs hashed to it, and two processes must never open one store.
* **Its admin HTTP on loopback, on a port the kernel picks**, announced to the supervisor in
  ``router-<r>/router.json`` (PID and port, written atomically once the router serves). The
  operator's endpoint is the supervisor's on ``admin.bind``, which merges and proxies these; a
  router's own port is an internal detail, so it speaks plain HTTP on 127.0.0.1.
* **Its MQTT listeners share the node's ports** (``ListenerSettings.reuse_port``, set by the
  config loader for a cluster node).
* **It dies with the supervisor** (``PR_SET_PDEATHSIG``): a supervisor killed with -9 must not
  leave routers holding the ports and the stores. The kernel only signals a death that happens
  after the router asked, so the router then checks that its parent is still the PID the
  supervisor passed (``--supervisor-pid``): comparing with 1 is wrong wherever orphans go to a
  subreaper (systemd --user, tini -s, a container shim), which is how a router started just
  before its supervisor died ran on as an orphan. An orphan drains as on any SIGTERM, with
  ``signal.alarm`` as a backstop the kernel enforces: no supervisor is left to SIGKILL a drain
  that hangs.
* **Its store lock may still be held by such an orphan** draining when a new supervisor starts
  (kill -9, then start again at once): the new supervisor waits up to ``LOCK_WAIT_S`` for each
  router's store (``acquire_router_store``), longer than an orphan may live, before it probes
  the ports the orphan also holds; then it gives up with exit 2 (meshmq/dirlock.py). Each
  router waits the same way again.

Every log line of a router carries ``router=<node id>/<r>``: the routers share the supervisor's
stderr (one journal stream per node), and a line without it could be any of them.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import uvloop

from cluster.settings import router_id
from meshmq.config import COMMITLOG_SUBDIR, NodeConfig
from meshmq.dirlock import DataDirInUse, DataDirLock
from meshmq.node import Node

__all__ = ["router_dir", "announce_path", "router_config", "run_router", "ANNOUNCE_FILE",
           "acquire_router_store"]

log = logging.getLogger("meshmq.router")

ANNOUNCE_FILE = "router.json"
_PR_SET_PDEATHSIG = 1
# An orphaned router's drain must end within this (the kernel's SIGALRM ends it otherwise): a
# little under the supervisor's own stop_timeout, the SIGKILL an orphan no longer has.
ORPHAN_STOP_S = 20
# How long a router waits for its store's lock held by another process (an orphan of a previous
# supervisor, draining): longer than ORPHAN_STOP_S, so a kill -9 then a restart always starts.
LOCK_WAIT_S = ORPHAN_STOP_S + 10.0
PARENT_POLL_S = 0.5  # one getppid() a half second: nothing, next to a router's work


def router_dir(config: NodeConfig, index: int) -> str:
    """Router ``index``'s state directory under the node's data_dir."""
    return os.path.join(config.data_dir, f"router-{index}")


def announce_path(config: NodeConfig, index: int) -> Path:
    """Where router ``index`` announces its PID and admin port to the supervisor."""
    return Path(router_dir(config, index)) / ANNOUNCE_FILE


def router_config(config: NodeConfig, index: int) -> NodeConfig:
    """The node's config as router ``index`` runs it (own dirs, loopback admin on port 0)."""
    rdir = router_dir(config, index)
    log_dir = config.commitlog.directory
    derived = os.path.normpath(log_dir) == os.path.normpath(
        os.path.join(config.data_dir, COMMITLOG_SUBDIR))
    log_dir = (os.path.join(rdir, COMMITLOG_SUBDIR) if derived
               else os.path.join(log_dir, f"router-{index}"))
    return dataclasses.replace(
        config, data_dir=rdir,
        commitlog=dataclasses.replace(config.commitlog, directory=log_dir),
        admin_bind="127.0.0.1:0", admin_certfile=None, admin_keyfile=None)


class _RouterTag(logging.Filter):
    """Adds ``router=<id>`` to every record that does not name a router already."""

    def __init__(self, rid: str) -> None:
        super().__init__()
        self.rid = rid

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "router"):
            record.router = self.rid
        return True


class RouterNode(Node):
    """A ``Node`` that announces itself to the supervisor once it serves."""

    def __init__(self, config: NodeConfig, router_index: int, announce: Path,
                 supervisor_pid: int | None = None) -> None:
        super().__init__(config, router_index)
        self._announce = announce
        self._supervisor_pid = supervisor_pid
        self._orphan = False

    async def run(self) -> int:
        # Both ways a router learns that its supervisor is gone, side by side: the kernel's
        # death signal (and the check for a death before it was asked), and the poll.
        _die_with_parent(self._supervisor_pid)
        asyncio.get_running_loop().call_soon(self._watch_parent)
        return await super().run()

    def request_stop(self) -> None:
        """SIGTERM: from the supervisor (a node stopping) or the kernel's death signal."""
        self._note_orphan()
        super().request_stop()

    def _note_orphan(self) -> bool:
        """Once orphaned: say so, and give the drain a deadline only the kernel can enforce."""
        if not self._orphan and _orphaned(self._supervisor_pid):
            self._orphan = True
            log.error("the supervisor (pid %s) is gone: draining and exiting (at most %ds) so "
                      "that no router outlives its node; start the node again once this router "
                      "has exited", self._supervisor_pid, ORPHAN_STOP_S,
                      extra={"supervisor_pid": self._supervisor_pid})
            signal.alarm(ORPHAN_STOP_S)
        return self._orphan

    def _watch_parent(self) -> None:
        """The death signal's backstop, checked every PARENT_POLL_S. It is needed: the kernel
        sends that signal when the parent *thread* exits, and the supervisor has threads
        (asyncio's child watcher), so the first one can arrive while the parent is still the
        supervisor's PID, being torn down; a prctl that failed (not Linux) sends none."""
        if self._note_orphan():
            self.request_stop()
        else:
            asyncio.get_running_loop().call_later(PARENT_POLL_S, self._watch_parent)

    async def lock_data_dir(self) -> DataDirLock:
        """Wait for a store still held by an orphan (see acquire_router_store)."""
        return await acquire_router_store(self.config.data_dir, self._stop.is_set)

    async def start(self) -> None:
        await super().start()
        assert self.listeners is not None
        doc = {"pid": os.getpid(), "admin_port": self.admin.port,
               "mqtt": self.listeners.bound}
        tmp = self._announce.with_name(self._announce.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self._announce)  # the supervisor never reads half a file

    async def stop(self) -> None:
        self._announce.unlink(missing_ok=True)
        await super().stop()


async def acquire_router_store(directory: str,
                               stopping: Callable[[], bool] = lambda: False) -> DataDirLock:
    """Router ``directory``'s lock, waiting up to LOCK_WAIT_S for a holder to go (an orphan of
    a previous supervisor draining: see the module docstring); DataDirInUse after that (exit 2,
    naming the holder). The supervisor asks first for each router, before it binds anything or
    probes its ports, which such an orphan may still hold; each router asks again."""
    deadline = time.monotonic() + LOCK_WAIT_S
    warned = False
    while True:
        try:
            return DataDirLock.acquire(directory)
        except DataDirInUse as err:
            if time.monotonic() >= deadline or stopping():
                raise
            if not warned:
                warned = True
                log.warning("%s is held by pid %s (a router of a previous supervisor still "
                            "draining?): waiting up to %.0fs for it", directory,
                            err.holder.get("pid", "unknown"), LOCK_WAIT_S,
                            extra={"holder_pid": err.holder.get("pid")})
        await asyncio.sleep(0.2)


def _orphaned(supervisor_pid: int | None) -> bool:
    """True once this process's parent is no longer its supervisor. Without the PID (a router
    started by hand), only a parent of 1 says so."""
    if supervisor_pid is None:
        return os.getppid() == 1
    return os.getppid() != supervisor_pid


def _die_with_parent(supervisor_pid: int | None) -> None:
    """Ask Linux for SIGTERM when the supervisor dies; exit now if it already has (the kernel
    signals only a death after the prctl, so the check after it closes the race)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's stop() still reaches us
        pass
    if _orphaned(supervisor_pid):
        log.error("the supervisor (pid %s) exited before this router started: exiting, so "
                  "that no router outlives its node", supervisor_pid,
                  extra={"supervisor_pid": supervisor_pid, "parent_pid": os.getppid()})
        raise SystemExit(1)


def run_router(config: NodeConfig, index: int, supervisor_pid: int | None = None) -> int:
    """Run router ``index`` of this cluster node until SIGTERM; the process exit code."""
    assert config.cluster is not None
    rid = router_id(config.cluster.node_id, index)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_RouterTag(rid))
    announce = announce_path(config, index)
    rconfig = router_config(config, index)

    async def main() -> int:
        return await RouterNode(rconfig, index, announce, supervisor_pid).run()

    return uvloop.run(main())
