"""Planted bugs for a replica whose log ends below its leader's log start (issue 24's gap:
retention moved the leader's start; ``LogStore.reset_start``, cluster/fetcher.py
``_restart_at``, ``epochs.from_start``, cluster/replication.py ``unversioned_tail``), run by
``tests/mutate.py logstart-``."""

from __future__ import annotations

from typing import Any

UNIT = "tests/commitlog/test_commitlog_logstart.py"


def logstart_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("logstart-reset-not-replayed", "store recovery: the reset marker (a marker above "
          "the log end) replayed as a truncation (the old records come back after a restart)",
          "commitlog/store.py",
          "                    if off > dev.next:  # only reset_start writes a marker past the "
          "end\n",
          "                    if False:\n", (UNIT,)),
        m("logstart-reset-keeps-epochs", "reset_start keeps the follower's old epoch table "
          "(its lookups disagree with the leader's)", "commitlog/store.py",
          "        dev.epochs = None  # Kafka's truncateFullyAndStartAt clears the epoch cache "
          "too\n", "\n", (UNIT,)),
        m("logstart-no-epoch-at-start", "read_replica from a start inside an epoch sends no "
          "epoch start (the restarted follower holds records of no epoch)",
          "commitlog/store.py",
          "        if offset == dev.start and table and table[0][1] < offset:\n",
          "        if False:\n", (UNIT,)),
        m("logstart-epochs-unclipped", "store.epochs lists epochs that ended before the log "
          "start (no truncateFromStart view)", "commitlog/store.py",
          "        return [(e[0], e[1]) for e in _ep.from_start(dev.epochs, dev.start)]\n",
          "        return [(e[0], e[1]) for e in dev.epochs]\n", (UNIT,)),
    )
