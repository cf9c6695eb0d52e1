"""Wires a router process into the mesh: builds cluster.mesh.Mesh and hands the router its
forwarder. The only place that knows both the router and the cluster (broker/ never imports
cluster/, see docs/architecture.md)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from meshmq.admin_api import attach_admin_cluster
from meshmq.fetch_api import RELAYED_HEADER, attach_cluster

log = logging.getLogger("meshmq.cluster")

# (link stats key, metric name, help): counters per link, labelled by peer router
_COUNTERS = (
    ("msgs_out", "meshmq_link_messages_sent", "Entries (publishes) sent over the link."),
    ("msgs_in", "meshmq_link_messages_received", "Entries (publishes) received over the link."),
    ("retained_out", "meshmq_link_retained_sent",
     "Retained-message changes and resyncs sent over the link (not in messages_sent)."),
    ("retained_in", "meshmq_link_retained_received",
     "Retained-message changes and resyncs received over the link (not in messages_received)."),
    ("bytes_out", "meshmq_link_bytes_sent", "Bytes written to the link."),
    ("bytes_in", "meshmq_link_bytes_received", "Bytes read from the link."),
    ("frames_out", "meshmq_link_frames_sent", "Frames written to the link."),
    ("frames_in", "meshmq_link_frames_received", "Frames read from the link."),
    ("reconnects", "meshmq_link_reconnects", "Dials of the link after the first."),
    ("resent", "meshmq_link_resent", "Entries resent after a reconnect (QoS>=1, unacked)."),
    ("append_timeouts", "meshmq_link_append_timeouts",
     "Publishes to the peer (the device log's owner) refused as not stored: no outcome "
     "within cluster.append_timeout."),
    ("outcomes_asked", "meshmq_link_outcomes_asked",
     "APPENDs the peer sent again because their outcome was lost with a connection, answered "
     "here from what this router remembers (never appended twice)."),
    ("appends_fenced", "meshmq_link_appends_fenced",
     "APPENDs from the peer refused unapplied: this router does not lead their device log, or "
     "not at the leader epoch they named (the peer's view of the placement is stale)."),
    ("deliveries_fenced", "meshmq_link_deliveries_fenced",
     "DELIVERs from the peer dropped: routed at a leader epoch older than the one this router "
     "knows for their device log (a deposed leader's, late); sessions read those records from "
     "the log instead (cluster/deliverfence.py)."),
    ("appends_moved", "meshmq_link_appends_moved",
     "Publishes waiting on the peer for their outcome when it stopped leading their device "
     "log, sent to the new leader instead (the sent ones looked up there first, never stored "
     "twice: cluster/appendmove.py)."),
)


async def attach_mesh(node: Any) -> Any:
    """Start this router's mesh links; returns the Mesh (``close()``, ``status()``)."""
    from cluster.mesh import Mesh  # not imported by single nodes

    mesh = Mesh(node.config.cluster, node.router_index, node.router, node.store, node.stats,
                placement_of(node))
    placer = None
    if node.config.cluster.placement == "raft":
        placer = await _attach_raft(node, mesh)
        from meshmq.session_wiring import attach_sessions
        await attach_sessions(node, mesh.rid)  # the session registry (meshmq/session_wiring.py)
    elif node.store is not None:
        # a node back on the static placement after Raft's: no replication moves the marks
        # its logs kept in the checkpoint, so each is its durable end again (else its acks
        # would wait forever for a mark nobody moves)
        for key in node.store.keys():
            node.store.set_high_watermark(key, None)
    await mesh.start()

    async def cluster_status(request: web.Request) -> web.Response:
        status = mesh.status()
        device = request.query.get("device")
        if device:
            leader = mesh.placement.leader_of(device)
            status["owner"] = {"device": device, "router": leader.router,
                               "epoch": leader.epoch}
            if placer is not None:
                rec = placer.feed.records.get(device) or {}
                status["owner"].update(isr=rec.get("isr"), replicas=rec.get("replicas"))
        return web.json_response(status)

    node.admin.app.router.add_get("/api/v1/cluster", cluster_status)
    _relay_device_requests(node, mesh)
    attach_cluster(node.admin.app, MeshView(mesh))
    attach_admin_cluster(node.admin.app, MeshView(mesh))  # clients, sessions (admin_api.py)
    node.metrics.add_collector(lambda: mesh_metrics(mesh), "mesh")
    return mesh


