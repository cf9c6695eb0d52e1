"""The admin endpoint of a cluster node, served by its supervisor on ``admin.bind``.

Why one endpoint per node and not one per router: what an operator points at a node (a
Prometheus scrape target, a Kubernetes probe, ``curl``, ``meshmq log``, ``meshmq cluster
status``) is the node, at an address in the config; router processes come and go (restarts,
another ``routers`` value) on ports the kernel picks, and asking every scrape config and probe
to follow them would make the process layout part of every tool's config. So the supervisor
answers for the node, the way EMQX answers for its whole node on one dashboard port:

* ``/metrics``: every router's metrics, scraped over loopback at request time (OpenMetrics,
  parsed with ``prometheus_client``) and re-emitted with a ``router="<node id>/<r>"`` label,
  plus the supervisor's own ``meshmq_router_up`` and ``meshmq_router_restarts_total``. Text
  by default, OpenMetrics when the scraper asks for it, as a router's own endpoint does. A
  router that cannot be scraped is ``meshmq_router_up 0`` and is left out, never a 500.
* ``/healthz``: the supervisor is alive (it restarts routers itself; restarting the pod for a
  router crash would only lose the other routers' clients). ``/readyz``: every router answers
  its own ``/readyz`` with 200; otherwise 503 naming the routers that do not, and why.
* ``/api/v1/cluster``: the supervisor's view of its routers (PID, state, restarts, last exit)
  joined with each router's mesh status (its own ``/api/v1/cluster``), and, given
  ``?device=D``, the router that leads device D's log and its epoch (``cluster.placement``).
  It needs the admin credentials whenever the routers do (``auth.password_file`` or
  ``admin.token_file``, meshmq/admin_auth.py), checked here before any router is asked: part
  of the answer is the supervisor's own, served even when no router answers, so the routers'
  check alone would leave it open exactly then.
* ``POST /api/v1/cluster/rebalance`` (``meshmq cluster rebalance``): the plan that gives every
  node a fair share of replicas and leaders, from this node's Raft records
  (cluster/rebalance.py), and, without ``dry_run``, its compare-and-set commands proposed to
  the node's metadata process (``POST /api/v1/cluster/rebalance/cancel[?device=D]`` gives
  up the moves still in progress); ``POST /api/v1/cluster/rebalance/progress`` says where each
  move stands (the CLI waits on it) and proposes the leader elections that finish them. Under
  Raft
  placement ``/api/v1/cluster`` also carries ``node_liveness`` and ``logs`` (under-replicated,
  offline, lost: cluster/loghealth.py), computed here from the same records, so any node
  answers for the whole cluster.
* ``/api/v1/...``: proxied to a router, with the caller's headers (credentials included: each
  router enforces the admin authentication itself). A device's log goes to its owner when the
  owner is a router of this node; otherwise, and for anything else, to the next router that is
  up, in turn. Any router answers for the whole cluster (meshmq/fetch_api.py: a device is
  relayed to its owner, the listing and the many-device fetch are gathered from every router
  over the mesh), so the listing is proxied to one router like the rest: merging the local
  routers' pages as well would list every device once per router.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from broker.auth import Authenticator
from broker.logrules import LogRules
from cluster import loghealth, rebalance
from cluster.metaclient import MetadataClient, MetadataUnavailable
from cluster.placement import Placement
from cluster.raftplace import RaftFeed
from cluster.settings import ClusterSettings
from meshmq.admin import METRICS_CONTENT_TYPE, bound_port
from meshmq.admin_auth import AdminAuth
from meshmq.config import NodeConfig, parse_bind
from meshmq.metadata_proc import MetadataProcess
from meshmq.metrics import raft_log_metrics
from meshmq.supervisor import Supervisor

__all__ = ["NodeAdmin", "merge_metrics"]

log = logging.getLogger("meshmq.node_admin")

ROUTER_TIMEOUT_S = 5.0
PROXY_TIMEOUT_S = 65.0  # above the fetch API's longest long poll (30 s) with room to spare
_OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
# Request headers a proxy must not pass on (RFC 9110 7.6.1) or that aiohttp sets itself.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
               "trailer", "transfer-encoding", "upgrade", "host", "content-length"}


class _Families:
    """A collector that yields already-built metric families (the merged scrape)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_metrics(scrapes: dict[str, str | None], restarts: dict[str, int]) -> list[Metric]:
    """Merge routers' OpenMetrics scrapes into families labelled ``router``.

    The routers are scraped in OpenMetrics, not the classic text format: classic text carries a
    histogram's or counter's ``_created`` series as a family of its own, which re-emitted as
    OpenMetrics would clash with the ``_created`` sample of the real family (a scraper asking
    for OpenMetrics then rejects the whole page). Parsed from OpenMetrics, every sample stays
    in its family, and either format can be written back out.

    ``scrapes`` maps a router id to its scrape (None: unreachable); ``restarts`` to its restart
    count. A family whose samples already carry a ``router`` label (it names something else,
    e.g. a peer) keeps it: overwriting would lie, so the scraped router's id goes in
    ``source_router`` there instead."""
    families: dict[str, Metric] = {}
    up = Metric("meshmq_router_up", "1 if the supervisor could scrape this router's metrics "
                "just now, 0 if not (down, restarting, or not answering).", "gauge")
    restart_family = Metric("meshmq_router_restarts", "Times the supervisor restarted this "
                            "router after it died.", "counter")
    for rid, text in scrapes.items():
        up.add_sample("meshmq_router_up", {"router": rid}, 0.0 if text is None else 1.0)
        restart_family.add_sample("meshmq_router_restarts_total", {"router": rid},
                                  float(restarts.get(rid, 0)))
        if text is None:
            continue
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            log.warning("router %s served metrics we cannot parse: %s", rid, exc)
            up.samples[-1] = up.samples[-1]._replace(value=0.0)
            continue
        for fam in parsed:
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type,
                                                  fam.unit)
            label = "source_router" if "router" in (fam.samples[0].labels if fam.samples
                                                    else {}) else "router"
            for s in fam.samples:
                out.samples.append(s._replace(labels={**s.labels, label: rid}))
    return [up, restart_family, *families.values()]


