"""Planted bugs for carrying out ``meshmq cluster rebalance`` (issue 24's last gap), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py rebalance-``).

Each test of ``tests/cluster/test_rebalance_unit.py`` and ``tests/cluster/test_rebalance.py``
is named by at least one mutation it must catch. The real-cluster ones take minutes each (a
move that never finishes is seen when the CLI's ``--timeout`` runs out).
"""

from __future__ import annotations

from typing import Any

UNIT = "tests/cluster/test_rebalance_unit.py"
REAL = ("tests/cluster/test_rebalance.py::test_rebalance_moves_replicas_and_a_leader_onto_a_"
        "new_node_losing_nothing")
STUCK = ("tests/cluster/test_rebalance.py::test_a_move_onto_a_dead_node_is_stuck_cancelled_then_"
         "finishes_when_it_returns")


def rebalance_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("rebalance-feed-deaf", "cluster/raftplace.py learn: a reassignment (same epoch and "
          "ISR version, other replicas) is not news to the role listeners (the added replica "
          "never follows)", "cluster/raftplace.py",
          "                or (_version(rec) == _version(known)\n"
          "                    and rec.get(\"replicas\") != known.get(\"replicas\")):",
          "                or False:",
          (f"{UNIT}::test_a_reassignment_is_news_to_every_router_and_a_late_older_copy_is_"
           "not",)),
        m("rebalance-feed-stale-copy", "cluster/raftplace.py learn: a late answer from before "
          "the reassignment replaces it (the replicas go back)", "cluster/raftplace.py",
          "                and _moved(known) > _moved(rec):", "                and False:",
          (f"{UNIT}::test_a_reassignment_is_news_to_every_router_and_a_late_older_copy_is_"
           "not",)),
        m("rebalance-leader-deaf", "cluster/replication.py on_record: the leader keeps its "
          "replica set when a reassignment changes it at its epoch (the added replica is "
          "refused, never joins the ISR, the move never finishes)", "cluster/replication.py",
          "                if replicas != led.replicas:\n", "                if False:\n",
          (REAL,)),
        m("rebalance-added-in-isr-at-once", "cluster/replica.py replicas_changed: an added "
          "replica counts as caught up at the mark before it fetched anything",
          "cluster/replica.py", "                self.followers.setdefault(r, _Follower("
          "caught_up_at=now))", "                self.followers.setdefault(r, _Follower("
          "log_end=self.high_watermark, caught_up_at=now))",
          (f"{UNIT}::test_the_leader_serves_an_added_replica_and_takes_it_into_the_isr_once_"
           "caught_up",)),
        m("rebalance-never-completed", "cluster/controller.py plan: no complete_reassign "
          "(every move stays half done: old and new replicas, the leader never moved)",
          "cluster/controller.py", "            elif completes(rec, routers, alive):",
          "            elif False:",
          (f"{UNIT}::test_the_controller_completes_a_move_only_with_every_target_in_sync_and_"
           "alive", REAL)),
        m("rebalance-completes-on-dead-node", "cluster/controller.py completes: a target on a "
          "dead node counts (leadership handed to a router that is down)",
          "cluster/controller.py", "    return all(r in isr and _node(r) in alive and r in "
          "routers for r in target)", "    return all(r in isr and r in routers for r in "
          "target)",
          (f"{UNIT}::test_the_controller_completes_a_move_only_with_every_target_in_sync_and_"
           "alive",)),
        m("rebalance-stuck-hidden", "cluster/loghealth.py is_stuck: a move waiting on a dead "
          "node is never reported stuck", "cluster/loghealth.py",
          "    return \"target\" in rec and any(", "    return False and any(",
          (f"{UNIT}::test_a_move_waiting_on_a_dead_node_is_stuck_and_progress_says_so",
           STUCK)),
        m("rebalance-cli-timeout-ok", "meshmq/clustercli.py rebalance: exits 0 when a move "
          "did not finish within --timeout", "meshmq/clustercli.py",
          "    return 0 if finished and not failed else 1", "    return 0", (STUCK,)),
        m("rebalance-preferred-leader-never-elected", "cluster/rebalance.py progress: the "
          "planned leader is never elected after the replicas moved (the CLI waits forever)",
          "cluster/rebalance.py",
          "            cmds.append([\"elect\", device, rec[\"epoch\"], new_leader])",
          "            pass",
          (f"{UNIT}::test_the_controller_completes_a_move_only_with_every_target_in_sync_and_"
           "alive",)),
        m("rebalance-overtaken-counts-done", "cluster/rebalance.py progress: a move whose "
          "record never took the planned replicas is taken for done",
          "cluster/rebalance.py",
          "        elif sorted(rec.get(\"replicas\") or ()) != sorted(new):",
          "        elif False:",
          (f"{UNIT}::test_a_move_refused_or_overtaken_is_not_moved",)),
        m("rebalance-cancel-keeps-added", "cluster/metastate.py cancel_reassign: the added "
          "replica stays in the replica set (it keeps following; the log stays "
          "under-replicated)", "cluster/metastate.py",
          "        rec.update(replicas=[r for r in rec[\"replicas\"] if r not in added], isr=isr,",
          "        rec.update(replicas=list(rec[\"replicas\"]), isr=isr,",
          (f"{UNIT}::test_a_cancelled_move_gives_the_old_replicas_back_and_the_added_one_stops_"
           "following", STUCK)),
        m("rebalance-cancel-proposes-nothing", "meshmq/node_admin.py: the cancel route "
          "proposes nothing (the stuck move stays)", "meshmq/node_admin.py",
          "        results = await self._propose_moves(cmds) if cmds else []",
          "        results = []", (STUCK,)),
    )
