"""The node's admin HTTP server: ``/metrics``, ``/healthz``, ``/readyz``, and room for more.

Why aiohttp: it is already a dependency (the WebSocket listener and the commit-log fetch API use
it), it runs on the node's event loop, and a real HTTP server library handles keep-alive, HEAD,
chunking and malformed requests that a hand-rolled parser would get wrong. ``app`` is public so
later features add routes (``server.app.router.add_get(...)``) before ``start()``.

Probes follow Kubernetes' split: ``/healthz`` says the process is alive (restart it if not);
``/readyz`` says it should receive traffic (take it out of the load balancer if not), with a JSON
reason so the operator sees *why* in ``curl`` or the probe event.

The admin port should stay on loopback or a management network (default ``127.0.0.1:9883``).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from meshmq.config import parse_bind
from meshmq.metrics import MetricsRegistry

__all__ = ["AdminServer", "METRICS_CONTENT_TYPE"]

log = logging.getLogger("meshmq.admin")

# Always the classic Prometheus text format, whatever the scraper's Accept header says: in
# OpenMetrics the gauge ``meshmq_connections`` and the counter ``meshmq_connections_total`` would
# be one family name twice. Prometheus accepts this format from every version.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"



def bound_port(runner: web.AppRunner | None, configured: int) -> int:
    """The port an aiohttp runner really listens on (``configured`` before it starts): the one
    the kernel picked when the bind asked for port 0."""
    if runner is not None:
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                return int(address[1])
    return configured

class _DebugAccessLogger(AbstractAccessLogger):
    """Access lines at DEBUG: a scrape every 15 s should not fill the INFO log."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.debug("%s %s %s", request.method, request.path_qs, response.status,
                          extra={"peer": request.remote, "duration_s": round(time, 6)})

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG)


class AdminServer:
    """Serves the admin routes on ``bind`` ("host:port"; port 0 picks a free one, see ``port``).

    ``registry`` is the node's ``MetricsRegistry`` (or a bare prometheus ``CollectorRegistry``).
    ``ready()`` decides ``/readyz``; ``reason()``, when given, explains a False in the 503 body.
    """

    def __init__(self, bind: str, registry: MetricsRegistry | CollectorRegistry,
                 ready: Callable[[], bool], reason: Callable[[], str] | None = None, *,
                 middlewares: Iterable[Any] = (),
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.host, self._port = parse_bind(bind)
        self.registry = registry.registry if isinstance(registry, MetricsRegistry) else registry
        self._ready = ready
        self._reason = reason
        self._ssl = ssl_context  # admin.certfile/keyfile: HTTPS on the admin bind
        self.app = web.Application(middlewares=list(middlewares))
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one after ``start()`` when the bind asked for port 0)."""
        return bound_port(self._runner, self._port)

    async def start(self) -> None:
        """Bind and start serving; raises ``OSError`` if the address is taken."""
        if self._runner is not None:
            return
        runner = web.AppRunner(self.app, access_log_class=_DebugAccessLogger,
                               access_log=logging.getLogger("meshmq.admin.access"),
                               handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self._port, reuse_address=True,
                               ssl_context=self._ssl)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("admin server listening", extra={"bind": f"{self.host}:{self.port}",
                                                  "tls": self._ssl is not None})

    async def stop(self) -> None:
        """Stop listening and close open admin connections."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        # OpenMetrics for scrapers that ask for it (Prometheus does, with exemplars/created
        # series); the classic text format otherwise.
        if "application/openmetrics-text" in request.headers.get("Accept", ""):
            return web.Response(body=openmetrics.generate_latest(self.registry),
                                headers={"Content-Type": openmetrics.CONTENT_TYPE_LATEST})
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            ready = bool(self._ready())
            reason = "" if ready or self._reason is None else self._reason()
        except Exception as exc:  # a broken check must read as "not ready", not as a 500
            log.exception("readiness check failed")
            ready, reason = False, f"readiness check failed: {exc}"
        if ready:
            return web.json_response({"status": "ready"})
        return web.Response(status=503, content_type="application/json",
                            text=json.dumps({"status": "not ready",
                                             "reason": reason or "not ready"}))
