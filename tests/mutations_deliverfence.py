"""Planted bugs for delivery across a leader change (cluster/deliverfence.py, broker/positions.py
``logs_moved``, broker/delivery.py's position check), run by ``tests/mutate.py`` (``tests/
mutate.py fence-``). Each names the test that caught it.
"""

from __future__ import annotations

from typing import Any

T = "tests/cluster/test_leader_change_delivery.py"
U = "tests/cluster/test_deliverfence_unit.py"
AGAIN0 = (f"{T}::test_a_resend_routed_again_by_a_restarted_leader_is_not_delivered_below_the_"
          "position[qos0-sub]")


def deliverfence_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("fence-no-read-back", "a log's epoch rises and no session reads it back from its "
          "position: what the old leader routed and never delivered (frozen, its link cut) "
          "arrives late, fenced, never",
          "broker/positions.py",
          "        catchup = self._catchup\n        if catchup is None:\n            return 0\n"
          "        moved = devices",
          "        catchup = self._catchup\n        if catchup is None or True:\n"
          "            return 0\n        moved = devices",
          (f"{T}::test_a_frozen_leader_s_queued_deliveries_are_read_from_the_log_in_order",)),
        m("fence-none", "a deposed leader's DELIVERs are handed on whatever their epoch",
          "cluster/deliverfence.py",
          "        if epoch < known:\n            self.fenced += 1\n            return False\n",
          "        if epoch < known:\n            self.fenced += 1\n            return True\n",
          (f"{U}::test_the_current_epoch_passes_an_older_one_is_dropped",)),
        m("fence-stale-reads-local", "before Raft's record of a newer epoch arrives, reads of "
          "that log go to this router's placement (itself, when it is the deposed leader): a "
          "catch-up goes live at its own log's end and skips the new leader's records",
          "cluster/deliverfence.py",
          "        if ahead is None or not ahead[1] or ahead[0] <= self._epoch_of(device):\n",
          "        if True:\n",
          (f"{U}::test_a_newer_delivery_reads_back_before_it_passes_and_fences_the_old_leader",)),
        m("fence-copies-below-position", "a session takes a routed copy below its position in "
          "that device log (a restarted leader routes a resend it finds stored by its previous "
          "run again; a re-elected leader's re-routing from its checkpointed mark): an older "
          "message after a newer one",
          "broker/delivery.py",
          "below its position.\n                return\n",
          "below its position.\n                pass\n",
          (f"{T}::test_a_resend_routed_again_by_a_restarted_leader_is_not_delivered_below_"
           "the_position",
           "tests/chaos/test_chaos_run.py::test_replicated_schedule",
           f"{T}::test_a_restarted_leader_s_copies_of_old_messages_are_not_delivered_again")),
        # route_again (a record found stored by this router's previous run): no QoS 0 copy,
        # here or, through the DELIVER's AGAIN mark, at the peers
        m("fence-again-qos0-copies", "broker/delivery.py route_again: a QoS 0 subscriber gets "
          "the copy a restarted leader routes again (it had it: a duplicate after newer "
          "messages of the device)",
          "broker/delivery.py",
          "                if qos:\n                    self.deliver(sessions[cid], msg, qos,",
          "                if True:\n                    self.deliver(sessions[cid], msg, qos,",
          (AGAIN0,)),
        m("fence-again-unmarked", "cluster/mesh.py forward_again: the copy goes to peers as a "
          "plain DELIVER (their QoS 0 subscribers get it again)",
          "cluster/mesh.py",
          "msg.device, None, frames.AGAIN)\n",
          "msg.device, None, None)\n",
          (AGAIN0,)),
        m("fence-again-mark-ignored", "cluster/mesh.py _apply: a DELIVER marked AGAIN routed "
          "as any other (QoS 0 subscribers get the copy again)",
          "cluster/peerentries.py",
          "            if e.group == frames.AGAIN:",
          "            if False:",
          (AGAIN0,)),
        m("fence-resend-scan-committed", "a restarted leader's resend check reads only committed "
          "records: a resent APPEND whose first copy is above the high-water mark is stored "
          "again",
          "cluster/idempotence.py",
          "            end = store.durable_end(device)\n",
          "            end = store.log_range(device)[1]\n",
          ("tests/cluster/test_resend_idempotence.py::"
           "test_a_resend_finds_its_uncommitted_first_copy_after_the_leader_s_restart",)),
    )
