"""bench/cluster.py runs end to end (tiny runs): it starts its clusters, produces numbers for
every workload and stops every process it started. Never a timing assertion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cluster_bench_quick_produces_numbers(tmp_path: Path) -> None:
    out = tmp_path / "res"
    r = subprocess.run(
        [sys.executable, "-m", "bench.cluster", "--quick", "--groups", "scale,stall",
         "--warmup", "0.1", "--duration", "0.3", "--stall-settle", "1",
         "--stall-queue-bytes", str(1 << 20), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads((out / "cluster-latest.json").read_text())
    by = {run["workload"]: run["result"] for run in doc["runs"]}
    for w in ("scale_r1", "scale_r2", "stall_idle", "stall_full"):
        assert by[w]["status"] == "ok", (w, by[w])
        assert by[w]["value"] > 0
    assert 0.0 <= by["scale_r2"]["crossed_link_share"] <= 1.5
    assert set(by["scale_r2"]["broker_procs_cpu"]) == {"n0", "n0/0", "n0/1"}
    # the baseline sends the stopped n1 nothing; the stall fills its link and drops
    assert by["stall_idle"]["n1_link"]["dropped_total"] == 0, by["stall_idle"]["n1_link"]
    assert by["stall_full"]["n1_link"]["dropped_total"] > 0, by["stall_full"]["n1_link"]
    assert (out / "cluster-latest.md").read_text().count("|") > 10
