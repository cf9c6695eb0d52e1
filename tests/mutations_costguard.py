"""Planted slowdowns in the hot paths, caught by the cost guard (``tests/bench/test_cost_guard.py``,
bench/costguard.py) without timing anything."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"


def costguard_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("costguard-delivery-size-by-generator", "broker/delivery.py _write_publish: the packet "
          "size summed through a generator (a few calls more per delivery: fan-out +30 %)",
          "broker/delivery.py",
          "        size = len(head) + len(tail) + (2 if d.qos else 0)\n",
          "        size = sum(len(x) for x in (head, tail)) + (2 if d.qos else 0)\n", (GUARD,)),
    )
