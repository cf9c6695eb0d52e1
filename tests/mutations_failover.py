"""Planted bugs for failover (issue 24 step 4): the controller, node liveness, the restarted
routers' fencing, the leader lease and the minority side's refusal; run by ``tests/mutate.py``
(``tests/mutate.py failover-``). Each test of ``tests/cluster/test_failover.py`` and
``tests/cluster/test_controller_unit.py``, and the metastate unit tests added with them, is
named by at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

FO = "tests/cluster/test_failover.py"
CU = "tests/cluster/test_controller_unit.py"
MS = "tests/cluster/test_metastate_unit.py"
CTL = "cluster/controller.py"
CV = "tests/cluster/test_controller_voters.py"


def failover_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ------------------------------------------------------------- elect a non-ISR member
        m("failover-elect-non-isr", "controller: candidates taken from the replicas, not the "
          "ISR (a replica that left the ISR, maybe missing acked records, elected)", CTL,
          "        keep = [r for r in isr if _node(r) in alive",
          "        keep = [r for r in (rec.get(\"replicas\") or isr) if _node(r) in alive",
          (f"{CU}::test_only_isr_members_are_elected_never_a_replica_that_left_it",)),
        m("failover-metastate-elect-non-isr", "metastate: elect accepts a router outside the "
          "ISR (unclean election)", "cluster/metastate.py",
          '        if rec["epoch"] != expected_epoch or leader not in rec["isr"]:\n'
          '            return False, rec, None\n        if isr is not None',
          '        if rec["epoch"] != expected_epoch:\n'
          '            return False, rec, None\n        if isr is not None',
          (f"{MS}::test_elect_takes_the_chosen_routers_registered_incarnation_and_shrinks_the_isr",)),
        m("failover-elect-keeps-dead-in-isr", "controller: the dead router left in the new ISR",
          CTL, '        cmds.append(["elect", device, rec["epoch"], preferred, keep])',
          '        cmds.append(["elect", device, rec["epoch"], preferred, list(isr)])',
          (f"{FO}::test_kill9_of_a_log_leader_moves_its_logs_and_the_node_returns_empty_"
           "leading_nothing",)),
        # ----------------------------------------------------------- elect before the lease
        m("failover-elect-before-lease", "controller: a node dead after 0.2 s of silence, "
          "not cluster.node_timeout (elected while its routers' lease still lets them ack)",
          CTL, "        elif now - max(last_heard(addr), since) < node_timeout:",
          "        elif now - max(last_heard(addr), since) < TICK * 4:",
          (f"{CU}::test_a_node_is_dead_only_after_node_timeout_counted_from_the_controllers_"
           "start",
           f"{FO}::test_a_router_cut_off_from_raft_refuses_publishes_before_the_majority_"
           "elects")),
        m("failover-new-controller-no-wait", "controller: a new controller declares nodes it "
          "never heard dead at once (ignores when it took over)", CTL,
          "        elif now - max(last_heard(addr), since) < node_timeout:",
          "        elif now - last_heard(addr) < node_timeout:",
          (f"{CU}::test_a_node_is_dead_only_after_node_timeout_counted_from_the_controllers_"
           "start",)),
        # --------------------------------------------------- a restarted router resuming lead
        m("failover-restarted-resumes", "router: a record naming this router by an election "
          "of its previous process is led here again (no incarnation fencing)",
          "cluster/raftplace.py",
          "        fenced_here = leader == self.placement.me and not self.leads_here(rec)\n",
          "        fenced_here = False\n",
          (f"{FO}::test_a_restarted_router_never_resumes_leading_with_what_it_has",)),
        m("failover-empty-disk-reelected", "controller: a restarted leader re-elected even "
          "with its disk lost (offsets would restart at 0)", CTL,
          '        lost = restarted and not (reg or {}).get("kept_logs")',
          "        lost = False",
          (f"{CU}::test_a_restarted_sole_isr_member_leads_again_only_if_it_kept_its_logs",
           f"{FO}::test_a_restarted_router_never_resumes_leading_with_what_it_has")),
        m("failover-since-ignored", "placement: an APPEND queued for the previous epoch of a "
          "router re-elected after its restart is fenced (in-flight publishes refused)",
          "cluster/placement.py",
          "        if epoch < current and self._since.get(device, current) <= epoch:\n",
          "        if False:\n",
          ("tests/cluster/test_placement_unit.py::test_an_append_naming_an_epoch_of_the_same_"
           "leaders_unbroken_run_is_accepted",
           "tests/cluster/test_review4_raftplace_faults.py::test_appends_in_flight_across_a_"
           "raft_leader_restart_are_stored_not_fenced")),
        m("failover-metastate-since-kept-on-move", "metastate: leader_since kept when another "
          "router is elected (APPENDs for the old leader accepted by the new one)",
          "cluster/metastate.py", '            rec.pop("leader_since", None)\n', "",
          (f"{MS}::test_re_electing_the_same_router_keeps_since_when_it_leads",)),
        m("failover-cfg-timeouts", "config: node_timeout not checked against leader_lease",
          "meshmq/config.py", "    if node_timeout <= lease + LEASE_SLACK:\n",
          "    if False:\n",
          ("tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"
           "[node-timeout-within-lease]",)),
        m("failover-cfg-mqtt", "config: a node's mqtt address not checked",
          "meshmq/config.py", "            if mqtt:\n                parse_bind(mqtt)\n",
          "            pass\n",
          ("tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"
           "[node-mqtt-not-an-address]",)),
        m("failover-restart-not-fenced", "controller: a leader that restarted (new "
          "incarnation) is left leading", CTL,
          '        restarted = inc is not None and reg is not None and reg["incarnation"] != inc',
          "        restarted = False",
          (f"{CU}::test_a_restarted_leader_is_elected_again_or_replaced",
           f"{FO}::test_a_restarted_router_never_resumes_leading_with_what_it_has")),
        # ------------------------------------------------------------------- the lease
        m("failover-lease-never-expires", "lease: valid forever (a router cut off from the "
          "Raft majority keeps acknowledging)", "cluster/lease.py",
          "        return time.monotonic() - self.majority_at < self.duration",
          "        return True",
          (f"{FO}::test_a_router_cut_off_from_raft_refuses_publishes_before_the_majority_"
           "elects",)),
        m("failover-follower-lease-on-receipt", "raftcontact: a follower's majority time is "
          "when it heard the leader, not the leader's own majority time", "cluster/raftcontact.py",
          "                self.leader_majority = max(self.leader_majority, now - age)",
          "                self.leader_majority = max(self.leader_majority, now)",
          (f"{CU}::test_majority_contact_for_a_leader_and_for_a_follower",)),
        m("failover-no-server-reference", "refusal: DISCONNECT 0x9C without the Server "
          "Reference", "broker/writegate.py",
          "            props[Prop.SERVER_REFERENCE] = reference",
          "            pass",
          (f"{FO}::test_a_router_cut_off_from_raft_refuses_publishes_before_the_majority_"
           "elects",)),
        # ------------------------------------------------------------------- batching
        m("failover-one-log-per-round", "controller: one election per proposal (thousands of "
          "logs would take thousands of rounds)", CTL,
          "        cmds.append([\"elect\", device, rec[\"epoch\"], preferred, keep])\n"
          "    return cmds, offline",
          "        cmds.append([\"elect\", device, rec[\"epoch\"], preferred, keep])\n"
          "    return cmds[:1], offline",
          (f"{CU}::test_a_dead_nodes_logs_go_to_a_live_isr_member_in_one_batch",
           f"{CV}::test_a_dead_nodes_thousands_of_logs_fail_over_in_one_proposal")),
        m("failover-line-limit", "metadata socket: asyncio's default 64 KiB line limit (a "
          "batch or snapshot of a few hundred logs breaks the stream)", "cluster/metaclient.py",
          "LINE_LIMIT = 256 * 1024 * 1024\n", "LINE_LIMIT = 64 * 1024\n",
          (f"{CV}::test_a_dead_nodes_thousands_of_logs_fail_over_in_one_proposal",)),
    )
