"""Planted bugs for issue 25's cheap mesh crossings (``tests/mutate.py crossing-``): each one is
caught by the cost guard's ``crossing`` workload (bench/costguard.py: two routers of one node,
a real mesh link, every message crossing it) or by the crossing tests next to what changed."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"


def crossing_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("crossing-link-enqueue-scan", "cluster/link.py enqueue: every entry's topic scanned "
          "byte by byte in Python (a per-character check, ~20 calls more per crossing: the "
          "guard's crossing workload over its budget)",
          "cluster/link.py",
          "        out = Out(self.next_seq, kind, qos, head, body, done, epoch)\n",
          "        if any(c == 0 for c in body[:head[1]]):\n"
          "            return False\n"
          "        out = Out(self.next_seq, kind, qos, head, body, done, epoch)\n", (GUARD,)),
    )