async def _attach_raft(node: Any, mesh: Any) -> Any:
    """Raft placement (cluster/raftplace.py): feed the placement from this node's metadata
    process, register the logs already on disk, then place new logs on their first publish.
    Before any listener opens (the node starts them after this), so no publish or read of a
    log on disk is served as leader before Raft agrees; bounded by cluster.append_timeout x 2
    so a node without a Raft majority still starts (its unregistered logs are not served
    until Raft answers: a publish places them then)."""
    import os

    from cluster.lease import Lease
    from cluster.logfloor import LogFloors
    from cluster.raftplace import RaftFeed, RaftPlacer, append_here
    from cluster.routerreg import Registrar, wait_unfenced
    from meshmq.metadata_proc import metadata_socket

    settings = node.config.cluster
    # a router's data_dir is <node data_dir>/router-<i> (meshmq/router_proc.py, router_dir)
    node_dir = os.path.dirname(os.path.normpath(node.config.data_dir))
    socket = metadata_socket(node_dir)
    feed = RaftFeed(mesh.placement, socket)
    # this process's incarnation (the mesh's): records led by a previous process of this
    # router are fenced from the first snapshot on (cluster/routerreg.py)
    feed.incarnation = mesh.incarnation.hex()
    placer = RaftPlacer(settings, mesh.rid, feed, mesh.append_at,
                        functools.partial(append_here, node.router))
    mesh.placer = placer
    # publishes waiting on a deposed leader go to the new one (cluster/appendmove.py)
    from cluster.appendmove import AppendMover

    mover = AppendMover(mesh, functools.partial(append_here, node.router))
    mesh.placement.subscribe(mover.on_change)
    # a log's epoch rising: sessions read it back, its old leader's DELIVERs are dropped
    feed.listeners.append(mesh.deliver_fence.on_record)
    floors = None
    if node.store is not None:
        # before the feed starts: no record names this router leader of a log it lost
        # without the check (cluster/logfloor.py)
        store = node.store
        floors = LogFloors(mesh.rid, feed.socket_path, feed.records, store.durable_end,
                           store.high_watermark, settings.log_floor_interval)
        feed.admit = floors.admit
    # the leader lease (cluster/lease.py): QoS>=1 publishes refused when cut off from the
    # majority; ``mesh.lease.valid`` is what the replication's LeaderState takes as lease_ok
    lease = Lease(settings, socket)
    lease.start()
    mesh.lease = lease
    node.router.write_gate = lease.refusal
    node.router.gate_held.limit = settings.lease_hold_max
    lease.on_valid = node.router.gate_held.opened
    # what this router's disk held at start, before its fetchers add anything: a restarted
    # sole in-sync replica is elected again only with its logs (cluster/controller.py)
    kept = node.store is not None and any(not k.startswith("#") for k in node.store.keys())
    replication = None
    if node.store is not None and node.committer is not None:
        from meshmq.replication_wiring import attach_replication

        replication = attach_replication(node, mesh, feed, placer)
    feed.start()
    wait = 2 * settings.append_timeout
    try:
        await asyncio.wait_for(feed.synced.wait(), wait)
    except TimeoutError:
        log.error("no placement snapshot from this node's metadata process in %.0f s: device "
                  "logs stay unplaced (not served) until it answers", wait)
    # logs whose recovery quarantined a record at this start: not re-elected while another
    # in-sync replica can lead them (cluster/controller.py ``plan``; review 7)
    damaged = [k for k in node.store.keys() if node.store.lost_ranges(k, 0, 1 << 62)] \
        if node.store is not None else []
    if damaged:
        log.warning("%d device logs lost records to corruption found at start: this router "
                    "does not lead them again while another in-sync replica can, and "
                    "fetches the lost records from it", len(damaged),
                    extra={"router": mesh.rid, "devices": damaged[:20]})
    registrar = Registrar(socket, mesh.rid, feed.incarnation, kept, damaged)
    await registrar.start(wait)
    if node.store is not None:
        await placer.register(node.store.keys(), wait)
    if registrar.registered:  # before the links: peers' resent APPENDs find a leader again
        await wait_unfenced(feed.records, mesh.rid, feed.incarnation,
                            2 * settings.node_timeout)
    node.metrics.add_collector(lambda: placement_metrics(placer), "placement")
    if floors is not None:
        floors.start()
        node.metrics.add_collector(lambda: floor_metrics(floors), "log floors")
    node.metrics.add_collector(lambda: lease_metrics(lease, node.router.gate_held), "lease")

    closing = node.admin.app.on_cleanup

    async def close_raft(_app: web.Application) -> None:
        if floors is not None:
            await floors.close()
        if getattr(mesh, "affinity", None) is not None:
            await mesh.affinity.close()
        if replication is not None:
            await replication.close()
        await placer.close()
        await feed.close()
        await lease.close()
        await registrar.close()

    closing.append(close_raft)
    return placer