def metadata_metrics(status: dict[str, Any]) -> list[Metric]:
    """The node's Raft voter as an operator graphs it: up, leader or not, quorum, term,
    commit index (a term that keeps rising is an unstable group; a commit index that stops
    while publishes need placement is a stalled one), restarts."""
    ok = not status.get("error")
    out = []
    for name, doc, kind, value in (
            ("meshmq_metadata_up", "1 if this node's metadata process (Raft voter) answered "
             "just now.", "gauge", 1.0 if ok else 0.0),
            ("meshmq_metadata_restarts", "Times the node restarted its metadata process.",
             "counter", float(status.get("restarts") or 0)),
            ("meshmq_raft_is_leader", "1 if this node's voter leads the Raft group.", "gauge",
             1.0 if ok and status.get("state") == "leader" else 0.0),
            ("meshmq_raft_has_quorum", "1 if this node's voter sees a Raft majority.", "gauge",
             1.0 if ok and status.get("has_quorum") else 0.0),
            ("meshmq_raft_term", "The Raft term this node's voter is in.", "gauge",
             float(status.get("term") or 0)),
            ("meshmq_raft_commit_index", "The Raft commit index this node's voter knows.",
             "gauge", float(status.get("commit_index") or 0))):
        fam = Metric(name, doc, kind)
        fam.add_sample(name + ("_total" if kind == "counter" else ""), {}, value)
        out.append(fam)
    return out


