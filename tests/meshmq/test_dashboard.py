"""deploy/grafana/meshmq-dashboard.json queries only metrics a live node serves, and is the file
its generator writes (a hand edit of the JSON would be lost on the next generation)."""

from __future__ import annotations

import importlib.util
import json
import re

from helpers.broker import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "meshmq-dashboard.json"
_SUFFIXES = ("_bucket", "_count", "_sum")


def _queried_metrics() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    names = set()
    for panel in doc["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"\bmeshmq_[a-z_]+", target["expr"]))
    return names


def test_every_queried_metric_exists(broker):
    served = set()
    for line in broker.metrics_text().splitlines():
        if line.startswith("# TYPE "):
            served.add(line.split()[2])
    missing = []
    for name in sorted(_queried_metrics()):
        base = name
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in served:
                base = name[: -len(suffix)]
        if base not in served and base.removesuffix("_total") not in served:
            missing.append(name)
    assert not missing, f"dashboard queries metrics the node does not serve: {missing}"
    assert len(_queried_metrics()) >= 20


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
