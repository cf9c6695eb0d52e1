"""Planted bugs for review 5's attacks on the merged replication (issue 24), run by
``tests/mutate.py`` (``tests/mutate.py review5-``). Each names the real-process test of
``tests/cluster/test_review5_replication_faults.py`` that caught it before its fix.
"""

from __future__ import annotations

from typing import Any

T = "tests/cluster/test_review5_replication_faults.py"


def review5_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review5-truncation-as-disk-fault", "a publish cut by a deposed leader's truncation "
          "is refused as a failing disk ('disk full or failing?')",
          "broker/ingest.py",
          "        text = _TRUNCATED if isinstance(err, LogTruncatedError) else None\n",
          "        text = None\n",
          (f"{T}::test_a_frozen_leader_node_never_acks_after_its_lease_and_ends_identical",)),
    )
