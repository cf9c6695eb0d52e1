"""Planted bugs for review 7's fault attacks on this session's failover changes (publishes
moved to a new leader: cluster/appendmove.py; publishes held for the write gate:
broker/gatehold.py), run by ``tests/mutate.py review7-``. Each names the real-process test of
``tests/cluster/test_review7_faults.py`` that catches it.
"""

from __future__ import annotations

from typing import Any

T = "tests/cluster/test_review7_faults.py"
MOVED = f"{T}::test_a_moved_append_already_committed_is_answered_by_its_first_copy_never_" \
        "stored_twice"
HERE = f"{T}::test_a_moved_append_to_this_router_which_fetched_its_first_copy_is_not_" \
       "stored_twice"
ROT = f"{T}::test_a_leader_restarted_with_a_rotted_record_does_not_lead_with_the_hole"
ROT_UNIT = ("tests/cluster/test_controller_unit.py::test_a_restarted_leader_whose_recovery_"
            "quarantined_a_record_is_not_elected_again")
QOS2 = f"{T}::test_qos2_publishes_moved_while_their_client_was_away_get_pubrec_once_stored"
SUBORDER = f"{T}::test_a_subscribe_after_a_held_retained_publish_takes_effect_after_it"
ORDER = f"{T}::test_a_qos0_publish_after_a_held_qos1_one_is_stored_after_it"
GAP = f"{T}::test_a_lease_gap_longer_than_lease_hold_refuses_held_publishes_and_stores_none"


def review7_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review7-moved-not-maybe-stored", "cluster/appendmove.py: a sent APPEND moves to the "
          "new leader without maybe_stored, so one the old leader committed (a follower "
          "fetched it, its RESULT was lost) is stored a second time", "cluster/appendmove.py",
          "                msg.maybe_stored = True  # the new leader looks for its earlier copy "
          "first\n", "                pass\n", (MOVED,)),
        m("review7-moved-here-no-lookup", "cluster/appendmove.py: a sent APPEND moved to "
          "this router (elected leader) is appended without looking for its first copy, "
          "which this router fetched as a follower: stored twice", "cluster/appendmove.py",
          "            if new == mesh.rid:\n                self.append_here(",
          "            if new == mesh.rid:\n                msg.maybe_stored = False\n"
          "                self.append_here(", (HERE,)),
        m("review7-damaged-leader-reelected", "cluster/controller.py plan: a restarted "
          "leader whose recovery quarantined a record of the log is elected again (it serves "
          "the hole; the followers' good copies are never read)", "cluster/controller.py",
          "            keep.remove(leader)\n", "            pass\n", (ROT_UNIT, ROT)),
        m("review7-damaged-not-reported", "meshmq/cluster_wiring.py: the router does not tell "
          "Raft which logs its recovery found damaged (the controller cannot know)",
          "meshmq/cluster_wiring.py",
          "    damaged = [k for k in node.store.keys() if node.store.lost_ranges(k, 0, 1 << 62)]",
          "    damaged = [k for k in node.store.keys() if False]", (ROT,)),
        m("review7-qos2-outcome-for-closed-conn-dropped", "broker/forwarding.py: a QoS 2 "
          "outcome arriving after its connection closed (a moved APPEND's) is not settled in "
          "the session: the id stays pending and the client's resend is never answered",
          "broker/forwarding.py",
          "        if msg.qos == 2 and conn.closing and conn.session is not None:\n",
          "        if False:\n", (QOS2,)),
        m("review7-held-not-unsettled", "broker/gatehold.py: a publish held for the write "
          "gate does not count as unsettled, so a SUBSCRIBE sent after it takes effect first",
          "broker/gatehold.py",
          "        conn.unsettled += 1  # what the client sends after it waits behind it "
          "(router)\n",
          "        conn.unsettled += 0\n", (SUBORDER,)),
        m("review7-qos0-overtakes-held", "broker/handle_publish.py: a QoS 0 publish is not "
          "held behind its connection's publishes held for the write gate, so it is appended "
          "ahead of them (the device log out of publish order)", "broker/handle_publish.py",
          "if gate is not None and (qos or (self.gate_held.per_conn",
          "if gate is not None and (qos or (False and self.gate_held.per_conn", (ORDER,)),
        m("review7-hold-expired-closes-silently", "broker/gatehold.py: a publish whose hold "
          "ran out (the lease out longer than cluster.lease_hold) closes the connection without "
          "the v5 DISCONNECT 0x9C and its Server Reference (the client is not told where to go)",
          "broker/gatehold.py",
          "            self.refused += 1\n            refuse(conn, refusal)\n",
          "            self.refused += 1\n            conn.close()\n", (GAP,)),
    )
