"""Planted bugs for operating a Raft-placed cluster (issue 24's Operations part): cluster status
and its metrics, log floors and lost logs, rebalance and reassignment, adding a node. Run by
``tests/mutate.py`` like every other guard (``tests/mutate.py ops-``); kept in their own module
so the other engineers' mutations and these do not fight over one tuple.
"""

from __future__ import annotations

from typing import Any

OPS = "tests/cluster/test_cluster_ops.py"
STATUS = f"{OPS}::test_status_names_the_raft_leader_node_liveness_and_the_device_isr"
UNDER = f"{OPS}::test_a_shrunk_isr_is_reported_under_replicated_on_every_node"
DEAD = f"{OPS}::test_a_dead_node_is_down_and_the_logs_it_leads_are_offline"
LOST = "tests/cluster/test_lost_logs.py"
UNIT = "tests/cluster/test_ops_unit.py"
GROW = "tests/cluster/test_add_node.py"


def ops_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("ops-floor-lowered", "cluster/metastate.py raise_floor: a late batch lowers the floor",
          "cluster/metastate.py", "or int(floor) <= rec.get(\"floor\", 0):",
          "or int(floor) == rec.get(\"floor\", 0):",
          (f"{UNIT}::test_a_floor_only_rises_and_only_for_its_incarnation",)),
        m("ops-reassign-completes-out-of-sync", "cluster/metastate.py complete_reassign: the "
          "old replicas dropped before the new ones are in the ISR (the only copy dropped)",
          "cluster/metastate.py", "                or not set(target) <= set(rec[\"isr\"]):",
          "                or False:", (f"{UNIT}::test_a_reassignment_adds_replicas_first_and_"
                                       "drops_the_old_ones_once_in_sync",)),
        m("ops-reassign-drops-at-start", "cluster/metastate.py reassign: the replica set "
          "becomes the target at once (old replicas dropped before the new ones fetched)",
          "cluster/metastate.py",
          "        replicas = target + [r for r in rec[\"replicas\"] if r not in target]",
          "        replicas = list(target)", (f"{UNIT}::test_a_reassignment_adds_replicas_"
                                               "first_and_drops_the_old_ones_once_in_sync",)),
        m("ops-rebalance-no-leaders", "cluster/rebalance.py plan: leadership never moved (a new "
          "node holds replicas but leads nothing)", "cluster/rebalance.py",
          "        if leads[most] - leads[least] < 2:", "        if leads[most] - leads[least] "
          "< 99:", (f"{UNIT}::test_the_plan_gives_a_new_node_a_fair_share_and_keeps_rf",)),
    )
