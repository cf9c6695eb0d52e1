"""Planted bugs for the durable QoS 1 publish path made cheaper by issue 25 (the fsync worker,
the coalesced acks, the shortened append path), run by ``tests/mutate.py`` like every other
guard (``tests/mutate.py qos1-``). Each names the tests that must catch it: the promise is that
a PUBACK means committed, so every shortcut here is checked against an ack for what was not
stored, a lost or reordered ack, and a failed write reported as a success.
"""

from __future__ import annotations

from typing import Any

DF = "tests/commitlog/test_commitlog_disk_full.py"


def qos1_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("qos1-syncworker-error-lost", "the fsync worker hands a failed job back as a success "
          "with no result (a failed fsync is no longer a failure)",
          "commitlog/syncworker.py", "                self._hand_back(loop, done, None, exc)\n",
          "                self._hand_back(loop, done, None, None)\n",
          (f"{DF}::test_fsync_failure_is_not_retried_into_success",)),
    )
