"""Prometheus metrics for a node, read from plain counters at scrape time.

Why a custom collector: the broker counts in plain ints (``broker.stats.BrokerStats``) because a
prometheus-client ``Counter.inc()`` takes a lock and does float maths on every message. The
collector below turns those ints into metric families only when Prometheus scrapes, the pattern
prometheus-client documents for proxying another system's counters.

Why a dedicated ``CollectorRegistry``: the global default registry is shared by every library in
the process and by every test in a pytest run; a node-owned registry makes two nodes in one
process (tests, benchmarks) report separately.

More sources plug in with ``MetricsRegistry.add_collector(fn)``: ``fn`` returns metric families
at scrape time. A source that raises is logged and skipped so one broken source cannot turn
``/metrics`` into a 500 for all the others. The commit log has its own ``add_commitlog``: its
``LogStats`` are plain ints for the same reason as the broker's.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, GCCollector, Histogram, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from broker.limits import LIMIT_NAMES
from broker.protocol import codec
from broker.stats import PACKET_NAMES, TLS_HANDSHAKE_FAILURES, BrokerStats, DropReason
from commitlog import record
from commitlog.stats import FSYNC_BUCKETS_S, LogStats
from commitlog.store import LogStore

__all__ = ["MetricsRegistry", "LoopLagMonitor", "RouterGauges", "LOOP_LAG_BUCKETS",
           "raft_log_metrics"]

log = logging.getLogger("meshmq.metrics")

RouterGauges = Callable[[], Mapping[str, int]]
"""Returns ``{"sessions": n, "subscriptions": n, "retained_messages": n, "connections": n}``."""

# A young collection takes well under a millisecond; a full one over a big heap, tens of ms.
GC_PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
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
    ("queued_messages", "meshmq_queued_messages",
     "Deliveries waiting in sessions' in-memory queues (window full or client offline)."),
    ("inflight_messages", "meshmq_inflight_messages",
     "QoS 1/2 deliveries sent and not yet acknowledged, over all sessions."),
    ("retained_bytes", "meshmq_retained_bytes", "Payload bytes of the retained messages."),
    ("sessions_lagging", "meshmq_sessions_lagging",
     "Sessions behind on at least one device log, fed from the log (a lag, not a drop)."),
    ("lag_messages", "meshmq_lag_messages",
     "Logged messages lagging sessions have still to receive, summed over sessions and devices "
     "(per session: GET /api/v1/lag)."),
    ("offline_sessions", "meshmq_sessions_offline",
     "Sessions kept for offline clients (bounded by mqtt.max_offline_sessions)."),
    ("retained_pending", "meshmq_retained_pending",
     "Retained messages owed to new subscribers, waiting for room in their window or socket "
     "(paced, never dropped: broker/retainpace.py)."),
    ("retained_paced_sessions", "meshmq_retained_paced_sessions",
     "Sessions still being sent the retained messages of a SUBSCRIBE."),
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
        # Not "meshmq_connections": that family name clashes with the counter
        # meshmq_connections_total under OpenMetrics, and meshmq_clients_connected counts clients.
        conns = GaugeMetricFamily("meshmq_listener_sockets",
                                  "Open sockets per listener (clients, and connections not past "
                                  "CONNACK yet).", labels=["listener"])
        conns_total = CounterMetricFamily("meshmq_connections_total",
                                          "Client connections accepted.", labels=["listener"])
        rejected = CounterMetricFamily(
            "meshmq_connections_rejected_total",
            "Connections closed before a successful CONNACK (bad CONNECT, auth, TLS on the plain "
            "port); failed TLS handshakes are in meshmq_tls_handshake_failures_total.",
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
        qos_in = CounterMetricFamily("meshmq_messages_received_qos_total",
                                     "PUBLISH messages accepted from clients, by QoS.",
                                     labels=["qos"])
        qos_out = CounterMetricFamily("meshmq_messages_sent_qos_total",
                                      "PUBLISH messages written to subscribers, by delivered QoS.",
                                      labels=["qos"])
        acl = CounterMetricFamily("meshmq_authorization_total",
                                  "ACL decisions by action (publish, subscribe, deliver) and "
                                  "result (allow, deny); only counted with an acl_file.",
                                  labels=["action", "result"])
        peak = GaugeMetricFamily("meshmq_clients_connected_max",
                                 "Most clients connected at once since start "
                                 "($SYS/broker/clients/maximum).", value=s.clients_connected_max)
        dropped = CounterMetricFamily(
            "meshmq_messages_dropped_total",
            "Messages that did not reach a subscriber, by reason (never silent).",
            labels=["reason"])
        proto = CounterMetricFamily("meshmq_protocol_errors_total",
                                    "Connections closed for protocol violations.")
        auth = CounterMetricFamily("meshmq_auth_failures_total",
                                   "CONNECTs refused for bad credentials or authorisation.")
        tls_failed = CounterMetricFamily(
            "meshmq_tls_handshake_failures_total",
            "TLS listener handshakes that failed, by reason (client_certificate: missing or not "
            "signed by listener.tls.cafile; server_certificate: the client does not trust ours; "
            "not_tls: plain MQTT or other bytes; timeout; closed: "
            "the peer left mid-handshake, e.g. a TCP probe; tls_error: anything else).",
            labels=["listener", "reason"])
        long_reads = CounterMetricFamily(
            "meshmq_long_reads_total",
            "Socket reads whose packets took over 2 ms to route (a backlog; the router wrote "
            "partial results mid-read). A rising rate means the node is behind its input.",
            value=s.long_reads)
        lag_limit = CounterMetricFamily(
            "meshmq_lag_limit_hits_total",
            "Logged messages queued in memory instead of read from the log because their session "
            "was already behind on mqtt.max_lagging_devices device logs (the queue's policy then "
            "applies to them).", value=s.lag_limit_hits)
        log_read_retries = CounterMetricFamily(
            "meshmq_log_read_retries_total",
            "Reads of a device log another router leads (offset replay, catch-up) that failed "
            "(owner unreachable, link down, no answer) and are tried again after 1 s. A rising "
            "rate means an owner router is down or its link is failing: see the WARNING lines "
            "naming it.", value=s.log_read_retries)
        for q in range(3):
            qos_in.add_metric([str(q)], s.messages_in_qos[q])
            qos_out.add_metric([str(q)], s.messages_out_qos[q])
        for action in ("publish", "subscribe", "deliver"):
            for result in ("allow", "deny"):
                acl.add_metric([action, result], s.acl_decisions.get((action, result), 0))
        client_errors = CounterMetricFamily(
            "meshmq_client_errors_total",
            "Connections closed because handling one of their packets raised (logged at ERROR "
            "with the client id and a traceback); other clients are not affected.",
            value=s.client_errors)
        limits = CounterMetricFamily(
            "meshmq_limit_hits_total",
            "Times a configured resource limit refused or closed something, by limit (named "
            "after its config key).", labels=["limit"])
        for limit in sorted(set(LIMIT_NAMES) | set(s.limit_hits)):
            limits.add_metric([limit], s.limit_hits.get(limit, 0))
        families: list[Metric] = [conns, conns_total, rejected, bytes_in, bytes_out, pk_in, pk_out,
                                  msg_in, msg_out, qos_in, qos_out, acl, peak, dropped, proto,
                                  auth, tls_failed, long_reads, lag_limit, log_read_retries,
                                  client_errors, limits]
        gauges = [(key, GaugeMetricFamily(name, doc)) for key, name, doc in _ROUTER_GAUGES]
        families.extend(g for _, g in gauges)

        for name, ls in sorted(s.listeners.items()):
            conns.add_metric([name], ls.connections_current)
            conns_total.add_metric([name], ls.connections_total)
            rejected.add_metric([name], ls.rejected)
            bytes_in.add_metric([name], ls.bytes_in)
            bytes_out.add_metric([name], ls.bytes_out)
            if name == "tls":
                for reason in TLS_HANDSHAKE_FAILURES:
                    tls_failed.add_metric([name, reason], ls.tls_handshake_failures.get(reason, 0))
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


# (LogStats attribute, metric name, help) of the commit log's monotonic counters.
_LOG_COUNTERS = (
    ("appends", "meshmq_log_appends_total", "Records written to the commit log."),
    ("append_bytes", "meshmq_log_append_bytes_total",
     "Bytes written to the commit log's segment files (record framing included)."),
    ("batches", "meshmq_log_batches_total",
     "Write batches (one write() each; group commit puts a whole event-loop tick in one)."),
    ("write_errors", "meshmq_log_write_errors_total",
     "Failed segment writes (ENOSPC, EIO...): publishes are refused until the disk recovers."),
    ("fsync_errors", "meshmq_log_fsync_errors_total", "Failed fsyncs of the commit log."),
    ("segments_rolled", "meshmq_log_segments_rolled_total", "New segment files started."),
    ("retention_segments_deleted", "meshmq_log_retention_deleted_segments_total",
     "Segment files deleted by retention."),
    ("retention_bytes_deleted", "meshmq_log_retention_deleted_bytes_total",
     "Bytes of segment files deleted by retention."),
    ("retention_held_by_hwm", "meshmq_log_retention_held_by_hwm_total",
     "Retention passes that kept a device log's start at its high-water mark: records not "
     "yet committed (a follower behind) are never deleted; their segments wait for it."),
    ("recovery_truncations", "meshmq_log_recovery_truncations_total",
     "Torn or corrupt tails cut off by recovery at start (each logged as a WARNING)."),
    ("recovery_truncated_bytes", "meshmq_log_recovery_truncated_bytes_total",
     "Bytes cut off by recovery at start."),
    ("tail_cache_hits", "meshmq_log_tail_cache_hits_total",
     "Reads served from the in-memory tail cache."),
    ("tail_cache_misses", "meshmq_log_tail_cache_misses_total",
     "Reads that had to go to the segment files (at least partly)."),
    ("tail_cache_evictions", "meshmq_log_tail_cache_evictions_total",
     "Device tail caches dropped to stay under tail_cache_bytes_total."),
    ("disk_reads", "meshmq_log_disk_reads_total", "Reads that scanned segment files."),
    ("checkpoints", "meshmq_log_checkpoints_total", "Index checkpoints written."),
    ("index_rebuilds", "meshmq_log_index_rebuilds_total",
     "Starts without a usable checkpoint (full rescan of the segments)."),
    ("corrupt_records", "meshmq_log_corrupt_records_total",
     "Corrupt byte ranges with intact records after them, found by recovery or by a "
     "reader and moved to quarantine/ (each logged at ERROR with device, offsets and bytes)."),
    ("corrupt_bytes", "meshmq_log_corrupt_bytes_total",
     "Bytes of the corrupt ranges moved to quarantine/ by recovery or a reader."),
)


class _CommitLogCollector(Collector):
    """The commit log's ``LogStats`` and the store's sizes, read at scrape time.

    Runs on the event loop thread (the admin server renders there), the only thread allowed to
    look at the store's device table. The fsync fields are written by the fsync worker; each is
    one int, so a scrape may see them one observation apart, never torn."""

    def __init__(self, stats: LogStats, store: LogStore) -> None:
        self.stats = stats
        self.store = store

    def collect(self) -> Iterator[Metric]:
        return iter(self._families())

    def _families(self) -> list[Metric]:
        s = self.stats
        out: list[Metric] = []
        for attr, name, doc in _LOG_COUNTERS:
            out.append(CounterMetricFamily(name, doc, value=getattr(s, attr)))
        # The stats keep only a count and a sum of records per batch: a summary without
        # quantiles is exactly what they can honestly back (mean = sum / count).
        out.append(SummaryMetricFamily(
            "meshmq_log_batch_records", "Records per write batch (count and sum).",
            count_value=s.batches, sum_value=s.batch_records_sum))
        # LogStats counts each fsync in the first bucket it fits (not cumulative); Prometheus
        # buckets are cumulative, so they are summed here.
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(FSYNC_BUCKETS_S, list(s.fsync_buckets), strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        if not buckets or buckets[-1][0] != "+Inf":  # pragma: no cover - defensive
            buckets.append(("+Inf", running))
        out.append(HistogramMetricFamily(
            "meshmq_log_fsync_seconds", "Duration of commit-log fsyncs (what QoS 1 acks wait on).",
            buckets=buckets, sum_value=s.fsync_seconds_sum))
        segments = self.store.segments
        out.append(GaugeMetricFamily("meshmq_log_devices",
                                     "Device logs in the store (including emptied ones).",
                                     value=len(self.store.keys())))
        out.append(GaugeMetricFamily("meshmq_log_segments", "Segment files of the store.",
                                     value=len(segments)))
        out.append(GaugeMetricFamily(
            "meshmq_log_bytes",
            "Bytes in the store's segment files on disk (written, maybe not yet fsynced).",
            value=sum(seg.size for seg in segments)))
        out.append(GaugeMetricFamily(
            "meshmq_log_writable",
            "1 while the commit log stores publishes; 0 after a write/fsync failure (ENOSPC, "
            "EIO) until a probe write succeeds: publishes are refused meanwhile.",
            value=s.writable))
        out.append(GaugeMetricFamily("meshmq_log_tail_cache_bytes",
                                     "Bytes held by the tail cache.", value=s.tail_cache_bytes))
        return out


def fast_paths() -> dict[str, bool]:
    """Which optional C extensions this process runs (False: built without a compiler, or
    switched off with BROKER_PURE_PYTHON / COMMITLOG_PURE_PYTHON / CLUSTER_PURE_PYTHON)."""
    from cluster import frames  # the mesh entry codec (cluster/_speedups.c, issue 25)

    return {"codec": codec.SPEEDUPS, "commitlog": record.SPEEDUPS, "mesh": frames.SPEEDUPS}


def _fast_path_gauges() -> list[Metric]:
    # A failed build falls back to pure Python silently (by design: the install must work
    # without a compiler); an operator graphing CPU per message needs to see which one runs.
    g = GaugeMetricFamily(
        "meshmq_compiled_fast_path",
        "1 when the part's optional C loop is in use, 0 when it runs pure Python (slower).",
        labels=["part"])
    for part, on in fast_paths().items():
        g.add_metric([part], 1.0 if on else 0.0)
    # The usual *_build_info pattern: a constant 1 whose labels say what is running.
    info = GaugeMetricFamily("meshmq_build_info", "Always 1; labels: meshmq and Python versions.",
                             labels=["version", "python"])
    info.add_metric([_meshmq_version(), platform.python_version()], 1.0)
    return [g, info]


def _meshmq_version() -> str:
    from meshmq import __version__

    return __version__


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
        self._commitlog: _CommitLogCollector | None = None
        # Observed four times a second by LoopLagMonitor, so a real Histogram's lock is harmless.
        self.loop_lag = Histogram(
            "meshmq_event_loop_lag_seconds",
            "How late the event loop woke a 0.25 s sleep: time blocked by work on the loop.",
            buckets=LOOP_LAG_BUCKETS, registry=self.registry)
        # Every cyclic-GC run stops the loop; a full one over a large heap is a latency spike
        # that neither loop_lag's 0.25 s sampling nor python_gc_collections_total shows.
        self.gc_pause = Histogram(
            "meshmq_gc_pause_seconds", "Time the cyclic garbage collector stopped the process.",
            ["generation"], buckets=GC_PAUSE_BUCKETS, registry=self.registry)
        self.add_collector(lambda: [GaugeMetricFamily(
            "meshmq_gc_frozen_objects",
            "Objects moved out of the collector's reach at start-up (gc.freeze).",
            value=gc.get_freeze_count())], "gc_frozen")
        self.add_collector(_fast_path_gauges, "fast_paths")
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

    def add_commitlog(self, stats: LogStats, store: LogStore) -> None:
        """Expose the commit log's ``stats`` and ``store`` sizes (read at scrape time as
        ``meshmq_log_*``); replaces a previous commit-log source, so a reopened store can be
        attached again."""
        if self._commitlog is not None:
            self.registry.unregister(self._commitlog)
        self._commitlog = _CommitLogCollector(stats, store)
        self.registry.register(self._commitlog)

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


class GcPauseMonitor:
    """Times every cyclic-GC run through ``gc.callbacks`` into ``meshmq_gc_pause_seconds``.

    A few hundred young-generation runs a second at full load cost ~1 us each to observe.
    Collections never overlap (they run under the GIL, whichever thread triggers them), so one
    start time is enough.
    """

    def __init__(self, metrics: MetricsRegistry) -> None:
        self._children = [metrics.gc_pause.labels(str(g)) for g in range(3)]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._children[info["generation"]].observe(time.perf_counter() - self._started)
            self._started = 0.0

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def raft_log_metrics(status: Mapping[str, object], liveness: list[dict],
                     health: Mapping[str, object]) -> list[Metric]:
    """A cluster node's view of the Raft group and of every device log's Raft record
    (cluster/loghealth.py), emitted by its node admin beside ``meshmq_raft_term`` and the
    other voter gauges. Every node computes the log gauges from the same records, so any one
    scrape target answers for the whole cluster (alert on ``max`` over nodes, not ``sum``).
    The ``meshmq_replica_*`` names are the replica fetcher's (follower lag, ISR changes,
    bytes, acks waiting), defined with it."""
    changes = CounterMetricFamily(
        "meshmq_raft_leader_changes", "Raft leaders this node's voter has seen since it "
        "started (etcd's leader_changes_seen): rising steadily means an unstable group.",
        value=float(status.get("leader_changes") or 0))  # type: ignore[arg-type]
    out: list[Metric] = [changes]
    alive = GaugeMetricFamily(
        "meshmq_node_alive", "1 if the Raft leader sees the node connected, 0 if not; absent "
        "while no Raft leader can say.", labels=["node"])
    for node in liveness:
        if node.get("alive") is not None:
            alive.add_metric([str(node["id"])], 1.0 if node["alive"] else 0.0)
    out.append(alive)
    for key, name, doc in (
            ("logs", "meshmq_logs", "Device logs placed in Raft."),
            ("under_replicated", "meshmq_logs_under_replicated",
             "Device logs with fewer in-sync replicas than replicas (one more failure from "
             "refusing writes when the ISR falls below min_insync_replicas)."),
            ("offline", "meshmq_logs_offline",
             "Device logs with no leader, or a leader on a node the Raft leader does not see: "
             "their publishes are refused until leadership moves or the node returns."),
            ("lost", "meshmq_logs_lost",
             "Device logs whose every replica lost acknowledged records (shorter than their "
             "Raft floor): refused, never restarted at offset 0; see `meshmq cluster status`."),
            ("reassigning", "meshmq_logs_reassigning",
             "Device logs being moved by `meshmq cluster rebalance` (new replicas fetching; "
             "the controller completes each once every target replica is in sync)."),
            ("reassign_stuck", "meshmq_logs_reassign_stuck",
             "Reassignments waiting for a replica being added on a node that is not alive: "
             "they finish when it returns; see `meshmq cluster status`.")):
        value = health.get(key)
        count = value.get("count", 0) if isinstance(value, dict) else value
        out.append(GaugeMetricFamily(name, doc, value=float(count or 0)))  # type: ignore[arg-type]
    return out
