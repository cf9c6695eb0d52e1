"""Planted slowdowns of the catch-up read (issue 25, ``tests/mutate.py catchup-``): a lagging
session's delivery from the log is guarded by the cost guard's ``catchup`` workload
(bench/costguard.py), which must catch each without a clock."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"


def catchup_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("catchup-match-uncached", "broker/catchup.py match_record: every (filter, topic) "
          "matched in Python again (the C lru_cache bypassed)", "broker/catchup.py",
          "        if not (_cached_matches(flt, topic) if short",
          "        if not (topic_matches(flt, topic) if short", (GUARD,)),
    )
