"""Planted bugs found when replication, failover, sessions and ops met (the lead's merge of
issue 24's branches), each caught by a real-process test."""

from __future__ import annotations

from typing import Any

SESSIONS = "tests/cluster/test_session_registry.py"
FAILOVER = "tests/cluster/test_failover.py"


def integration_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("integration-resend-any-owner", "cluster/idempotence.py: a restarted leader's resend "
          "check matches records another leader appended for the same publisher under its "
          "own link's seqs (a new publish answered 'stored at offset 28' and lost: chaos seed "
          "3285)", "cluster/idempotence.py",
          "        return index.get(_SRC.pack(self._inc, seq, self._owner))\n",
          "        return next((o for v, o in index.items() if v[:16] == _SRC.pack(\n"
          "            self._inc, seq, self._owner)[:16]), None)\n",
          ("tests/cluster/test_idempotence_unit.py::test_a_record_another_leader_appended_for_"
           "the_same_publisher_is_not_a_resend",)),
        m("integration-stale-follower-kept", "cluster/controller.py plan: a follower that "
          "re-registered since the ISR was set stays in the ISR and is electable",
          "cluster/controller.py",
          "                 and int(routers[r].get(\"since\", 0)) > isr_at]\n",
          "                 and False]\n",
          ("tests/cluster/test_controller_unit.py::test_a_follower_restarted_since_the_isr_"
           "was_set_leaves_it_and_is_never_elected",)),
        m("integration-inherited-tail-not-routed", "meshmq/replication_wiring.py: a new leader "
          "never routes the records it inherited uncommitted (its dead predecessor appended "
          "them and died before routing): subscribers miss them", "meshmq/replication_wiring.py",
          "    manager.on_inherited = lambda device, lo, hi: "
          "route_inherited(node, device, lo, hi)\n",
          "", ("tests/cluster/test_replication.py::test_a_record_its_dead_leader_never_routed_"
               "reaches_subscribers_from_the_new_one",)),
        m("integration-inherited-tail-refused-like-acks", "cluster/replication.py _check: a "
          "new leader's inherited tail is given up with the acks its held mark refuses at "
          "cluster.append_timeout (the follower back later commits it, delivered to nobody: "
          "CI, 2026-11-26)", "cluster/replication.py",
          "        failed = self.store.fail_high_watermark_waiters(device, "
          "NotEnoughReplicas(why))\n",
          "        led.inherited = None\n"
          "        failed = self.store.fail_high_watermark_waiters(device, "
          "NotEnoughReplicas(why))\n",
          ("tests/cluster/test_replication.py::test_a_record_its_dead_leader_never_routed_"
           "reaches_subscribers_from_the_new_one[back-after-timeout]",)),
        m("integration-inherited-tail-after-new-epoch", "cluster/replication.py _move_mark: "
          "the store's mark moves past a new leader's inherited tail and this epoch's records "
          "at once, so their commit waiters route the new records before the tail, which the "
          "subscriber then drops as copies below its position (found under load by the "
          "frozen-leader test)", "cluster/replication.py",
          "            if cut > lo and cut > led.published:\n",
          "            if False:\n",
          ("tests/cluster/test_replication.py::test_a_record_its_dead_leader_never_routed_"
           "reaches_subscribers_from_the_new_one[back-at-once]",)),
        m("integration-refused-record-never-routed", "broker/ingest.py _on_durable: a record "
          "whose ack was refused (not enough in-sync replicas) but which stays in the log is "
          "never routed when the high-water mark passes it later (a stored message missed by "
          "every subscriber: found by the chaos suite, seed 3285)", "broker/ingest.py",
          "        later = isinstance(exc, NotCommittedYet) and self.logs is not None\n",
          "        later = False\n",
          ("tests/cluster/test_replication.py::test_without_min_insync_replicas_a_publish_is_"
           "refused_never_acked",)),
        m("integration-reader-named-replica", "cluster/mesh.py fetch: a router's log read names "
          "the router as replica, so a leader that router follows takes the read for its "
          "follower's fetch (diverging answers, the follower's log end learned from a reader)",
          "cluster/mesh.py",
          "                req, device, offset, min(max_records, FETCH_MAX_RECORDS), \"\"),\n",
          "                req, device, offset, min(max_records, FETCH_MAX_RECORDS), self.rid),\n",
          (f"{SESSIONS}::test_a_persistent_subscriber_resumes_on_another_node_after_its_node_"
           "is_lost",)),
        m("integration-minority-connect-0x88", "broker/registry.py: a minority-side CONNECT "
          "gets 0x88 with no Server Reference (the client is not told where the majority is)",
          "broker/registry.py",
          "        if pkt.protocol_level == 5 and refusal is not None and refusal[1]:\n",
          "        if False:\n",
          (f"{FAILOVER}::test_a_router_cut_off_from_raft_refuses_publishes_before_the_"
           "majority_elects",)),
        m("integration-lost-only-replica-not-marked", "cluster/controller.py plan: a log whose "
          "only in-sync replica came back empty stays 'offline', never reported lost",
          "cluster/controller.py",
          "                cmds.append([\"mark_lost\", device, rec[\"incarnation\"], floor, 0])\n",
          "                pass\n",
          ("tests/cluster/test_lost_logs.py",)),
    )
