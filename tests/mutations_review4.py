"""Planted bugs for review4's fault tests (the per-device high-water-mark acks, Raft placement,
cursors and fencing merged at d852b0d), run by ``tests/mutate.py review4-`` like every other
guard. Each names the test that caught it when it was planted by hand.
"""

from __future__ import annotations

from typing import Any

HWQ2 = ("tests/broker/test_review4_hwm_faults.py::"
        "test_held_qos2_answered_once_on_the_resumed_connection")
LATEQ2 = ("tests/cluster/test_review4_raftplace_faults.py::"
          "test_a_placement_answered_after_its_qos2_publisher_reconnected_is_pubrecd_once")
FENCE = ("tests/cluster/test_review4_raftplace_faults.py::"
         "test_appends_in_flight_across_a_raft_leader_restart_are_stored_not_fenced")
HWFULL = ("tests/broker/test_review4_hwm_faults.py::"
          "test_a_full_disk_while_a_device_is_held_refuses_the_new_and_keeps_the_held")
META = ("tests/cluster/test_review4_raftplace_faults.py::"
        "test_held_publishes_survive_their_metadata_process_killed_mid_proposal")

FLAPS = ("tests/cluster/test_review4_cursor_flaps.py::"
         "test_a_slow_replay_across_three_owner_link_cuts_misses_nothing_and_keeps_order")

HWLIM = ("tests/broker/test_review4_hwm_faults.py::"
         "test_one_held_device_past_the_held_limit_does_not_pause_other_devices_publishers")
# broker/ingest.py as it was before review4's fix (both halves: either alone fixes the stall)
_PAUSE_OLD = (
    "        if conn.unsettled >= PAUSE_MIN_UNSETTLED and conn not in self._paused_publishers:\n"
    "            conn.transport.pause_reading()\n"
    "            self._paused_publishers.add(conn)\n"
    "\n"
    "    def publisher_settled(self, conn: Connection, settled: list[Connection]) -> None:\n"
    '        """``conn`` has nothing unsettled any more (once a batch, not once a message): what\n'
    '        waited for that goes on."""\n'
    "        self._retain_waits.discard(conn)\n"
    "        if conn.pending is not None:\n"
    "            settled.append(conn)  # (released after the batch's acks: after_settle)\n"
    "        if conn in self._paused_publishers:\n"
)
# the same text with both halves of review4's fix undone (derived, so the two stay in step);
# since the logged runs (broker/loggedrun.py) both halves are methods that the per-message and
# the run paths share (IngestRoom.pause_if_holding, publisher_settled)
_PAUSE_NEW = _PAUSE_OLD.replace(
    "        if conn.unsettled >= PAUSE_MIN_UNSETTLED and conn not in self._paused_publishers:\n",
    "        if conn not in self._paused_publishers:\n", 1).replace(
    "        if conn in self._paused_publishers:\n", "        if False:\n", 1)
MOVES = "tests/cluster/test_review4_cursor_moves.py"


def review4_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review4-held-limit-pauses-everyone", "broker/ingest.py: past HELD_LIMIT every "
          "publisher is paused, and stays paused until the total falls to half: one device "
          "whose mark is held stops every other device's publishers (the bug review4 fixed)",
          "broker/ingest.py", _PAUSE_OLD, _PAUSE_NEW, (HWLIM,)),
        m("review4-held-limit-never-pauses", "broker/ingest.py: the publisher flooding a held "
          "device is never paused (memory grows without bound)",
          "broker/ingest.py", "PAUSE_MIN_UNSETTLED = 64\n", "PAUSE_MIN_UNSETTLED = 1 << 62\n",
          (HWLIM,)),
        m("review4-held-qos2-resumed-unanswered", "broker/forwarding.py: a QoS 2 publish "
          "settled after its connection closed is marked stored but its resumed connection "
          "never hears the PUBREC (the client waits on that packet id forever)",
          "broker/forwarding.py",
          "            if live is not None:\n                props = (",
          "            if False and live is not None:\n                props = (", (HWQ2,)),
        m("review4-resumed-pubrec-no-offsets", "broker/forwarding.py: the PUBREC of a QoS 2 "
          "publish settled after its connection closed omits the log position the resumed "
          "connection asked for (ack-offsets)",
          "broker/forwarding.py",
          "                         if msg is not None and live.ack_offsets else None)\n",
          "                         if False else None)\n", (HWQ2, LATEQ2)),
        m("review4-rollback-fails-held-durable", "commitlog/store.py: a failed write's rollback "
          "fails the commit waiters from the high-water mark instead of the durable end: a "
          "held device's durable record is refused (and delivered later anyway)",
          "commitlog/store.py",
          "                self._fail_waiters(dev, dev.durable_end, dev.next, exc)\n",
          "                self._fail_waiters(dev, dev.high_watermark, dev.next, exc)\n",
          (HWFULL,)),
        m("review4-placement-gives-up-on-lost-metadata", "cluster/metaclient.py Proposer (the "
          "placer's proposals): a proposal whose metadata process connection is lost (killed "
          "-9, restarted by its node) is taken as failed: the held publishes are refused "
          "although Raft could still place the log within cluster.append_timeout",
          "cluster/metaclient.py",
          "                why = f\"this node's metadata process is not reachable ({err!r})\"\n"
          "                self._redial(client)\n",
          "                why = f\"this node's metadata process is not reachable ({err!r})\"\n"
          "                self._redial(client)\n                return why\n", (META,)),
        m("review4-moved-replay-skips", "broker/sessionstore.py: a replay cursor handed over "
          "with its session (or restored) resumes 10 offsets past where it was: a gap",
          "broker/sessionstore.py",
          "                sub.replay = (router.logs.cursor(replay[0], replay[1])\n",
          "                sub.replay = (router.logs.cursor(replay[0], replay[1] + 10)\n",
          (MOVES,)),
        m("review4-inflight-appends-not-resent", "cluster/link.py: APPENDs in flight when the "
          "link reconnects (the owner frozen, killed -9, restarted) are dropped, not resent: "
          "their publishers wait out cluster.append_timeout and are refused",
          "cluster/link.py", "            resend.append(out)\n            unacked += out.count\n",
          "            self.queued_bytes -= out.size\n", (FENCE,)),
        m("review4-cursor-read-never-retried", "broker/cursors.py: a failed read of the "
          "owner's log (the link cut mid-replay) marks the cursor retrying and never retries: "
          "the replay stalls for good",
          "broker/cursors.py",
          "        self._loop.call_later(RETRY_S, self._retry, session, c, reader)\n",
          "        pass\n", (FLAPS,)),
    )
