"""Planted bugs for review11's fixes and checks (``tests/mutate.py review11-``): requests of
timed-out metadata proposal attempts are forgotten (cluster/metaclient.py), and the compiled
makers and whole-packet encoder (broker/protocol/_speedups.c) against what the tests of 2ae833d
missed."""

from __future__ import annotations

from typing import Any


def review11_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("review11-abandoned-requests-kept", "cluster/metaclient.py _flush: a request every "
          "caller stopped waiting for (a timed-out attempt) is kept until its answer comes",
          "cluster/metaclient.py",
          "            if not fut.done() and all(w.done() for _, w in batch):\n",
          "            if False:\n",
          ("tests/cluster/test_metadata_raft.py::"
           "test_attempts_that_timed_out_leave_no_request_behind",)),
    )
