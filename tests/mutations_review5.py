"""Planted bugs for review 5's attacks on the merged replication (issue 24), run by
``tests/mutate.py`` (``tests/mutate.py review5-``). Each names the real-process test of
``tests/cluster/test_review5_replication_faults.py`` that caught it before its fix.
"""

from __future__ import annotations

from typing import Any

T = "tests/cluster/test_review5_replication_faults.py"
FLIP = f"{T}::test_a_follower_with_a_flipped_byte_is_never_elected_with_the_hole[kill]"


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
        m("review5-empty-follower-stays-in-isr", "a follower back with an empty disk (new "
          "incarnation, no logs kept) stays in every ISR: the controller may elect it",
          "cluster/metastate.py",
          "        if old is not None and old[\"incarnation\"] != rec[\"incarnation\"] and not "
          "rec[\"kept_logs\"]:\n",
          "        if False:\n",
          ("tests/cluster/test_metastate_unit.py::"
           "test_a_router_back_with_an_empty_disk_leaves_every_isr_it_followed_in",
           f"{T}::test_a_follower_back_with_an_empty_disk_is_never_elected_before_it_caught_up")),
        m("review5-flip-no-repair", "a follower whose store quarantined a corrupt record "
          "keeps the hole and follows on (in the ISR, electable)",
          "cluster/fetcher.py", "        if lost:\n            self._repair(",
          "        if False:\n            self._repair(", (FLIP,)),
        m("review5-flip-gap-kept", "a truncation keeps the quarantine gaps past its offset: "
          "the records fetched again there stay reported lost (gaps.json, the fetch API's lost "
          "offsets) and every restart truncates and refetches them again",
          "commitlog/store.py", "        if dev.gaps and dev.gaps[-1][1] > offset:\n",
          "        if False:\n", (FLIP,)),
        m("review5-resend-stored-again", "the publisher dedupe never looks: a DUP resend after "
          "a failover is appended again (acknowledged messages stored twice)",
          "broker/pubdedupe.py", "        if pub is None and mid is None:\n",
          "        if True:\n",
          (f"{T}::test_kill9_of_the_leader_mid_stream_loses_and_doubles_nothing",)),
        m("review5-hw-at-leader-end", "the high-water mark ignores the followers' log ends "
          "(acks at the leader's durable end, acks=leader in disguise)",
          "cluster/replica.py", "            if end < lowest:\n                lowest = end\n",
          "            pass\n",
          (f"{T}::test_two_of_three_nodes_killed_nothing_acked_then_nothing_lost",)),
        m("review5-empty-fetch-diverges", "a fetch with no last fetched epoch (an empty "
          "replica's) is answered diverging: a follower back with an empty disk never catches up",
          "cluster/replica.py",
          "        if last_fetched_epoch != UNDEFINED and fetch_offset > 0:\n",
          "        if fetch_offset > 0 or last_fetched_epoch == UNDEFINED:\n",
          (f"{T}::test_a_follower_restarted_with_its_data_dir_deleted_catches_up_from_zero",)),
        m("review5-isr-never-shrinks", "the leader never shrinks a follower out of the ISR (a "
          "follower whose disk is full stalls every ack)",
          "cluster/replica.py",
          "            if r in new and now - f.caught_up_at > self.lag_max_s:\n",
          "            if False:\n",
          (f"{T}::test_a_follower_whose_disk_is_full_leaves_the_isr_and_catches_up_after",)),
    )
