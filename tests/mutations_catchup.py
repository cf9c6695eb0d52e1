"""Planted slowdowns of the catch-up read (issue 25, ``tests/mutate.py catchup-``): a lagging
session's delivery from the log is guarded by the cost guard's ``catchup`` workload
(bench/costguard.py), which must catch each without a clock."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"
ONE_TOPIC = ("tests/broker/test_log_delivery.py::"
             "test_lagging_subscriber_of_one_topic_gets_only_that_topic_of_its_device")
_MEMO = ("                        plan = memo.get({key})\n"
         "                        if plan is None:\n"
         "                            got = match_record(session, rec, remote)\n"
         "                            memo[{key}] = False if got is None else got\n")


def catchup_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("catchup-read-per-record", "broker/catchup.py pump: the log read one record at a "
          "time (a take and a store read per record instead of per chunk)",
          "broker/catchup.py",
          "                chunk = min(self.chunk, max(16, window - len(inflight)))\n",
          "                chunk = 1\n", (GUARD,)),
        m("catchup-memo-per-device", "broker/catchup.py pump: the per-pump match answer kept "
          "per device log instead of per topic (a device's records carry several topics)",
          "broker/catchup.py", _MEMO.format(key="rec.topic"), _MEMO.format(key="c.device"),
          (ONE_TOPIC,)),
    )
