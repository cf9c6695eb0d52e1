"""Wires the session registry in Raft (``cluster/sessionreg.py``) into a router
(``broker/registry.py``): with ``cluster.placement = "raft"`` a CONNECT claims its client id in
Raft instead of asking the other routers, and persistent sessions are saved there. Kept apart
from ``cluster_wiring.py`` (placement and the mesh) so each part reads alone."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


async def attach_sessions(node: Any, rid: str) -> Any:
    """Give ``node.router`` a session registry; returns the ``SessionRegistry``."""
    from broker.registry import RegisteredSessions
    from cluster.sessionreg import SessionRegistry
    from meshmq.metadata_proc import metadata_socket

    settings = node.config.cluster
    # a router's data_dir is <node data_dir>/router-<i> (meshmq/router_proc.py, router_dir)
    node_dir = os.path.dirname(os.path.normpath(node.config.data_dir))
    registry = SessionRegistry(rid, metadata_socket(node_dir), settings.append_timeout)
    glue = RegisteredSessions(node.router, registry, settings.session_checkpoint_interval)
    node.router.registry = glue
    registry.start()
    glue.start()
    node.metrics.add_collector(lambda: session_metrics(registry, glue), "sessionreg")

    async def close(_app: web.Application) -> None:
        glue.close()
        await registry.close()

    node.admin.app.on_cleanup.append(close)
    return registry


def session_metrics(registry: Any, glue: Any) -> Iterable[Metric]:
    """The registry's counters (cluster/sessionreg.py, broker/registry.py)."""
    claims = CounterMetricFamily(
        "meshmq_session_claims", "CONNECTs whose client id claim in the Raft session "
        "registry committed (ok) or did not within cluster.append_timeout (refused: CONNACK "
        "0x88, 3.x 0x03).", labels=["result"])
    claims.add_metric(["ok"], registry.stats["claims"])
    claims.add_metric(["refused"], registry.stats["claims_failed"])
    taken = CounterMetricFamily(
        "meshmq_session_taken_over", "Connections closed here (v5 0x8E) because their client "
        "id was claimed at a newer session epoch at another router.",
        value=glue.stats["taken_over"])
    resumed = CounterMetricFamily(
        "meshmq_session_resumed_from_registry", "Persistent sessions resumed here from the "
        "state saved in the session registry by another router.", value=glue.stats["resumed"])
    handed = CounterMetricFamily(
        "meshmq_session_handed_over", "Sessions another router (the previous holder "
        "the registry named, alive) handed over here over the mesh.",
        value=glue.stats["handed_over"])
    saves = CounterMetricFamily(
        "meshmq_session_saves", "Persistent session states saved in the session registry "
        "(SUBSCRIBE, UNSUBSCRIBE, disconnect, checkpoint), by result.", labels=["result"])
    saves.add_metric(["ok"], registry.stats["saves"])
    saves.add_metric(["failed"], registry.stats["saves_failed"])
    lat = sorted(registry.claim_latency)
    wait = GaugeMetricFamily(
        "meshmq_session_claim_seconds", "Median time of a CONNECT's claim in the session "
        "registry (one Raft commit), last 256.", value=lat[len(lat) // 2] if lat else 0.0)
    return [claims, taken, resumed, handed, saves, wait]
