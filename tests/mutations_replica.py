"""Planted bugs in the replication state rules (``cluster/replica.py``), caught by
``tests/cluster/test_replica_unit.py``."""

from __future__ import annotations

from typing import Any

UNIT = "tests/cluster/test_replica_unit.py"


def replica_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    f = "cluster/replica.py"
    return (
        m("replica-last-replica-standing", f"{f} advance: the mark advances with an ISR below "
          "min_insync (KIP-966's data loss)", f,
          "        if len(self.isr) < self.min_insync:\n", "        if False:\n", (UNIT,)),
        m("replica-mark-moves-back", f"{f} advance: the mark follows the lowest log end down",
          f, "        if lowest > self.high_watermark:\n", "        if True:\n", (UNIT,)),
        m("replica-no-divergence-check", f"{f} on_fetch: a diverged follower's tail is "
          "counted as its log end", f,
          "        if last_fetched_epoch != UNDEFINED and fetch_offset > 0:\n",
          "        if False:\n", (UNIT,)),
        m("replica-truncate-past-own-end", f"{f} on_diverging: the follower keeps more than "
          "it had in the diverging epoch", f,
          "                truncate_to = min(truncate_to, own_end)\n",
          "                pass\n", (UNIT,)),
    )
