"""Prometheus metrics for a node, read from plain counters at scrape time.

Why a custom collector: the broker counts in plain ints (``broker.stats.BrokerStats``) because a
prometheus-client ``Counter.inc()`` takes a lock and does float maths on every message. The
collector below turns those ints into metric families only when Prometheus scrapes, the pattern
prometheus-client documents for proxying another system's counters.

Why a dedicated ``CollectorRegistry``: the global default registry is shared by every library in
the process and by every test in a pytest run; a node-owned registry makes two nodes in one
process (tests, benchmarks) report separately.

More sources plug in with ``MetricsRegistry.add_collector(fn)``: ``fn`` returns metric families
at scrape time (the commit log's stats are next). A source that raises is logged and skipped so
one broken source cannot turn ``/metrics`` into a 500 for all the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, GCCollector, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.stats import PACKET_NAMES, BrokerStats, DropReason

__all__ = ["MetricsRegistry", "LoopLagMonitor", "RouterGauges", "LOOP_LAG_BUCKETS"]

log = logging.getLogger("meshmq.metrics")

RouterGauges = Callable[[], Mapping[str, int]]
"""Returns ``{"sessions": n, "subscriptions": n, "retained_messages": n, "connections": n}``."""

# Lag from a few ms (normal) to seconds (a blocking call on the loop): that tail is what matters.
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_DROP_REASONS = tuple(
    v for k, v in vars(DropReason).items() if not k.startswith("_") and isinstance(v, str))

_ROUTER_GAUGES = (
    ("sessions", "meshmq_sessions", "Sessions held by this node, connected or not."),
    ("subscriptions", "meshmq_subscriptions", "Subscriptions held by this node."),
    ("retained_messages", "meshmq_retained_messages", "Retained messages stored."),
    ("connections", "meshmq_clients_connected",
     "Clients past CONNACK, as the router counts them (meshmq_connections counts sockets)."),
)


class _FunctionCollector(Collector):
    """Adapts ``fn() -> Iterable[Metric]`` to prometheus-client's collector protocol."""

    def __init__(self, fn: Callable[[], Iterable[Metric]], name: str) -> None:
        self._fn = fn
        self._name = name

    def collect(self) -> Iterator[Metric]:
        try:
            metrics = list(self._fn())
        except Exception:
            log.exception("metrics source failed; skipped in this scrape",
                          extra={"source": self._name})
            return iter(())
        return iter(metrics)


class _BrokerCollector(Collector):
    """Broker counters and router gauges, built fresh on each scrape."""

    def __init__(self, stats: BrokerStats, router_gauges: RouterGauges | None) -> None:
        self.stats = stats
        self.router_gauges = router_gauges

    # No describe(): prometheus-client derives the family name "meshmq_connections" both from
    # the gauge and from the counter meshmq_connections_total, and unregister() (add_broker
    # replacing a source) would then fail on the repeated name.

    def collect(self) -> Iterator[Metric]:
        return iter(self._families())

    def _families(self) -> list[Metric]:
        s = self.stats
        conns = GaugeMetricFamily("meshmq_connections", "Open client connections (sockets).",
                                  labels=["listener"])
        conns_total = CounterMetricFamily("meshmq_connections_total",
                                          "Client connections accepted.", labels=["listener"])
        rejected = CounterMetricFamily(
            "meshmq_connections_rejected_total",
            "Connections closed before a successful CONNACK (bad CONNECT, auth, TLS errors).",
            labels=["listener"])
        bytes_in = CounterMetricFamily("meshmq_bytes_received_total", "Bytes read from clients.",
                                       labels=["listener"])
        bytes_out = CounterMetricFamily("meshmq_bytes_sent_total", "Bytes written to clients.",
                                        labels=["listener"])
        pk_in = CounterMetricFamily("meshmq_packets_received_total", "MQTT packets received.",
                                    labels=["type"])
        pk_out = CounterMetricFamily("meshmq_packets_sent_total", "MQTT packets sent.",
                                     labels=["type"])
        msg_in = CounterMetricFamily("meshmq_messages_received_total",
                                     "PUBLISH messages accepted from clients.")
        msg_out = CounterMetricFamily("meshmq_messages_sent_total",
                                      "PUBLISH messages written to subscribers.")
        dropped = CounterMetricFamily(
            "meshmq_messages_dropped_total",
            "Messages that did not reach a subscriber, by reason (never silent).",
            labels=["reason"])
        proto = CounterMetricFamily("meshmq_protocol_errors_total",
                                    "Connections closed for protocol violations.")
        auth = CounterMetricFamily("meshmq_auth_failures_total",
                                   "CONNECTs refused for bad credentials or authorisation.")
        families: list[Metric] = [conns, conns_total, rejected, bytes_in, bytes_out, pk_in, pk_out,
                                  msg_in, msg_out, dropped, proto, auth]
        gauges = [(key, GaugeMetricFamily(name, doc)) for key, name, doc in _ROUTER_GAUGES]
        families.extend(g for _, g in gauges)

        for name, ls in sorted(s.listeners.items()):
            conns.add_metric([name], ls.connections_current)
            conns_total.add_metric([name], ls.connections_total)
            rejected.add_metric([name], ls.rejected)
            bytes_in.add_metric([name], ls.bytes_in)
            bytes_out.add_metric([name], ls.bytes_out)
        # Every packet type and drop reason, zeros included: a series that appears only after
        # its first event breaks rate() and alerting on "absent".
        for code in range(1, len(PACKET_NAMES)):
            pk_in.add_metric([PACKET_NAMES[code]], s.packets_in[code])
            pk_out.add_metric([PACKET_NAMES[code]], s.packets_out[code])
        msg_in.add_metric([], s.messages_in)
        msg_out.add_metric([], s.messages_out)
        for reason in sorted(set(_DROP_REASONS) | set(s.messages_dropped)):
            dropped.add_metric([reason], s.messages_dropped.get(reason, 0))
        proto.add_metric([], s.protocol_errors)
        auth.add_metric([], s.auth_failures)

        values: Mapping[str, int] = {}
        if self.router_gauges is not None:
            try:
                values = self.router_gauges()
            except Exception:
                log.exception("router gauges failed; reporting them as absent")
                values = {}
        for key, family in gauges:
            if key in values:
                family.add_metric([], values[key])
        return families


