"""Writes ``meshmq-dashboard.json`` (Grafana 10+, Prometheus datasource) from the panel list below.

Run ``python deploy/grafana/make_dashboard.py`` after changing a panel; the JSON is what operators
import (Dashboards > New > Import). ``tests/meshmq/test_dashboard.py`` checks that every metric a
panel queries exists on a live node's /metrics, so a renamed metric cannot leave a blank panel.
"""

from __future__ import annotations

import json
from pathlib import Path

# (title, unit, [(PromQL, legend)])
PANELS = [
    ("Clients connected", "short", [
        ("sum(meshmq_clients_connected)", "connected"),
        ("sum(meshmq_clients_connected_max)", "peak since start"),
        ("sum by (listener) (meshmq_listener_sockets)", "sockets {{listener}}")]),
    ("Connections accepted / refused per second", "ops", [
        ("sum by (listener) (rate(meshmq_connections_total[1m]))", "accepted {{listener}}"),
        ("sum by (listener) (rate(meshmq_connections_rejected_total[1m]))",
         "refused {{listener}}"),
        ("sum(rate(meshmq_auth_failures_total[1m]))", "auth failures")]),
    ("Messages per second", "ops", [
        ("sum(rate(meshmq_messages_received_total[1m]))", "received"),
        ("sum(rate(meshmq_messages_sent_total[1m]))", "sent")]),
    ("Messages per second by QoS", "ops", [
        ("sum by (qos) (rate(meshmq_messages_received_qos_total[1m]))", "in QoS {{qos}}"),
        ("sum by (qos) (rate(meshmq_messages_sent_qos_total[1m]))", "out QoS {{qos}}")]),
    ("Dropped messages per second (by reason)", "ops", [
        ("sum by (reason) (rate(meshmq_messages_dropped_total[1m]))", "{{reason}}")]),
    ("Lagging sessions (fed from the log)", "short", [
        ("sum(meshmq_sessions_lagging)", "sessions"),
        ("sum(meshmq_lag_messages)", "messages behind")]),
    ("Queued and in-flight deliveries", "short", [
        ("sum(meshmq_queued_messages)", "queued"),
        ("sum(meshmq_inflight_messages)", "in flight")]),
    ("Sessions, subscriptions, retained", "short", [
        ("sum(meshmq_sessions)", "sessions"),
        ("sum(meshmq_subscriptions)", "subscriptions"),
        ("sum(meshmq_retained_messages)", "retained")]),
    ("Bytes per second", "Bps", [
        ("sum(rate(meshmq_bytes_received_total[1m]))", "in"),
        ("sum(rate(meshmq_bytes_sent_total[1m]))", "out"),
        ("sum(meshmq_retained_bytes)", "retained payload bytes")]),
    ("Commit log: appends and fsyncs", "ops", [
        ("sum(rate(meshmq_log_appends_total[1m]))", "records/s"),
        ("sum(rate(meshmq_log_batches_total[1m]))", "batches/s"),
        ("histogram_quantile(0.99, sum by (le) (rate(meshmq_log_fsync_seconds_bucket[5m])))",
         "fsync p99 (s)")]),
    ("Commit log: errors (alert on any)", "short", [
        ("sum(increase(meshmq_log_write_errors_total[5m]))", "write errors"),
        ("sum(increase(meshmq_log_fsync_errors_total[5m]))", "fsync errors")]),
    ("Commit log: size", "bytes", [
        ("sum(meshmq_log_bytes)", "bytes"), ("sum(meshmq_log_devices)", "devices")]),
    ("Event loop lag p99", "s", [
        ("histogram_quantile(0.99, sum by (le) (rate(meshmq_event_loop_lag_seconds_bucket[5m])))",
         "p99")]),
    ("Authorisation decisions per second", "ops", [
        ("sum by (action, result) (rate(meshmq_authorization_total[1m]))",
         "{{action}} {{result}}")]),
    ("Protocol errors and TLS handshake failures", "ops", [
        ("sum(rate(meshmq_protocol_errors_total[1m]))", "protocol errors"),
        ("sum by (reason) (rate(meshmq_tls_handshake_failures_total[1m]))", "TLS {{reason}}")]),
]

# A cluster node's supervisor merges its routers' metrics with a router="<node>/<r>" label and
# adds meshmq_router_up / meshmq_router_restarts_total; each router adds meshmq_link_* per peer.
# These panels stay empty on a single node (tests/meshmq/test_dashboard.py checks them against
# a cluster node).
CLUSTER_TITLE = "Cluster: "
CLUSTER_PANELS = [
    (CLUSTER_TITLE + "routers up, restarts", "short", [
        ("sum(meshmq_router_up)", "routers up"),
        ("count(meshmq_router_up == 0)", "routers down"),
        ("sum by (router) (increase(meshmq_router_restarts_total[1h]))",
         "restarts in 1h {{router}}")]),
    (CLUSTER_TITLE + "mesh links up / down", "short", [
        ("sum(meshmq_link_up)", "up"),
        ("count(meshmq_link_up == 0)", "down"),
        ("sum(rate(meshmq_link_reconnects_total[5m]))", "reconnects/s")]),
    (CLUSTER_TITLE + "messages per second over links", "ops", [
        ("sum by (router, peer) (rate(meshmq_link_messages_sent_total[1m]))",
         "{{router}} -> {{peer}}")]),
    (CLUSTER_TITLE + "link bytes per second", "Bps", [
        ("sum(rate(meshmq_link_bytes_sent_total[1m]))", "sent"),
        ("sum(rate(meshmq_link_bytes_received_total[1m]))", "received")]),
    (CLUSTER_TITLE + "link RTT (max per link)", "s", [
        ("max by (router, peer) (meshmq_link_rtt_seconds)", "{{router}} -> {{peer}}")]),
    (CLUSTER_TITLE + "link queues and drops (alert on drops)", "short", [
        ("sum by (router, peer) (meshmq_link_queued_bytes)", "queued bytes {{router}} -> {{peer}}"),
        ("sum by (router, peer) (meshmq_link_unacked)", "unacked {{router}} -> {{peer}}"),
        ("sum by (reason) (increase(meshmq_link_dropped_total[5m]))", "dropped {{reason}}")]),
    # publishes whose device log another router owns wait for its outcome, at most
    # cluster.append_timeout: a climbing age means an owner unreachable (alert on timeouts)
    (CLUSTER_TITLE + "publishes awaiting their log's owner, refused at append_timeout",
     "short", [
        ("sum by (router, peer) (meshmq_link_appends_awaiting)",
         "awaiting {{router}} -> {{peer}}"),
        ("sum by (peer) (increase(meshmq_link_append_timeouts_total[5m]))",
         "refused in 5m, owner {{peer}}")]),
    (CLUSTER_TITLE + "oldest publish awaiting its log's owner", "s", [
        ("max by (router, peer) (meshmq_link_oldest_append_seconds)",
         "{{router}} -> {{peer}}")]),
]


def dashboard() -> dict:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS + CLUSTER_PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + k), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for k, (expr, legend) in enumerate(targets)],
        })
    return {
        "title": "meshmq", "uid": "meshmq-node", "schemaVersion": 39, "version": 1,
        "tags": ["mqtt", "meshmq"], "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("meshmq-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(f"wrote {out}")
