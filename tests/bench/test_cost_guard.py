"""CI's guard against hot-path slowdowns (issue 25): calls and bytecode instructions per message
on fixed in-process workloads (bench/costguard.py), compared with bench/cost_budget.json.

No clock is read: the counts are the same on a quiet laptop and a loaded 2-core CI box (measured
spread between runs: under 0.5 %, against the 10 % tolerance)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.costguard import over_budget

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hot_paths_within_their_cost_budget() -> None:
    # its own process: the counters hook sys.setprofile/settrace, which pytest's own tracing
    # (coverage, faulthandler) must not share
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "bench.costguard", "--check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_crossing_on_the_pure_python_entry_codec_delivers_every_message() -> None:
    # the crossing workload with cluster/_speedups.c switched off: the Python entry codec
    # (the fallback of a build without a compiler) carries every message across the real
    # link; the guard exits non-zero when one is missing (no budget check: counts differ)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CLUSTER_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-m", "bench.costguard", "--workload", "crossing",
                          "--rounds", "5"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    print(out.stdout, out.stderr)
    assert out.returncode == 0 and "crossing:" in out.stdout, out.stdout + out.stderr


def test_over_budget_names_the_workload_and_count() -> None:
    budget = {"qos0": {"calls": 20.0, "instructions": 500.0}}
    assert over_budget({"qos0": {"calls": 21.9, "instructions": 549.0}}, budget) == []
    bad = over_budget({"qos0": {"calls": 22.1, "instructions": 500.0}}, budget)
    assert len(bad) == 1 and bad[0].startswith("qos0: 22.1 calls per message, budget 20.0")
    assert over_budget({"fanout": {"calls": 1.0}}, budget)[0].startswith("fanout: 1.0 calls")