class MetricsRegistry:
    """The node's metrics: broker counters, router gauges, loop lag, process, and add-ons.

    ``registry`` is the prometheus-client ``CollectorRegistry`` the admin server renders. The
    broker's sources can be given here or later with ``add_broker`` (the node builds the metrics
    before the router exists).
    """

    def __init__(self, stats: BrokerStats | None = None,
                 router_gauges: RouterGauges | None = None) -> None:
        self.registry = CollectorRegistry()
        self._broker: _BrokerCollector | None = None
        # Observed four times a second by LoopLagMonitor, so a real Histogram's lock is harmless.
        self.loop_lag = Histogram(
            "meshmq_event_loop_lag_seconds",
            "How late the event loop woke a 0.25 s sleep: time blocked by work on the loop.",
            buckets=LOOP_LAG_BUCKETS, registry=self.registry)
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        if stats is not None:
            self.add_broker(stats, router_gauges)

    def add_broker(self, stats: BrokerStats, router_gauges: RouterGauges | None = None) -> None:
        """Expose ``stats`` (read at scrape time) and the router's gauges; replaces a previous
        broker source, so a restarted router can be attached again."""
        if self._broker is not None:
            self.registry.unregister(self._broker)
        self._broker = _BrokerCollector(stats, router_gauges)
        self.registry.register(self._broker)

    def set_router_gauges(self, fn: RouterGauges | None) -> None:
        """Attach the router's gauge callable to the broker source added earlier."""
        if self._broker is None:
            raise RuntimeError("add_broker(stats) first")
        self._broker.router_gauges = fn

    def add_collector(self, fn: Callable[[], Iterable[Metric]], name: str = "") -> None:
        """Add a source called at every scrape; ``fn`` returns prometheus ``Metric`` families.

        Example: ``metrics.add_collector(lambda: [GaugeMetricFamily("meshmq_x", "doc", 1)])``.
        """
        self.registry.register(_FunctionCollector(fn, name or getattr(fn, "__name__", "?")))


class LoopLagMonitor:
    """Measures event-loop lag: sleep ``interval`` and record how much later than asked we woke.

    A healthy loop oversleeps by well under a millisecond; tens of milliseconds mean something
    blocks the loop (a large synchronous write, hashing on the loop, GC pauses) and every client
    on the node waits that long. ``last_lag`` is kept for readiness checks.
    """

    def __init__(self, target: MetricsRegistry | Histogram, interval: float = 0.25) -> None:
        self._histogram = target.loop_lag if isinstance(target, MetricsRegistry) else target
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self.last_lag = 0.0

    def start(self) -> None:
        """Start measuring on the running loop (call from inside it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="meshmq-loop-lag")

    def stop(self) -> None:
        """Cancel the measuring task (synchronous: it holds nothing that needs awaiting)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self._interval)
            lag = max(0.0, loop.time() - start - self._interval)
            self.last_lag = lag
            self._histogram.observe(lag)
