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
        # ------------------------------------------------------------ cluster status, metrics
        m("ops-under-replicated-never", "cluster/loghealth.py: a log whose ISR is smaller "
          "than its replicas is not counted under-replicated",
          "cluster/loghealth.py",
          "        if len(isr) < len([r for r in rec.get(\"replicas\") or () if r not in adding]):",
          "        if False:", (UNDER,)),
        m("ops-offline-never", "cluster/loghealth.py: a log led from a dead node is not "
          "counted offline", "cluster/loghealth.py",
          "(known and not alive.get(split_router_id(leader)[0], False))", "False", (DEAD,)),
        m("ops-liveness-always", "cluster/loghealth.py: every node reported alive, whatever "
          "the Raft leader sees", "cluster/loghealth.py",
          '        out.append({"id": n.id, "raft": addr, "alive": alive.get(addr),',
          '        out.append({"id": n.id, "raft": addr, "alive": True,', (DEAD,)),
        m("ops-liveness-follower-unknown", "cluster/metaserver.py: a follower cannot say "
          "(liveness never asked of the Raft leader)", "cluster/metaserver.py",
          "                remote = await self.loop.run_in_executor(None, self._ask_status, "
          "leader)", "                raise OSError(\"not asked\")", (STATUS,)),
        m("ops-leader-changes-not-counted", "cluster/metaserver.py: Raft leaders seen not "
          "counted", "cluster/metaserver.py", "                self.leader_changes += 1\n",
          "                self.leader_changes += 0\n", (STATUS,)),
        m("ops-device-line-no-replicas", "meshmq/clustercli.py: the 'leader of device' line "
          "leaves out the replicas", "meshmq/clustercli.py",
          "            isr += f\", replicas {','.join(owner['replicas'])}\"",
          "            pass", (STATUS,)),
        m("ops-limit-ignored", "cluster/loghealth.py: the lists are not cut at --limit",
          "cluster/loghealth.py", "    limit = max(0, limit)\n", "    limit = 1 << 30\n",
          (UNDER,)),
        m("ops-cli-exit-0-unhealthy", "meshmq/clustercli.py: exit 0 with under-replicated "
          "logs", "meshmq/clustercli.py", "        if state[\"count\"]:\n            healthy = "
          "False\n", "        if state[\"count\"]:\n            healthy = True\n", (UNDER,)),
        m("ops-metric-offline-zero", "meshmq/metrics.py: the log gauges read the wrong key "
          "(always 0)", "meshmq/metrics.py",
          "        count = value.get(\"count\", 0) if isinstance(value, dict) else value",
          "        count = 0 if isinstance(value, dict) else value", (UNDER,)),
        # ---------------------------------------------------------------- floors, lost logs
        m("ops-lost-log-served", "cluster/logfloor.py admit: a log short of its floor is led "
          "anyway (restarted at offset 0)", "cluster/logfloor.py",
          "        if not lost and end >= floor:\n", "        if True:\n", (LOST,)),
        m("ops-floor-never-raised", "cluster/logfloor.py due: no floor ever proposed (a lost "
          "disk is not seen)", "cluster/logfloor.py",
          "            if hw > int(rec.get(\"floor\") or 0):\n", "            if False:\n",
          (LOST,)),
        m("ops-lost-not-marked", "cluster/metastate.py mark_lost: refused always (only the "
          "router that found it knows)", "cluster/metastate.py",
          "                or not 0 <= int(end) < floor or rec.get(\"lost\"):",
          "                or True:", (LOST,)),
        m("ops-lost-unchecked-after-snapshot", "cluster/raftplace.py learn: records are not "
          "checked against the floor (a voter that catches up after its snapshot names the "
          "router leader of a log it lost)", "cluster/raftplace.py",
          "        if (not fenced_here or rec.get(\"lost\")) and self.admit is not None \\\n"
          "                and not self.admit(device, rec):",
          "        if False:", (LOST,)),
        m("ops-cfg-floor-interval-zero", "meshmq/config.py: cluster.log_floor_interval = 0 "
          "accepted (a router proposing floors in a busy loop)", "meshmq/config.py",
          '        "log_floor_interval": (_Float(0.0, inclusive=False),',
          '        "log_floor_interval": (_Float(0.0, inclusive=True),',
          ("tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"
           "[log-floor-interval-zero]",)),
        m("ops-floor-lowered", "cluster/metastate.py raise_floor: a late batch lowers the floor",
          "cluster/metastate.py", "or int(floor) <= rec.get(\"floor\", 0):",
          "or int(floor) == rec.get(\"floor\", 0):",
          (f"{UNIT}::test_a_floor_only_rises_and_only_for_its_incarnation",)),
        # ------------------------------------------------------------ rebalance, reassign
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
        # ------------------------------------------------------------------ adding a node
        m("ops-grow-router-hash", "meshmq/cluster_wiring.py placement_of: routers place a "
          "log Raft has not told them of by the static hash (a new node appends a log it "
          "has not heard of yet at offset 0)", "meshmq/cluster_wiring.py",
          "                              static=settings.placement != \"raft\")",
          "                              static=True)", (GROW,)),
        m("ops-grow-admin-hash", "meshmq/node_admin.py: a node's admin answers by the static "
          "hash (the new node names other leaders, its proxy sends reads elsewhere)",
          "meshmq/node_admin.py", "static=metadata is None)", "static=True)", (GROW,)),
    )
