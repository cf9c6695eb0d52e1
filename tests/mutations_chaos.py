"""Planted bugs the chaos suite's checker must catch (issue 23), run by ``tests/mutate.py``
like every other guard (``tests/mutate.py chaos-``).

The four broker bugs of the issue, each caught by a short real run
(``tests/chaos/test_chaos_run.py::test_probe``: two disk-full faults and two link cuts,
which today's cluster passes), then bugs in
the checker itself, each caught by its unit tests on crafted histories
(``tests/chaos/test_checker.py``). Kept in a module of their own so the mesh's mutations and
these do not fight over one tuple.
"""

from __future__ import annotations

from typing import Any

PROBE = "tests/chaos/test_chaos_run.py::test_probe"
UNIT = "tests/chaos/test_checker.py"
CHK = "tests/chaos/checker.py"
RR = "tests/chaos/replica_rules.py"


def chaos_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ------------------------------------------------------------ the broker, via a run
        m("chaos-ack-before-owner-stored",
          "broker/forwarding.py append_at_owner: the publisher's router acks a remote-owner "
          "publish at once instead of on the owner's answer",
          "broker/forwarding.py",
          "            lambda exc, offset: self._stored_at_owner(conn, packet_id, msg, exc, "
          "offset))\n",
          "            lambda exc, offset: None)\n"
          "        self._stored_at_owner(conn, packet_id, msg, None, -1)\n",
          (PROBE,)),
        m("chaos-drop-every-100th-delivery",
          "broker/delivery.py deliver: every 100th delivery to a subscriber silently dropped",
          "broker/delivery.py",
          "        qos = msg.qos if msg.qos < granted else granted  # [MQTT-3.3.5-1]\n",
          "        self._chaos_n = getattr(self, '_chaos_n', 0) + 1\n"
          "        if self._chaos_n % 100 == 0:\n"
          "            return\n"
          "        qos = msg.qos if msg.qos < granted else granted  # [MQTT-3.3.5-1]\n",
          (PROBE,)),
        m("chaos-offset-handed-out-twice",
          "broker/devicelogs.py append: every 40th record's offset reported as its "
          "predecessor's (the ack and the routed message name an offset already given out)",
          "broker/devicelogs.py",
          "            msg.device = key\n            msg.offset = offset\n",
          "            if offset % 40 == 39:\n"
          "                offset -= 1\n"
          "            msg.device = key\n            msg.offset = offset\n",
          (PROBE,)),
        m("chaos-link-resend-off",
          "cluster/link.py established: entries in flight on a dropped link are forgotten, "
          "not resent",
          "cluster/link.py",
          "            resend.append(out)\n            unacked += out.count\n",
          "            unacked += out.count\n",
          # the chaos probe alone never caught it: its logged deliveries lost with the link
          # come back through the receiver's offset-gap read (cluster/routegap.py) and its
          # lost APPENDs end unanswered or refused, never as a violation; an unlogged QoS 1
          # stream through a blackholed link has no such second path
          (PROBE, "tests/cluster/test_link_faults.py::"
                  "test_a_cut_link_heals_and_delivers_each_qos1_message_exactly_once[unlogged]")),
        m("chaos-ack-before-hw",
          "broker/devicelogs.py _seal: each device's publishes answered before the flush, "
          "not when the high-water mark passes them (issue 24's 'ack before the high-water "
          "mark': on one node the mark is the durable end, so this acks before the fsync)",
          "broker/devicelogs.py",
          "                committer.when_high_watermark(key, group[-1][2].offset, passed)\n",
          "                passed(None)\n",
          (PROBE,)),
        # ------------------------------------------------------------- the checker itself
        m("chaos-checker-false-ack-ignored", "checker: an acked message never stored passes",
          CHK, "                res.false_acks += 1\n", "                pass\n",
          (UNIT + "::test_false_ack_an_acked_message_never_stored_nor_seen",)),
        m("chaos-checker-lost-ignored", "checker: an acked message delivered then gone passes",
          CHK, "                res.lost += 1\n                res.find(\"lost\", f\"{payload",
          "                res.find(\"lost\", f\"{payload",
          (UNIT + "::test_lost_an_acked_message_delivered_then_gone_from_the_log",)),
        m("chaos-checker-acked-offset-unchecked",
          "checker: an ack naming another offset than the stored one passes",
          CHK, "        elif acked_at is not None and int(acked_at) not in where:\n",
          "        elif False:\n",
          (UNIT + "::test_lost_an_acked_offset_that_holds_another_message",)),
        m("chaos-checker-dups-ignored", "checker: one attempt stored twice passes",
          CHK, "            res.dups_in_log += len(offs) - 1\n", "            pass\n",
          (UNIT + "::test_dup_in_log_one_attempt_stored_twice",)),
        m("chaos-checker-retry-as-dup",
          "checker: two attempts of one seq counted as a dup (a false positive)",
          CHK, "            offsets_of[key].append(int(rec[0]))\n",
          "            offsets_of[(key[0], key[1], 0)].append(int(rec[0]))\n",
          (UNIT + "::test_a_retried_write_stored_twice_is_no_dup",)),
        m("chaos-checker-order-unchecked", "checker: order violations not counted",
          CHK, "                    res.order_violations += 1\n", "                    pass\n",
          (UNIT + "::test_order_violation_an_acked_seq_after_a_later_one",)),
        m("chaos-checker-late-copy-flagged",
          "checker: a late copy of an unknown-outcome attempt flagged as reordering",
          CHK, "                if key in ok_keys:\n", "                if True:\n",
          (UNIT + "::test_a_late_unknown_attempt_out_of_order_is_no_violation",)),
        m("chaos-checker-clean-owed-while-away",
          "checker: a clean session owed what was published while its node was faulted",
          CHK, "        if _fault_hits(f, node) and", "        if False and",
          (UNIT + "::test_a_clean_session_is_owed_nothing_while_away_or_its_node_faulted",)),
        m("chaos-checker-persistent-like-clean",
          "checker: a persistent session owed only what came while it was connected",
          CHK, '    if kind == "persistent":\n        segments', '    if kind == "x":\n'
          "        segments",
          (UNIT + "::test_a_persistent_session_is_owed_what_was_stored_while_it_was_away",)),
        m("chaos-checker-group-any-member",
          "checker: a group owed what any member is owed (a false positive under faults)",
          CHK, "            owed_any &= _owed(", "            owed_any |= _owed(",
          (UNIT + "::test_a_group_is_owed_only_while_every_member_is_healthy",)),
        m("chaos-checker-replay-unchecked", "checker: replay subscribers owed nothing",
          CHK, '        return {k for k, (d, _t) in stored.items() if d == sub["device"]}\n',
          "        return set()\n",
          (UNIT + "::test_missed_delivery_each_subscriber_kind",)),
        m("chaos-checker-delivery-order-unchecked", "checker: a live subscriber's records "
          "received out of log order pass", CHK,
          "            if off < top:\n                inversions.append(",
          "            if False:\n                inversions.append(",
          (UNIT + "::test_delivery_order_a_live_subscriber_gets_a_record_after_a_later_one",)),
        m("chaos-checker-dup-is-inversion", "checker: a redelivered copy counts as a delivery "
          "order inversion (a false positive on every QoS 1 resend)", CHK,
          "            if key in seen or off is None:\n",
          "            if off is None:\n",
          (UNIT + "::test_delivery_order_duplicates_and_new_sessions_are_no_inversion",)),
        m("bench-replicated-lag-since-start",
          "bench/replicated.py lag_p99: the p99 of the histogram's totals since start, not of "
          "the window (the busy metadata process's lag diluted by everything before it)",
          "bench/replicated.py",
          "    delta = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)\n",
          "    delta = sorted((le, after.get(le, 0.0)) for le in after)\n",
          ("tests/bench/test_cluster_bench.py::"
           "test_loop_lag_p99_is_taken_from_the_window_not_the_total",)),
        m("chaos-port-cut-noop",
          "tests/chaos/net.py NetnsNet.cut_ports: the rules look up an empty table (the "
          "blackhole route is in another): raft-cut and fetch-cut change nothing",
          "tests/chaos/net.py",
          '            _run(*ns, "ip", "rule", "add", *sel, "lookup", str(table))\n',
          '            _run(*ns, "ip", "rule", "add", *sel, "lookup", str(table + 50))\n',
          ("tests/chaos/test_faults.py",)),
        # ------------------------------------------------ the replica rules (issue 24)
        m("chaos-replicas-isr-member-without-log-passes",
          "replica_rules: an ISR member holding no log is not counted",
          RR, "            if rid in required:\n", "            if False:\n",
          (UNIT + "::test_replicas_an_isr_member_without_the_log",)),
        m("chaos-replicas-not-built-fails",
          "replica_rules: followers without a log fail a tree without replication (a false "
          "positive on every raft run today)",
          RR, "        required = isr if built else [leader]\n", "        required = isr\n",
          (UNIT + "::test_replicas_not_built_yet_only_the_leader_must_hold_the_log",)),
        m("chaos-replicas-acked-missing-passes",
          "replica_rules: an acked message missing from an ISR replica passes (the planted "
          "'ack before the high-water mark' then goes unseen)",
          RR, '                        ("at another offset", moved), ("out of publish order", '
          "order)):\n        if items:\n",
          '                        ("at another offset", moved), ("out of publish order", '
          "order)):\n        if items and what != \"missing\":\n",
          (UNIT + "::test_replicas_ack_before_the_high_water_mark_passes_is_caught",)),
        m("chaos-replicas-order-and-dups-pass",
          "replica_rules: acked messages stored twice or out of publish order in a replica pass",
          RR, "        if len(offs) > 1:\n            twice.append(",
          "        if False:\n            twice.append(",
          (UNIT + "::test_replicas_an_acked_message_twice_or_out_of_order_in_a_replica",)),
        m("chaos-replicas-bytes-unchecked",
          "replica_rules: replicas differing below the high-water mark pass",
          RR, "        bad = sorted(o for o in set(want) | set(have) if want.get(o) != "
          "have.get(o))\n",
          "        bad = sorted(o for o in set(want) ^ set(have))\n",
          (UNIT + "::test_replicas_a_follower_differing_below_the_high_water_mark",)),
        m("chaos-replicas-two-leaders-one-epoch-pass",
          "replica_rules: two replicas holding different bytes at one (epoch, offset) pass",
          RR, "                     if len(set(by.values())) > 1)\n",
          "                     if len(by) > 99)\n",
          (UNIT + "::test_replicas_two_leaders_wrote_one_offset_in_one_epoch",)),
        m("chaos-replicas-epoch-start-unchecked",
          "replica_rules: one epoch starting at different offsets on two replicas passes",
          RR, "        if len(set(where.values())) > 1:\n", "        if False:\n",
          (UNIT + "::test_replicas_one_epoch_starting_at_two_offsets",)),
        m("chaos-replicas-epoch-above-raft-passes",
          "replica_rules: a replica holding an epoch Raft never granted passes",
          RR, "            if int(e[0]) > raft_epoch:\n", "            if False:\n",
          (UNIT + "::test_replicas_an_epoch_raft_never_granted",)),
    )
