"""deploy/grafana/meshmq-dashboard.json queries only metrics a live node serves, and is the file
its generator writes (a hand edit of the JSON would be lost on the next generation)."""

from __future__ import annotations

import importlib.util
import json
import re

from helpers.broker import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "meshmq-dashboard.json"
_SUFFIXES = ("_bucket", "_count", "_sum")


def _queried_metrics(cluster: bool = False) -> set[str]:
    """Metrics the node panels (or, with ``cluster``, the "Cluster: " panels) query."""
    doc = json.loads(DASHBOARD.read_text())
    names = set()
    for panel in doc["panels"]:
        if panel["title"].startswith("Cluster: ") != cluster:
            continue
        for target in panel["targets"]:
            names |= set(re.findall(r"\bmeshmq_[a-z_]+", target["expr"]))
    return names


def test_every_queried_metric_exists(broker):
    missing = _missing(broker.metrics_text(), _queried_metrics())
    assert not missing, f"dashboard queries metrics the node does not serve: {missing}"
    assert len(_queried_metrics()) >= 20


def test_every_cluster_panel_metric_exists_on_a_cluster_node(tmp_path):
    """The cluster panels against a 2-router node's merged /metrics (its routers link to each
    other, so the per-link families are there)."""
    from helpers.broker import wait_for
    from helpers.clusternode import ClusterNode

    node = ClusterNode(tmp_path / "node", routers=2)
    try:
        node.start()
        node.wait_routers_up()
        wait_for(lambda: "meshmq_link_rtt_seconds{" in node.metrics_text(), timeout=20,
                 message="the routers' link to each other up, with an RTT")
        missing = _missing(node.metrics_text(), _queried_metrics(cluster=True))
    finally:
        node.kill_everything()
    assert not missing, f"cluster panels query metrics a cluster node does not serve: {missing}"
    assert len(_queried_metrics(cluster=True)) >= 10


def _missing(metrics_text: str, queried: set[str]) -> list[str]:
    served = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            served.add(line.split()[2])
    missing = []
    for name in sorted(queried):
        base = name
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in served:
                base = name[: -len(suffix)]
        if base not in served and base.removesuffix("_total") not in served:
            missing.append(name)
    return missing


def test_dashboard_json_matches_its_generator():
    spec = importlib.util.spec_from_file_location(
        "make_dashboard", REPO_ROOT / "deploy" / "grafana" / "make_dashboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert json.loads(DASHBOARD.read_text()) == mod.dashboard()


def test_openmetrics_exposition_on_request(broker):
    """With Accept: application/openmetrics-text the node answers OpenMetrics (no family-name
    clash between a gauge and a counter any more) and ends with # EOF."""
    import urllib.request

    req = urllib.request.Request(f"http://{broker.host}:{broker.admin_port}/metrics",
                                 headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert "meshmq_build_info" in body
