"""One router process of a cluster node: ``meshmq serve -c FILE --router R``, started by the
node's supervisor (``cluster/supervisor.py``, wired in ``meshmq/cluster_node.py``), never by hand.

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
  leave routers holding the ports and the stores.

Every log line of a router carries ``router=<node id>/<r>``: the routers share the supervisor's
stderr (one journal stream per node), and a line without it could be any of them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import signal
from pathlib import Path

import uvloop

from cluster.settings import router_id
from meshmq.config import COMMITLOG_SUBDIR, NodeConfig
from meshmq.node import Node

__all__ = ["router_dir", "announce_path", "router_config", "run_router", "ANNOUNCE_FILE"]

log = logging.getLogger("meshmq.router")

ANNOUNCE_FILE = "router.json"
_PR_SET_PDEATHSIG = 1


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

    def __init__(self, config: NodeConfig, router_index: int, announce: Path) -> None:
        super().__init__(config, router_index)
        self._announce = announce

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


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the supervisor dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's stop() still reaches us
        return
    if os.getppid() == 1:
        raise SystemExit(1)


def run_router(config: NodeConfig, index: int) -> int:
    """Run router ``index`` of this cluster node until SIGTERM; the process exit code."""
    assert config.cluster is not None
    _die_with_parent()
    rid = router_id(config.cluster.node_id, index)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_RouterTag(rid))
    announce = announce_path(config, index)
    rconfig = router_config(config, index)

    async def main() -> int:
        return await RouterNode(rconfig, index, announce).run()

    return uvloop.run(main())