def lease_metrics(lease: Any, held: Any) -> Iterable[Metric]:
    """The leader lease (cluster/lease.py): whether this router may ack, and its refusals."""
    valid = GaugeMetricFamily("meshmq_leader_lease_valid", "1 while this router's node's Raft "
                              "voter heard from a majority within cluster.leader_lease (QoS>=1 "
                              "publishes acknowledged), 0 while they are refused.")
    valid.add_metric([], 1.0 if lease.valid() else 0.0)
    yield valid
    refused = CounterMetricFamily("meshmq_lease_refused", "QoS>=1 publishes refused (v5 "
                                  "DISCONNECT 0x9C, 3.x closed) because the leader lease ran "
                                  "out (cut off from the Raft majority).")
    refused.add_metric([], lease.refused)
    yield refused
    counts = CounterMetricFamily(
        "meshmq_publishes_held", "QoS>=1 publishes held while the leader lease was out (a "
        "Raft election; broker/gatehold.py), by outcome: held (all), released (stored once "
        "the lease was back), refused (cluster.lease_hold ran out), full (refused at once: "
        "cluster.lease_hold_max held already).", labels=["outcome"])
    for outcome, value in (("held", held.held), ("released", held.released),
                           ("refused", held.refused), ("full", held.full)):
        counts.add_metric([outcome], value)
    yield counts
    waiting = GaugeMetricFamily("meshmq_publishes_held_now", "QoS>=1 publishes held for the "
                                "leader lease now.")
    waiting.add_metric([], len(held.items))
    yield waiting


