"""Planted bugs for a replica whose log ends below its leader's log start (issue 24's gap:
retention moved the leader's start; ``LogStore.reset_start``, cluster/fetcher.py
``_restart_at``, ``epochs.from_start``, cluster/replication.py ``unversioned_tail``), run by
``tests/mutate.py logstart-``."""

from __future__ import annotations

from typing import Any

UNIT = "tests/commitlog/test_commitlog_logstart.py"
RETAIN = UNIT + "::test_retention_never_moves_a_start_past_the_high_water_mark"
CLUSTER = "tests/cluster/test_replica_log_start.py"
WIPED = CLUSTER + "::test_a_wiped_follower_below_the_leaders_log_start_catches_up_and_can_lead"
MOVED = CLUSTER + "::test_a_replica_rebalance_adds_below_the_leaders_start_completes_the_move"
OLD = CLUSTER + "::test_a_follower_down_while_retention_passed_its_end_rejoins"
AT_START = CLUSTER + "::test_a_fetch_at_the_leaders_start_with_no_epoch_is_not_diverging"


def logstart_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("logstart-oor-retried", "fetcher: an out-of-range answer below the leader's start is "
          "a failure fetched again (the replica loops forever, never rejoins the ISR)",
          "cluster/fetcher.py",
          "        if r.status == frames.RECORDS_OUT_OF_RANGE and r.log_start > st.log_end \\\n",
          "        if False and r.log_start > st.log_end \\\n", (WIPED, MOVED)),
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
          "        if False:\n", (UNIT, WIPED, OLD)),
        m("logstart-epochs-unclipped", "store.epochs lists epochs that ended before the log "
          "start (no truncateFromStart view)", "commitlog/store.py",
          "        return [(e[0], e[1]) for e in _ep.from_start(dev.epochs, dev.start)]\n",
          "        return [(e[0], e[1]) for e in dev.epochs]\n", (UNIT,)),
        m("logstart-unversioned-below-start", "leader: a follower at the log start with no "
          "epoch answered diverging below the start (forever)", "cluster/replication.py",
          "    first = max(epochs[0][1] if epochs else 0, store.log_range(f.device)[0])\n",
          "    first = epochs[0][1] if epochs else 0\n", (AT_START,)),
        m("logstart-bytes-past-hwm", "byte retention moves a start past the high-water mark "
          "(records no follower fetched yet deleted)", "commitlog/store.py",
          "                j = min(want, bisect.bisect_left(dev.idx_off, dev.high_watermark)"
          " - 1)\n",
          "                j = want\n", (RETAIN,)),
        m("logstart-age-past-hwm", "age retention moves a start past the high-water mark",
          "commitlog/store.py",
          "                self._advance_devices_past(cut, below_hwm=True)\n",
          "                self._advance_devices_past(cut, below_hwm=False)\n", (RETAIN,)),
        m("logstart-held-cursor-to-end", "a cursor held below the log start skips to the log's "
          "end (what is still there is silently dropped)", "broker/cursors.py",
          "        to = start if c.next < start else end\n",
          "        to = end\n", (WIPED,)),
        m("logstart-reset-waiters-from-end", "reset_start fails only the waiters past the old "
          "end (one for a dropped record above the mark later succeeds falsely)",
          "commitlog/store.py",
          "                call_all(self._waiters.take_between(key, old_hw, 1 << 62),\n",
          "                call_all(self._waiters.take_between(key, old_end, 1 << 62),\n",
          (UNIT + "::test_reset_fails_the_commit_waiters_of_the_dropped_records",)),
    )
