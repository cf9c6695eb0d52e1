"""Planted slowdowns in the hot paths, caught by the cost guard (``tests/bench/test_cost_guard.py``,
bench/costguard.py) without timing anything."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"


def costguard_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("costguard-delivery-size-by-generator", "broker/delivery.py _write_publish: a v3.x "
          "QoS 1/2 copy's size checked through a generator (a few calls more per delivery: "
          "qos1 and catch-up +10 % or more)",
          "broker/delivery.py",
          "                if limit and len(data) > limit:\n",
          "                if sum(len(x) for x in (data,)) > limit and limit:\n", (GUARD,)),
    )
