"""meshmq.admin + meshmq.metrics: a real aiohttp server on a free port, fetched with urllib."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from prometheus_client.core import GaugeMetricFamily

from broker.stats import BrokerStats, DropReason
from meshmq.admin import AdminServer
from meshmq.metrics import LoopLagMonitor, MetricsRegistry

EXPECTED_NAMES = [
    'meshmq_listener_sockets{listener="tcp"} 2.0',
    'meshmq_connections_total{listener="tcp"} 5.0',
    'meshmq_connections_rejected_total{listener="tcp"} 1.0',
    'meshmq_bytes_received_total{listener="tcp"} 1000.0',
    'meshmq_bytes_sent_total{listener="tcp"} 2000.0',
    'meshmq_packets_received_total{type="publish"} 7.0',
    'meshmq_packets_sent_total{type="connack"} 3.0',
    'meshmq_packets_received_total{type="auth"} 0.0',
    "meshmq_messages_received_total 7.0",
    "meshmq_messages_sent_total 4.0",
    'meshmq_messages_dropped_total{reason="queue_full"} 2.0',
    'meshmq_messages_dropped_total{reason="slow_consumer"} 0.0',
    "meshmq_protocol_errors_total 1.0",
    "meshmq_auth_failures_total 1.0",
    "meshmq_sessions 3.0",
    "meshmq_subscriptions 11.0",
    "meshmq_retained_messages 4.0",
    "meshmq_clients_connected 2.0",
    "meshmq_event_loop_lag_seconds_bucket",
    "meshmq_event_loop_lag_seconds_count",
    "process_resident_memory_bytes",
    "meshmq_extra_source 42.0",
]


def fetch(url: str) -> tuple[int, str, str]:
    """Blocking GET; callers run it in a thread (on the loop thread it would block the server)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def make_stats() -> BrokerStats:
    stats = BrokerStats()
    tcp = stats.listener("tcp")
    tcp.connections_current, tcp.connections_total, tcp.rejected = 2, 5, 1
    tcp.bytes_in, tcp.bytes_out = 1000, 2000
    stats.packets_in[3] = 7
    stats.packets_out[2] = 3
    stats.messages_in, stats.messages_out = 7, 4
    stats.dropped(DropReason.QUEUE_FULL, 2)
    stats.protocol_errors = 1
    stats.auth_failures = 1
    return stats


def test_admin_server_routes():
    async def scenario() -> None:
        stats = make_stats()
        metrics = MetricsRegistry(stats, lambda: {"sessions": 3, "subscriptions": 11,
                                                  "retained_messages": 4, "connections": 2})
        metrics.add_collector(lambda: [GaugeMetricFamily("meshmq_extra_source", "test", 42)])

        def broken() -> list[GaugeMetricFamily]:
            raise RuntimeError("source down")

        metrics.add_collector(broken, "broken")
        ready = {"value": False}
        monitor = LoopLagMonitor(metrics, interval=0.01)
        server = AdminServer("127.0.0.1:0", metrics.registry, lambda: ready["value"],
                             reason=lambda: "commit log recovering")
        await server.start()
        monitor.start()
        try:
            assert server.port != 0
            base = f"http://127.0.0.1:{server.port}"
            await asyncio.sleep(0.05)

            status, ctype, body = await asyncio.to_thread(fetch, base + "/healthz")
            assert (status, body) == (200, "ok\n")

            status, ctype, body = await asyncio.to_thread(fetch, base + "/readyz")
            assert status == 503 and ctype.startswith("application/json")
            assert json.loads(body) == {"status": "not ready", "reason": "commit log recovering"}
            ready["value"] = True
            status, _, body = await asyncio.to_thread(fetch, base + "/readyz")
            assert status == 200 and json.loads(body)["status"] == "ready"

            status, ctype, body = await asyncio.to_thread(fetch, base + "/metrics")
            assert status == 200 and ctype.startswith("text/plain")
            for name in EXPECTED_NAMES:
                assert name in body, name
            assert "# TYPE meshmq_listener_sockets gauge" in body
            assert "# TYPE meshmq_connections_total counter" in body
            assert "# TYPE meshmq_event_loop_lag_seconds histogram" in body

            # counters are read at scrape time, not copied at start
            stats.messages_in = 100
            _, _, body = await asyncio.to_thread(fetch, base + "/metrics")
            assert "meshmq_messages_received_total 100.0" in body

            status, _, _ = await asyncio.to_thread(fetch, base + "/nope")
            assert status == 404
        finally:
            monitor.stop()
            await server.stop()
        # the port is released on stop
        try:
            await asyncio.to_thread(fetch, f"http://127.0.0.1:{server.port}/healthz")
        except urllib.error.URLError:
            pass
        else:
            raise AssertionError("server still answering after stop()")

    asyncio.run(scenario())


def test_readiness_check_that_raises_is_not_ready():
    async def scenario() -> None:
        def boom() -> bool:
            raise RuntimeError("kaput")

        server = AdminServer("127.0.0.1:0", MetricsRegistry(BrokerStats()), boom)
        await server.start()
        try:
            status, _, body = await asyncio.to_thread(
                fetch, f"http://127.0.0.1:{server.port}/readyz")
            assert status == 503 and "kaput" in json.loads(body)["reason"]
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_loop_lag_monitor_sees_a_blocked_loop():
    async def scenario() -> float:
        metrics = MetricsRegistry(BrokerStats())
        monitor = LoopLagMonitor(metrics.loop_lag, interval=0.01)
        monitor.start()
        await asyncio.sleep(0.03)
        time.sleep(0.2)  # block the loop on purpose
        await asyncio.sleep(0.03)
        monitor.stop()
        samples = {s.name: s.value for m in metrics.registry.collect()
                   if m.name == "meshmq_event_loop_lag_seconds" for s in m.samples
                   if not s.labels or s.labels.get("le") in (None, "0.1")}
        assert samples["meshmq_event_loop_lag_seconds_count"] >= 2
        return samples["meshmq_event_loop_lag_seconds_sum"]

    assert asyncio.run(scenario()) >= 0.15


def test_two_registries_are_independent():
    a = MetricsRegistry(BrokerStats())
    b = MetricsRegistry(BrokerStats())
    assert a.registry is not b.registry


def test_broker_source_added_later_and_replaced():
    from prometheus_client import generate_latest

    metrics = MetricsRegistry()
    assert b"meshmq_messages_received_total" not in generate_latest(metrics.registry)
    first = BrokerStats()
    first.messages_in = 1
    metrics.add_broker(first)
    assert b"meshmq_messages_received_total 1.0" in generate_latest(metrics.registry)
    second = BrokerStats()
    second.messages_in = 2
    metrics.add_broker(second, lambda: {"sessions": 5})
    text = generate_latest(metrics.registry)
    assert b"meshmq_messages_received_total 2.0" in text and b"meshmq_sessions 5.0" in text
    metrics.set_router_gauges(lambda: {"sessions": 6})
    assert b"meshmq_sessions 6.0" in generate_latest(metrics.registry)
