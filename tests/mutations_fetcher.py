"""Planted bugs for replication (issue 24 step 3: followers pull, the leader's high-water mark
and ISR; cluster/replication.py, cluster/fetcher.py, cluster/replica.py), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py fetcher-``). Each new test of
``tests/cluster/test_replication.py`` is named by at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

REP = "tests/cluster/test_replication.py"
UNIT = "tests/cluster/test_replica_unit.py"
HOOKS = "tests/commitlog/test_commitlog_replication_hooks.py"
FEED = "tests/cluster/test_raftfeed_roles_unit.py"
CFG = "tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"


def fetcher_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("fetcher-ack-at-leader-end", "acks=all acknowledged at the leader's durable end (the "
          "high-water mark is the leader's end, not the ISR's lowest)",
          "cluster/replication.py",
          "        hw = led.state.advance(self.store.durable_end(device))",
          "        hw = self.store.durable_end(device)",
          (f"{REP}::test_without_min_insync_replicas_a_publish_is_refused_never_acked",)),
        m("fetcher-no-epoch-starts", "the leader leaves its epoch-start records out of what "
          "followers fetch (their logs are no longer byte-identical, divergence unfindable)",
          "cluster/replication.py", "                                           FETCH_MAX_BYTES, "
          "f.last_epoch)", "                                           FETCH_MAX_BYTES, 1 << 30)",
          (f"{REP}::test_qos1_messages_are_in_every_replica_byte_identical",)),
        m("fetcher-isr-never-expands", "a follower that caught up never rejoins the ISR",
          "cluster/replica.py", "            elif r not in new and f.log_end >= max(",
          "            elif False and r not in new and f.log_end >= max(",
          (f"{REP}::test_a_frozen_follower_is_shrunk_out_and_rejoins",)),
        m("fetcher-no-truncate", "a diverging answer is not acted on: the follower keeps its "
          "diverged tail", "cluster/fetcher.py", "            store.truncate(device, to)\n",
          "            pass\n",
          (f"{REP}::test_a_diverged_follower_truncates_and_ends_identical",)),
        m("fetcher-caught-up-from-zero", "a new leader's followers count as behind since "
          "t=0 (shrunk at its first ISR check)", "cluster/replica.py",
          "_Follower(caught_up_at=self.started_at)", "_Follower()",
          (f"{UNIT}::test_a_new_leaders_followers_count_as_caught_up_when_it_started",)),
        m("fetcher-no-lease", "the leader's mark moves without its lease",
          "cluster/replica.py", "        if not self.lease_ok():\n", "        if False:\n",
          (f"{UNIT}::test_without_the_lease_the_mark_is_held",)),
        m("fetcher-store-silent-commit", "the store's commit does not tell the replica "
          "manager which logs moved (parked fetches wait out their timer, a leader-only ISR's "
          "mark stalls)", "commitlog/store.py", "        if moved:\n", "        if False:\n",
          (f"{HOOKS}::test_the_commit_names_the_logs_whose_durable_end_moved",)),
        m("fetcher-store-fail-too-few", "failing the waiters leaves some above the mark "
          "waiting forever", "commitlog/store.py",
          "self._waiters.take_acks_after(key, dev.high_watermark)",
          "self._waiters.take_acks_after(key, dev.high_watermark + 1)",
          (f"{HOOKS}::test_failing_the_waiters_refuses_only_what_is_above_the_mark",)),
        m("fetcher-feed-ignores-incarnation", "a router leads a log Raft gave to its previous "
          "run (restarted under the same id): two leaders", "cluster/raftplace.py",
          "return inc is None or self.incarnation is None or inc == self.incarnation",
          "return True",
          (f"{FEED}::test_a_record_naming_an_older_incarnation_of_this_router_leads_nothing_here",)),
        m("fetcher-feed-epoch-only", "a record is newer only by its epoch: the leader never "
          "hears its own ISR changes", "cluster/raftplace.py",
          'return int(rec.get("epoch", 0)), int(rec.get("isr_version", 0))',
          'return int(rec.get("epoch", 0)), 0',
          (f"{FEED}::test_the_same_epochs_later_isr_replaces_an_earlier_one_never_the_reverse",)),
        m("fetcher-feed-no-hold", "the placement moves before the new leader's epoch started "
          "(records of the new epoch before its epoch start)", "cluster/raftplace.py",
          "                self._held.add(device)\n                return\n",
          "                self._held.add(device)\n",
          (f"{FEED}::test_a_listener_holds_the_placement_until_it_releases_it",)),
        m("fetcher-acks-ignored", "cluster.acks = \"leader\" still waits for the ISR",
          "cluster/replication.py", '        self.acks_all = settings.acks == "all"',
          "        self.acks_all = True",
          (f"{REP}::test_acks_leader_acknowledges_at_the_leaders_fsync",)),
        # fetcher-lost-log-truncates (the leader's lost-log guard, cluster/replication.py)
        # is no longer reachable by a real-process test: since the controller never elects a
        # restarted router while another in-sync replica lives (and a wiped sole replica is
        # reported lost), no leader lacks records its followers hold; the guard stays as
        # defense in depth for records of builds without leader_incarnation
        m("fetcher-cfg-fetch-wait", "config: replica_fetch_wait at or past "
          "replica_lag_time_max accepted", "meshmq/config.py",
          '    if get("replica_fetch_wait") >= get("replica_lag_time_max"):',
          "    if False:", (f"{CFG}[fetch-wait-past-lag-max]",)),
    )
