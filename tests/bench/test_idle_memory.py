"""CI's guard on what an idle client connection costs the broker (issue 25): bytes allocated per
idle connection, counted by tracemalloc in a real node holding 2,000 real TCP connections
(bench/idlemem.py), against ``bench.idlemem.BUDGET_BYTES``.

No RSS is read: the traced bytes are the objects each connection holds, the same on every run
(measured spread: a few bytes in 2,600), while RSS moves with the allocator's arenas."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_idle_connection_within_its_memory_budget() -> None:
    # its own process: tracemalloc must see the broker's allocations, not pytest's
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "bench.idlemem", "--check",
                          "--connections", "2000"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bytes traced per idle connection" in out.stdout
