"""``meshmq serve`` for a cluster member: the supervisor process of one node.

With ``[cluster]`` set, the process an operator starts does not route MQTT itself: it checks
the configuration and the directories (``preflight``), binds the node's admin endpoint
(``meshmq.node_admin``), starts ``cluster.routers`` router processes (``meshmq serve -c FILE
--router R``, ``meshmq.router_proc``) through ``meshmq.supervisor.Supervisor``, and turns
signals into supervisor actions. Exit codes keep the single node's meaning: 0 after a drain, 2
for what an operator must fix (config, directories, a router exiting 2), 1 for the rest (a port
taken, a router that could not start).

The routers re-read the same config file and environment as the supervisor (the file's path is
passed on, made absolute). A router restarted after the file was edited starts with the edit:
restart the node after changing the config, as with any daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from cluster.settings import router_id
from meshmq.config import NodeConfig
from meshmq.dirlock import DataDirInUse, DataDirLock
from meshmq.metadata_proc import MetadataProcess
from meshmq.node_admin import NodeAdmin
from meshmq.portcheck import listener_conflicts
from meshmq.preflight import StartupError, check_startup
from meshmq.router_proc import acquire_router_store, announce_path, router_dir
from meshmq.supervisor import Supervisor

__all__ = ["run_supervisor", "router_argv"]

log = logging.getLogger("meshmq.cluster_node")


def router_argv(config_path: str | None, index: int, extra: Sequence[str] = ()) -> list[str]:
    """Router ``index``'s command line: this interpreter, the same config, ``--router``, and
    this process's PID (the router exits if its parent is not, or is no longer, that PID)."""
    argv = [sys.executable, "-m", "meshmq", "serve"]
    if config_path is not None:
        argv += ["-c", os.path.abspath(config_path)]
    return argv + ["--router", str(index), "--supervisor-pid", str(os.getpid()), *extra]


async def _supervise(config: NodeConfig, config_path: str | None,
                     extra_args: Sequence[str]) -> int:
    cluster = config.cluster
    assert cluster is not None
    try:
        check_startup(config)
        # The node's data_dir, held for the supervisor's life; each router holds its own
        # router-<r>/ under it as well, so a router orphaned by a kill -9'd supervisor still
        # keeps a new node's router off its store (meshmq/dirlock.py).
        dirlock = DataDirLock.acquire(config.data_dir)
    except StartupError as err:
        log.error("cannot start: %s", err, extra={"key": err.key})
        return 2
    except DataDirInUse as err:
        log.error("cannot start: node.data_dir: %s", err,
                  extra={"key": "node.data_dir", "holder_pid": err.holder.get("pid")})
        return 2
    try:
        # Routers of a previous supervisor of this node (killed with -9) may still be draining:
        # wait for their stores, which they free last, so that their ports are free too.
        for r in range(cluster.routers):
            (await acquire_router_store(router_dir(config, r))).release()
    except DataDirInUse as err:
        log.error("cannot start: node.data_dir: %s", err,
                  extra={"key": "node.data_dir", "holder_pid": err.holder.get("pid")})
        dirlock.release()
        return 2
    except StartupError as err:  # a router's lock file it cannot open (meshmq/dirlock.py)
        log.error("cannot start: %s", err, extra={"key": err.key})
        dirlock.release()
        return 2
    taken = listener_conflicts(config.broker.listeners)
    for key, bind, why in taken:
        log.error("cannot start: %s %s: %s. Another process listens there; this node's routers "
                  "share their ports (SO_REUSEPORT) and would take a share of its clients: stop "
                  "it, or change %s", key, bind, why, key, extra={"key": key})
    if taken:
        dirlock.release()
        return 1  # a port taken, as for a single node: it may be free on the next try
    rids = [router_id(cluster.node_id, r) for r in range(cluster.routers)]
    supervisor = Supervisor(cluster.routers,
                            lambda r: router_argv(config_path, r, extra_args),
                            lambda r: announce_path(config, r), rids)
    # the node's Raft voter, before the routers (issue 24: they will ask it where logs live)
    metadata = MetadataProcess(cluster, config.data_dir) if cluster.placement == "raft" else None
    admin = NodeAdmin(config, supervisor, metadata)
    try:
        await admin.start()
    except OSError as err:
        log.error("cannot start: admin.bind %s: %s", config.admin_bind, err.strerror or err)
        return 1
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[int]] = []

    def on_stop(sig: signal.Signals) -> None:
        if not stopping:
            log.info("%s: draining every router", sig.name)
            stopping.append(loop.create_task(supervisor.stop(0)))

    def on_hup() -> None:
        admin.reload()  # the node admin checks credentials too (/api/v1/cluster)
        pids = supervisor.forward(signal.SIGHUP)
        log.info("SIGHUP: forwarded to the routers", extra={"pids": pids})

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        if metadata is not None:
            await metadata.start()
        await supervisor.start()
        if await supervisor.wait_up():
            log.info("meshmq node ready", extra={
                "node_id": cluster.node_id, "cluster": cluster.name, "admin": config.admin_bind,
                "routers": {c.router_id: c.pid for c in supervisor.children}})
        code = await supervisor.wait()
    finally:
        if metadata is not None:
            await metadata.stop()
        await admin.stop()
        dirlock.release()
    log.info("meshmq node stopped", extra={"exit": code})
    return code


def run_supervisor(config: NodeConfig, config_path: str | None,
                   extra_args: Sequence[str] = ()) -> int:
    """Run the node's supervisor until SIGTERM/SIGINT or a router it cannot keep running."""
    return asyncio.run(_supervise(config, config_path, extra_args))
