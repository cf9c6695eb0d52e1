"""Planted bugs for the commit log's names and its high-water-mark API (issue 26, the
commit-log part), run by ``tests/mutate.py`` like every other guard
(``tests/mutate.py lognames-``). Each test of
``tests/commitlog/test_commitlog_high_watermark.py`` is named by at least one.
"""

from __future__ import annotations

from typing import Any

HW = "tests/commitlog/test_commitlog_high_watermark.py"
PER_COMMIT = HW + "::test_waiters_fire_per_commit_once_their_record_is_committed"
FAILED = HW + "::test_a_failed_write_gives_its_error_to_the_waiters_and_never_a_success"


def lognames_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("lognames-hw-wake-at-log-end",
          "commitlog/store.py _wake: waiters woken up to the log end (appends not yet "
          "durable) instead of the high-water mark",
          "commitlog/store.py",
          "                call_all(self._waiters.take_ready(dev.key, dev.high_watermark),\n",
          "                call_all(self._waiters.take_ready(dev.key, dev.next),\n",
          (PER_COMMIT + "[c]", PER_COMMIT + "[py]")),
        m("lognames-hw-rollback-generic-error",
          "commitlog/store.py rollback: waiters get a made-up EIO, not the write's own error",
          "commitlog/store.py",
          "        exc = cause if cause is not None else LogWriteError(\n",
          "        exc = LogWriteError(\n",
          (FAILED,)),
        m("lognames-hw-late-waiter-waits",
          "commitlog/groupcommit.py when_high_watermark: a waiter for a rolled-back record "
          "waits for the next record appended at its offset (acked for another record)",
          "commitlog/groupcommit.py",
          "        if offset >= store.log_end(key):\n",
          "        if False:\n",
          (FAILED,)),
    )
