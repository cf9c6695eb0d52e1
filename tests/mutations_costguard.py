"""Planted slowdowns in the hot paths, caught by the cost guard (``tests/bench/test_cost_guard.py``,
bench/costguard.py) without timing anything."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"


def costguard_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        # (Was "costguard-delivery-size-by-generator", in _write_publish's v3.x QoS 1/2 branch:
        # since the logged runs, broker/loggedrun.py, a v3.x QoS 1 copy on the qos1 and
        # catch-up paths is encoded in _send_run, so the guard's workloads left that branch
        # and the plant went uncaught; the slowdown is planted where the copies are now.)
        m("costguard-send-run-by-generator", "broker/loggedrun.py _send_run: each v3.x QoS 1 "
          "copy of a run collected through a generator (a few calls more per delivery: qos1 "
          "and catch-up +10 % or more)",
          "broker/loggedrun.py",
          "            datas.append(encode(msg.topic, msg.payload, 0x32, pid))\n",
          "            datas.extend(x for x in (encode(msg.topic, msg.payload, 0x32, pid),))\n",
          (GUARD,)),
    )