def placement_metrics(placer: Any) -> Iterable[Metric]:
    """Raft placement's counters and the first-publish wait (cluster/raftplace.py)."""
    stats = placer.stats
    placed = CounterMetricFamily("meshmq_placement_logs_placed", "Device logs this router "
                                 "proposed to Raft on their first publish, by where Raft placed "
                                 "them (here, or another router placed them first).",
                                 labels=["where"])
    placed.add_metric(["here"], stats["placed"])
    placed.add_metric(["elsewhere"], stats["placed_elsewhere"])
    refused = CounterMetricFamily("meshmq_placement_refused", "Publishes of unplaced device "
                                  "logs refused, never acked: held_full (cluster."
                                  "placement_max_held), no_majority (Raft did not place the log "
                                  "within cluster.append_timeout; counted per log).",
                                  labels=["reason"])
    refused.add_metric(["held_full"], stats["held_full"])
    refused.add_metric(["no_majority"], stats["no_majority"])
    conflicts = CounterMetricFamily("meshmq_placement_conflicts", "Device logs on this "
                                    "router's disk that Raft places on another router: not "
                                    "served here (see the ERROR naming both routers).",
                                    value=stats["conflicts"])
    retries = CounterMetricFamily("meshmq_placement_proposal_retries", "Placement proposals "
                                  "sent again: no Raft leader, an unknown outcome (the "
                                  "leader lost mid-proposal), or no answer within one attempt "
                                  "(3 s, doubling): the same compare-and-set again.",
                                  value=stats["retries"])
    held = GaugeMetricFamily("meshmq_placement_held", "Publishes waiting for their device "
                             "log to be placed by Raft (bounded by cluster.placement_max_held).",
                             value=placer.held_count)
    lat = sorted(placer.latency)
    wait = GaugeMetricFamily("meshmq_placement_wait_seconds", "Median wait of a new device's "
                             "first publish for its placement (one Raft commit), last 256.",
                             value=lat[len(lat) // 2] if lat else 0.0)
    return [placed, refused, conflicts, retries, held, wait]


def floor_metrics(floors: Any) -> Iterable[Metric]:
    """Log floors (cluster/logfloor.py): raised in Raft, and the logs found lost here."""
    raised = CounterMetricFamily("meshmq_log_floors_raised", "Device-log floors this router "
                                 "raised in Raft (batched every cluster.log_floor_interval): "
                                 "how far each log it leads was acknowledged.",
                                 value=floors.stats["floors_raised"])
    failed = CounterMetricFamily("meshmq_log_floor_failures", "Rounds whose floors Raft did "
                                 "not take (no majority, the metadata process unreachable); "
                                 "tried again next round.",
                                 value=floors.stats["proposal_failures"])
    lost = GaugeMetricFamily("meshmq_logs_lost_here", "Device logs this router was named "
                             "leader of with fewer records than Raft's floor: not served "
                             "(see the ERROR naming each).", value=len(floors.lost))
    return [raised, failed, lost]


def placement_of(node: Any) -> Any:
    """The process's one ``cluster.placement.Placement``, made on first use: before the mesh
    starts, restored sessions already need it (their cursors on logs other routers lead)."""
    placement = getattr(node, "placement", None)
    if placement is None:
        from cluster.placement import Placement  # not imported by single nodes
        from cluster.settings import router_id

        settings = node.config.cluster
        # under Raft placement no hash: a log Raft has not placed has no leader yet
        placement = Placement(settings.router_ids(), router_id(settings.node_id,
                                                               node.router_index),
                              static=settings.placement != "raft")
        node.placement = placement
    return placement


def owner_lookup(node: Any) -> Any:
    """The device-log owner function ``Mesh.owner_of`` is (the placement's ``owner_of``):
    the leading router's id, None when it is this router."""
    return placement_of(node).owner_of


_DEVICE_PATH = re.compile(r"^/api/v1/logs/([^/]+)(/records)?$")
_RELAYED = RELAYED_HEADER
_PASS_HEADERS = ("authorization", "accept", "content-type")


def _relay_device_requests(node: Any, mesh: Any) -> None:
    """The fetch API answers for any device on any router: a request about a device log
    another router owns goes over the mesh link to the owner, which runs it against its own
    admin API (so authentication, the read ACL and every status code are the owner's). The
    listing (``/api/v1/logs``) and the many-device fetch name many devices: the fetch API
    itself splits them over the routers through ``MeshView`` (meshmq/fetch_api.py), and its
    parts come back here, at each peer, through ``mesh.admin_executor``."""
    session: dict[str, aiohttp.ClientSession] = {}

    async def execute(method: str, path: str, headers: list[tuple[str, str]],
                      body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if "s" not in session:
            session["s"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        scheme = "https" if node.config.admin_certfile else "http"
        url = f"{scheme}://127.0.0.1:{node.admin.port}{path}"
        async with session["s"].request(method, url, headers=[*headers, (_RELAYED, "1")],
                                        data=body or None, ssl=False) as resp:
            out = await resp.read()
            keep = [(k, v) for k, v in resp.headers.items() if k.lower().startswith("x-meshmq")]
            return resp.status, resp.content_type, keep, out

    mesh.admin_executor = execute

    async def close_session(_app: web.Application) -> None:
        if "s" in session:
            await session["s"].close()

    node.admin.app.on_cleanup.append(close_session)

    @web.middleware
    async def relay(request: web.Request, handler: Any) -> web.StreamResponse:
        match = _DEVICE_PATH.match(request.path)
        if match is None or _RELAYED in request.headers:
            return await handler(request)
        owner = mesh.owner_of(unquote(match.group(1)))
        if owner is None:
            return await handler(request)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() in _PASS_HEADERS]
        body = await request.read() if request.can_read_body else b""
        wait = 35.0  # above the fetch API's longest long poll (30 s)
        status, ctype, out_headers, out = await mesh.relay(
            owner, request.method, request.path_qs, headers, body, wait)
        resp = web.Response(status=status, body=out, content_type=ctype)
        for k, v in out_headers:
            resp.headers[k] = v
        return resp

    node.admin.app.middlewares.append(relay)


class MeshView:
    """The fetch API's view of the cluster (``meshmq.fetch_api.ClusterView``) over the mesh:
    who owns a device, the other routers, and an admin request run at one of them."""

    def __init__(self, mesh: Any) -> None:
        self._mesh = mesh

    def owner_of(self, device: str) -> str | None:
        return self._mesh.owner_of(device)

    def peers(self) -> list[str]:
        return list(self._mesh.links)

    async def relay(self, router: str, method: str, path: str, headers: list[tuple[str, str]],
                    body: bytes, timeout: float,
                    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        return await self._mesh.relay(router, method, path, headers, body, timeout)


def mesh_metrics(mesh: Any) -> Iterable[Metric]:
    """Per-link families for what an operator graphs: state, traffic, window, queue, RTT."""
    links = mesh.links.values()
    now = time.monotonic()
    state = GaugeMetricFamily("meshmq_link_up", "1 when the link to the peer router is up.",
                              labels=["peer"])
    queued = GaugeMetricFamily("meshmq_link_queued_bytes", "Bytes waiting on the link "
                               "(bounded by cluster.link_max_queued_bytes).", labels=["peer"])
    unacked = GaugeMetricFamily("meshmq_link_unacked", "Entries sent and not yet acknowledged "
                                "(bounded by cluster.link_window).", labels=["peer"])
    awaiting = GaugeMetricFamily("meshmq_link_appends_awaiting", "Publishes sent to the peer, "
                                 "the owner of their device log, still waiting for its outcome "
                                 "(their PUBACKs wait too).", labels=["peer"])
    oldest = GaugeMetricFamily("meshmq_link_oldest_append_seconds", "Age of the oldest publish "
                               "waiting for the peer's outcome (refused as not stored at "
                               "cluster.append_timeout); 0 when none waits.", labels=["peer"])
    rtt = GaugeMetricFamily("meshmq_link_rtt_seconds", "Last ping round trip.", labels=["peer"])
    version = GaugeMetricFamily("meshmq_link_protocol_version", "The mesh protocol version the "
                                "link's last handshake negotiated (cluster.protocol_version "
                                "caps it).", labels=["peer"])
    routes = GaugeMetricFamily("meshmq_link_routes", "Filters the peer subscribes to.",
                               labels=["peer"])
    dropped = CounterMetricFamily("meshmq_link_dropped", "Entries a link did not carry: "
                                  "queue_full (delivery dropped), refused (publish refused as "
                                  "not stored), reconnect (QoS 0 lost with a connection), "
                                  "expired (a publish refused at cluster.append_timeout "
                                  "before it was ever sent: dropped, never stored).",
                                  labels=["peer", "reason"])
    counters = {key: CounterMetricFamily(name, doc, labels=["peer"])
                for key, name, doc in _COUNTERS}
    for link in links:
        peer = [link.peer]
        state.add_metric(peer, 1 if link.state == "up" else 0)
        queued.add_metric(peer, link.queued_bytes)
        unacked.add_metric(peer, link.unacked)  # entries (a run holds many)
        version.add_metric(peer, link.version)
        awaiting.add_metric(peer, len(link.awaiting))
        oldest.add_metric(peer, link.oldest_awaiting(now))
        if link.rtt_ms is not None:
            rtt.add_metric(peer, link.rtt_ms / 1000)
        routes.add_metric(peer, mesh.routes.count(link.peer))
        stats = {**link.stats, "reconnects": link.reconnects}
        for key, family in counters.items():
            family.add_metric(peer, stats[key])
        dropped.add_metric([link.peer, "queue_full"], link.stats["dropped_full"])
        dropped.add_metric([link.peer, "refused"], link.stats["refused_full"])
        dropped.add_metric([link.peer, "reconnect"], link.stats["dropped_reconnect"])
        dropped.add_metric([link.peer, "expired"], link.stats["expired_unsent"])
    failures = CounterMetricFamily("meshmq_link_entry_failures", "Entries from peers that "
                                   "raised while applied and were skipped (a bug: see the "
                                   "log).", value=mesh.entry_failures)
    return [state, queued, unacked, awaiting, oldest, rtt, routes, version, dropped, failures,
            *counters.values()]