class NodeAdmin:
    """The node's admin HTTP server in front of the supervisor's routers."""

    def __init__(self, config: NodeConfig, supervisor: Supervisor,
                 metadata: MetadataProcess | None = None) -> None:
        assert config.cluster is not None
        self.config = config
        self.cluster: ClusterSettings = config.cluster
        self.supervisor = supervisor
        self.metadata = metadata  # the node's Raft voter (cluster.placement = "raft")
        # this process's one placement (cluster/placement.py), seen from no router; under
        # Raft placement fed from the node's metadata process, as every router's is, so
        # ``?device=`` and the proxy's pick give the routers' answer (cluster/raftplace.py)
        self.placement = Placement(self.cluster.router_ids(), static=metadata is None)
        self.feed: RaftFeed | None = None
        if metadata is not None:
            self.feed = RaftFeed(self.placement, metadata.socket)
        self.host, self._port = parse_bind(config.admin_bind)
        self._ssl: ssl.SSLContext | None = None
        if config.admin_certfile and config.admin_keyfile:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(config.admin_certfile, config.admin_keyfile)
        self.app = web.Application()
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/api/v1/cluster", self._cluster)
        self.app.router.add_post("/api/v1/cluster/rebalance", self._rebalance)
        self.app.router.add_post("/api/v1/cluster/rebalance/progress", self._progress)
        self.app.router.add_post("/api/v1/cluster/rebalance/cancel", self._cancel)
        self.app.router.add_route("*", "/api/v1/{tail:.*}", self._proxy)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._next = 0
        self.auth: AdminAuth | None = None  # built in start(): its gate needs the loop
        self._authenticator: Authenticator | None = None

    @property
    def port(self) -> int:
        return bound_port(self._runner, self._port)

    def _build_auth(self) -> None:
        """The routers' admin authentication (meshmq/node.py ``_admin_server``), built from the
        same config, for what the supervisor answers itself (``/api/v1/cluster``)."""
        auth = self.config.broker.auth
        if not (auth.password_file or self.config.admin_token_file):
            return
        if auth.password_file:
            self._authenticator = Authenticator(auth)
        self.auth = AdminAuth(asyncio.get_running_loop(), self._authenticator,
                              self.config.admin_token_file, LogRules(self.config.commitlog.rules),
                              max_failures=auth.max_failures, failure_window=auth.failure_window,
                              max_address_failures=auth.max_address_failures)

    def reload(self) -> None:
        """SIGHUP: re-read the password, ACL and token files, as the routers do."""
        if self._authenticator is not None:
            self._authenticator.reload()
        if self.auth is not None:
            self.auth.reload()

    async def start(self) -> None:
        """Bind ``admin.bind``; raises OSError when it is taken (before any router starts)."""
        self._build_auth()
        if self.feed is not None:
            self.feed.start()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=PROXY_TIMEOUT_S),
            connector=aiohttp.TCPConnector(limit=64), auto_decompress=False)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self._port, reuse_address=True,
                              ssl_context=self._ssl).start()
        except BaseException:
            await runner.cleanup()
            await self._session.close()
            raise
        self._runner = runner
        log.info("node admin server listening", extra={"bind": f"{self.host}:{self.port}"})

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self.auth is not None:
            self.auth.close()
        if self.feed is not None:
            await self.feed.close()

    # -- helpers ------------------------------------------------------------------------------
    def _base(self, index: int) -> str | None:
        port = self.supervisor.admin_port(index)
        return None if port is None else f"http://127.0.0.1:{port}"

    async def _get(self, index: int, path: str, headers: dict[str, str] | None = None,
                   ) -> tuple[int, bytes] | None:
        """GET a router's admin path; None when the router is not up or does not answer."""
        base = self._base(index)
        if base is None or self._session is None:
            return None
        try:
            async with self._session.get(base + path, headers=headers or {},
                                         timeout=aiohttp.ClientTimeout(total=ROUTER_TIMEOUT_S)
                                         ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("router %d did not answer %s: %r", index, path, exc)
            return None

    def _indexes(self) -> range:
        return range(len(self.supervisor.children))

    # -- routes -------------------------------------------------------------------------------
    async def _metrics(self, request: web.Request) -> web.Response:
        results = await asyncio.gather(*(self._get(i, "/metrics", _OPENMETRICS)
                                         for i in self._indexes()))
        scrapes: dict[str, str | None] = {}
        restarts: dict[str, int] = {}
        for child, result in zip(self.supervisor.children, results, strict=True):
            ok = result is not None and result[0] == 200
            scrapes[child.router_id] = result[1].decode("utf-8", "replace") if ok else None
            restarts[child.router_id] = child.restarts
        families = merge_metrics(scrapes, restarts)
        if self.metadata is not None:
            status = await self.metadata.status(voters=True)
            families += metadata_metrics(status)
            if self.feed is not None:
                liveness = loghealth.node_liveness(self.cluster, status)
                health = loghealth.log_health(self.feed.records, liveness, 0)
                families += raft_log_metrics(status, liveness, health)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))  # type: ignore[arg-type]
        if "application/openmetrics-text" in request.headers.get("Accept", ""):
            return web.Response(body=openmetrics.generate_latest(registry),
                                headers={"Content-Type": openmetrics.CONTENT_TYPE_LATEST})
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        results = await asyncio.gather(*(self._get(i, "/readyz") for i in self._indexes()))
        routers: dict[str, str] = {}
        for child, result in zip(self.supervisor.children, results, strict=True):
            if result is None:
                routers[child.router_id] = child.state if child.state != "up" else "no answer"
            elif result[0] == 200:
                routers[child.router_id] = "ready"
            else:
                try:
                    reason = json.loads(result[1]).get("reason", f"HTTP {result[0]}")
                except (ValueError, AttributeError):
                    reason = f"HTTP {result[0]}"
                routers[child.router_id] = str(reason)
        not_ready = {rid: why for rid, why in routers.items() if why != "ready"}
        # The supervisor's PID: a starter (dev-cluster) knows it is asking its own process, not
        # another broker that holds the admin port.
        if not not_ready:
            return web.json_response({"status": "ready", "routers": routers,
                                      "pid": os.getpid()})
        reason = "; ".join(f"router {rid}: {why}" for rid, why in not_ready.items())
        return web.json_response({"status": "not ready", "reason": reason, "routers": routers,
                                  "pid": os.getpid()}, status=503)

    async def _cluster(self, request: web.Request) -> web.Response:
        if self.auth is not None:
            refused = await self.auth.refusal(request)
            if refused is not None:
                return refused
        headers = _forward_headers(request)
        results = await asyncio.gather(*(self._get(i, "/api/v1/cluster", headers)
                                         for i in self._indexes()))
        routers: list[dict[str, Any]] = []
        for child, result in zip(self.supervisor.children, results, strict=True):
            entry = child.status()
            if result is None:
                entry["mesh"] = None
                entry["error"] = "router not up" if child.state != "up" else "no answer"
            elif result[0] in (401, 403):
                return web.Response(status=result[0], body=result[1],
                                    content_type="application/json")
            elif result[0] == 200:
                try:
                    entry["mesh"] = json.loads(result[1])
                except ValueError:
                    entry["mesh"], entry["error"] = None, "router answered invalid JSON"
            else:
                entry["mesh"] = None
                entry["error"] = ("no mesh in this router" if result[0] == 404
                                  else f"router answered HTTP {result[0]}")
            routers.append(entry)
        c = self.cluster
        doc: dict[str, Any] = {
            "cluster": c.name, "node": c.node_id, "routers_per_node": c.routers,
            "nodes": [{"id": n.id, "host": n.host, "port": n.port} for n in c.nodes],
            "router_ids": c.router_ids(), "routers": routers, "placement": c.placement,
        }
        if self.metadata is not None:
            meta = doc["metadata"] = await self.metadata.status(voters=True)
            if self.feed is not None:
                try:
                    limit = int(request.query.get("limit", loghealth.DEFAULT_LIMIT))
                except ValueError:
                    return web.json_response({"error": "limit must be an integer"},
                                             status=400)
                liveness = loghealth.node_liveness(self.cluster, meta)
                doc["node_liveness"] = liveness
                doc["logs"] = loghealth.log_health(self.feed.records, liveness, limit)
        device = request.query.get("device")
        if device is not None:
            leader = self.placement.leader_of(device)
            owner = leader.router
            doc["owner"] = {"device": device, "router": owner, "epoch": leader.epoch,
                            "local": owner is not None
                            and owner.rpartition("/")[0] == c.node_id}
            if self.feed is not None:  # Raft's record: the log's ISR and replicas too
                rec = self.feed.records.get(device) or {}
                doc["owner"].update(isr=rec.get("isr"), replicas=rec.get("replicas"),
                                    floor=rec.get("floor", 0), lost=rec.get("lost"),
                                    target=rec.get("target"))
        return web.json_response(doc)

    async def _rebalance(self, request: web.Request) -> web.Response:
        """``POST /api/v1/cluster/rebalance?dry_run=1&max_moves=N``: the plan
        (cluster/rebalance.py) from this node's Raft records; without ``dry_run`` also its
        commands, proposed to Raft, each answered (applied, or refused with the record as it
        is: a compare-and-set computed from a stale record is never applied)."""
        refused = None if self.auth is None else await self.auth.refusal(request)
        if refused is not None:  # it changes placement: the admin credentials, always
            return refused
        if self.feed is None or self.metadata is None:
            return web.json_response({"error": "rebalance needs cluster.placement = "
                                      "\"raft\" (static placement is a hash)"}, status=409)
        try:
            max_moves = int(request.query.get("max_moves", 1000))
        except ValueError:
            return web.json_response({"error": "max_moves must be an integer"}, status=400)
        records = dict(self.feed.records)
        moves = rebalance.plan(records, [n.id for n in self.cluster.nodes], max_moves)
        doc: dict[str, Any] = {"logs": len(records), "moves": moves,
                               "dry_run": request.query.get("dry_run") not in (None, "0")}
        if doc["dry_run"]:
            return web.json_response(doc)
        doc["results"] = await self._propose_moves(rebalance.commands(moves, records))
        return web.json_response(doc)

    async def _progress(self, request: web.Request) -> web.Response:
        """``POST /api/v1/cluster/rebalance/progress`` with ``{"moves": [...]}`` (the moves a
        rebalance answered): where each stands, from this node's Raft records
        (``rebalance.progress``), after proposing the ``elect`` of each whose replicas moved
        and whose planned leader is in sync but not leading yet. ``meshmq cluster
        rebalance`` polls it until every move is done or cannot finish."""
        refused = None if self.auth is None else await self.auth.refusal(request)
        if refused is not None:  # it may propose elections: the admin credentials, always
            return refused
        if self.feed is None or self.metadata is None:
            return web.json_response({"error": "rebalance needs cluster.placement = "
                                      "\"raft\""}, status=409)
        try:
            body = await request.json()
            moves = body["moves"]
            if not isinstance(moves, list) or not all(
                    isinstance(m, dict) and isinstance(m.get("device"), str)
                    and isinstance(m.get("new_replicas"), list) and m.get("new_replicas")
                    and isinstance(m.get("new_leader"), str) for m in moves):
                raise ValueError("each move needs device, new_leader and new_replicas")
        except (ValueError, KeyError, TypeError) as err:
            return web.json_response({"error": f"expected {{\"moves\": [...]}}: {err}"},
                                     status=400)
        meta = await self.metadata.status(voters=True)
        alive = {n["id"]: n["alive"] for n in loghealth.node_liveness(self.cluster, meta)}
        records = dict(self.feed.records)
        known = bool(alive) and all(v is not None for v in alive.values())
        stuck = {m["device"] for m in moves if known
                 and loghealth.is_stuck(records.get(m["device"]) or {}, alive)}
        states, elects = rebalance.progress(moves, records, stuck)
        results = await self._propose_moves([(c[1], c) for c in elects]) if elects else []
        return web.json_response({"moves": states, "elections": results})

    async def _cancel(self, request: web.Request) -> web.Response:
        """``POST /api/v1/cluster/rebalance/cancel[?device=D]``: every reassignment still in
        progress (or D's) given up: ``cancel_reassign`` proposed per log (cluster/metastate.py:
        replicas back to the old ones; a compare-and-set on the epoch, so a move the
        controller completed meanwhile is refused, not undone)."""
        refused = None if self.auth is None else await self.auth.refusal(request)
        if refused is not None:  # it changes placement: the admin credentials, always
            return refused
        if self.feed is None or self.metadata is None:
            return web.json_response({"error": "rebalance needs cluster.placement = "
                                      "\"raft\""}, status=409)
        only = request.query.get("device")
        records = dict(self.feed.records)
        if only is not None and only not in records:
            return web.json_response({"error": f"no log for device {only!r}"}, status=404)
        cmds = [(d, ["cancel_reassign", d, rec["epoch"]]) for d, rec in sorted(records.items())
                if "target" in rec and (only is None or d == only)]
        results = await self._propose_moves(cmds) if cmds else []
        return web.json_response({"logs": len(records), "cancelled": results})

    async def _propose_moves(self, cmds: list[tuple[str, list]]) -> list[dict[str, Any]]:
        assert self.metadata is not None
        client = MetadataClient(self.metadata.socket)
        await client.connect()
        try:
            out = []
            for device, cmd in cmds:
                if cmd[0] == "skip":  # a leader move whose new leader is not in sync yet:
                    # elected once it is (``_progress``), so not a refusal
                    out.append({"device": device, "applied": False, "deferred": True,
                                "why": cmd[1]})
                    continue
                try:
                    applied, rec = await asyncio.wait_for(client.propose(cmd), 10.0)
                    out.append({"device": device, "command": cmd[0], "applied": applied,
                                "record": rec})
                except (MetadataUnavailable, TimeoutError, OSError) as err:
                    # an unknown outcome: the next plan reads the record as it is
                    out.append({"device": device, "command": cmd[0], "applied": None,
                                "why": str(err)})
            return out
        finally:
            client.close_now()

    def _pick(self, device: str | None) -> int | None:
        """The router to proxy to: a local owner of ``device``, else the next one that is up."""
        children = self.supervisor.children
        if device is not None:
            node, _, index = (self.placement.leader_of(device).router or "").rpartition("/")
            if node == self.cluster.node_id and self.supervisor.admin_port(int(index)):
                return int(index)
        for _ in range(len(children)):
            i = self._next % len(children)
            self._next += 1
            if self.supervisor.admin_port(i) is not None:
                return i
        return None

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        device = None
        if tail.startswith("logs/"):
            device = unquote(tail[len("logs/"):].split("/", 1)[0]) or None
        index = self._pick(device)
        base = None if index is None else self._base(index)
        if base is None or self._session is None:
            return _unavailable()
        body = await request.read() if request.can_read_body else None
        try:
            async with self._session.request(request.method, base + request.path_qs,
                                             headers=_forward_headers(request),
                                             data=body, allow_redirects=False) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        response.headers.add(name, value)
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                async for chunk in upstream.content.iter_chunked(64 * 1024):
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("proxying %s to router %s failed: %r", request.path, index, exc)
            return _unavailable(f"router {index} did not answer")


def _forward_headers(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}


def _unavailable(reason: str = "no router of this node is up") -> web.Response:
    return web.json_response({"error": reason}, status=503)
