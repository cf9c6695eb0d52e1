"""Planted bugs for issue 25's single-node speed work (``tests/mutate.py speed-``): the QoS 0
copy's own write path (``DeliveryRoom._write_qos0``, ``Message.packet0``) must keep every flag
and limit the general path keeps; the cost guard must see a slower hot path. (The compiled
encoder, ``broker/protocol/_speedups.c`` ``publish_packet``, is checked against the Python
encoder by tests/protocol/test_codec_speedups.py; a C plant needs a rebuild, so it was planted
by hand: see the commit message.)"""

from __future__ import annotations

from typing import Any

SHAPES = "tests/broker/test_qos0_shapes.py"
RETAIN = (f"{SHAPES}::test_qos0_copies_carry_the_retain_flag_only_for_what_was_sent_as_retained"
          "[4]")
MPS = f"{SHAPES}::test_a_qos0_copy_larger_than_the_clients_maximum_packet_size_is_not_sent"
GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"
LR = "tests/broker/test_logged_run_delivery.py"
LR_SLOW = f"{LR}::test_a_slow_subscriber_with_a_small_window_gets_a_long_stream_once_in_order"
LR_ROOM = f"{LR}::test_a_lagging_subscriber_whose_window_has_room_is_still_fed_in_log_order"
LR_WRAP = f"{LR}::test_packet_ids_wrap_past_65535_around_ids_still_in_flight"
LR_RESUME = f"{LR}::test_a_persistent_session_resumes_across_a_disconnect_and_a_restart"
LR_MIXED = f"{LR}::test_mixed_subscribers_of_one_run_each_get_their_copy"
LR_HEADERS = (f"{LR}::test_a_lagging_v5_subscriber_reads_back_what_is_not_plain_with_its_"
              "properties")
LR_ACL = f"{LR}::test_a_run_on_a_topic_the_subscriber_may_not_read_never_reaches_it"
LR_SHARED = (f"{LR}::test_a_run_with_a_shared_group_member_reaches_every_member_and_the_"
             "plain_subscriber")
LR_REPLAY = f"{LR}::test_an_offset_subscription_reads_history_then_the_runs_once"
RUN = "tests/broker/test_publish_run.py"
RUN_ALL = f"{RUN}::test_every_subscriber_gets_a_run_as_it_would_one_message_at_a_time[runs]"
RUN_ID = RUN_ALL.replace("[runs]", "[sub-id]")
RUN_KEPT = f"{RUN}::test_a_retained_publish_that_would_start_a_run_is_kept_as_retained"
RETAIN_ORDER = f"{RUN}::test_a_retained_publish_keeps_its_place_among_the_live_ones"
RUN_REASONS = (f"{RUN}::test_drops_of_a_congested_subscriber_with_a_size_limit_keep_their_"
               "reasons[run]")
CROSS = ("tests/cluster/test_review10_crossings.py::"
         "test_a_pure_python_router_and_a_compiled_one_exchange_the_same_entries")
RUN_CROSS = "tests/cluster/test_run_crossing.py::test_a_run_crosses_the_mesh_whole_and_in_order"
RUN_STALL = f"{RUN}::test_a_stalled_subscriber_of_runs_gets_an_ordered_prefix_then_what_follows"
LRUN = "tests/broker/test_logged_run.py"
SETTLE_TWO = ("tests/broker/test_puback_batches.py::"
              "test_two_publishers_of_one_device_each_get_all_their_acks[run]")
SETTLE_GONE = ("tests/broker/test_review10_puback_runs.py::"
               "test_a_publisher_gone_with_acks_pending_loses_nothing_stored[run]")
SCAN_EQ = ("tests/protocol/test_codec_speedups.py::"
           "test_the_end_of_a_run_is_found_alike_compiled_and_in_python")
SCAN_ODD = ("tests/protocol/test_codec_speedups.py::"
            "test_the_end_of_a_run_of_odd_values_is_found_as_python_finds_it")
SCAN_SAFE = ("tests/protocol/test_codec_speedups.py::"
             "test_the_compiled_run_scan_survives_python_code_that_empties_the_list")
LRUN_ALL = f"{LRUN}::test_a_logged_run_is_answered_delivered_and_stored_as_one_message_at_a_time"
LRUN_V5 = f"{LRUN_ALL}[v5-publisher]"
LRUN_NO_LOCAL = f"{LRUN}::test_no_local_holds_for_a_run_read_back_from_the_log"
LRUN_DEDUPE = (f"{LRUN}::test_a_resend_of_a_run_message_is_answered_from_the_log_not_stored_"
               "twice")
# (root only: it mounts a tmpfs; skipped, so NOT CAUGHT, elsewhere)
LRUN_FULL = f"{LRUN}::test_runs_into_a_full_volume_are_refused_one_by_one_never_acked"
LRUN_GATE = f"{LRUN}::test_a_run_is_refused_by_the_shut_write_gate_as_its_first_publish_is"
LRUN_OWNER = f"{LRUN}::test_a_run_on_a_log_another_node_leads_goes_to_its_leader"


def speed_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("speed-packet0-plain-for-retained", "broker/message.py packet0: the v3.x plain "
          "shape's slot also answers for a retained copy (RETAIN=0 on a retained message sent "
          "on SUBSCRIBE)",
          "broker/message.py",
          "        if not v5 and not retain:\n            data = self._plain0\n",
          "        if not v5:\n            data = self._plain0\n",
          (RETAIN,)),
        m("speed-qos0-no-size-limit", "broker/delivery.py _write_qos0: the client's Maximum "
          "Packet Size not checked for a QoS 0 copy",
          "broker/delivery.py",
          "        limit = session.max_packet_size\n        if limit and len(data) > limit:\n",
          "        limit = session.max_packet_size\n        if False:\n",
          (MPS,)),
        m("speed-qos0-back-to-delivery", "broker/delivery.py deliver: a QoS 0 copy built as a "
          "Delivery and written by _write_publish again (the old per-copy object and "
          "concatenation: the cost guard's qos0 and fanout budgets are exceeded)",
          "broker/delivery.py",
          "            self._write_qos0(session, conn, msg, retain, sub_ids, position)\n",
          "            self._write_publish(session, conn,\n"
          "                                Delivery(msg, 0, retain, sub_ids, None, position))\n",
          (GUARD,)),
        m("speed-run-loses-its-last", "broker/publishrun.py _publish_run: the run routed "
          "without its last message (each run loses one, the dispatch loop steps over it)",
          "broker/publishrun.py",
          "        run = packets[start:end]\n",
          "        run = packets[start:end - 1]\n",
          (RUN_ALL,)),
        m("speed-run-ignores-no-local", "broker/publishrun.py _run_plan: No Local not honoured "
          "(the publisher is written its own run)",
          "broker/publishrun.py",
          "            if sub.no_local and cid == origin:\n",
          "            if False:\n",
          (RUN_ALL,)),
        m("speed-run-drops-sub-ids", "broker/publishrun.py _run_plan: a v5 subscription with an "
          "identifier takes the run's plain shape (its copies lose the identifier)",
          "broker/publishrun.py",
          "            if tconn.out_aliases is not None or (v5 and sub.sub_id):\n",
          "            if tconn.out_aliases is not None:\n",
          (RUN_ID,)),
        m("speed-run-no-size-limit", "broker/publishrun.py _write_run: the subscriber's "
          "Maximum Packet Size not checked for a run",
          "broker/publishrun.py",
          "            if limit and max(map(len, datas)) > limit:\n",
          "            if False:\n",
          (RUN_ALL,)),
        m("speed-run-past-the-bound", "broker/connection.py write_run: the part of a run past "
          "the write buffer bound is counted as dropped but written anyway (memory unbounded, "
          "and drops that were delivered)",
          "broker/connection.py",
          "            datas = datas[:take]\n",
          "            pass\n",
          (RUN_STALL,)),
        m("speed-run-first-unchecked", "broker/publishrun.py _publish_run: the first packet of a "
          "run is not checked for RETAIN or properties (a retained publish is routed as a "
          "plain one and never kept; a property is lost)",
          "broker/publishrun.py",
          "        if first.retain or first.properties is not None:\n",
          "        if False:\n",
          (RUN_KEPT, RUN_ALL)),
        m("speed-run-not-forwarded", "broker/publishrun.py _publish_run: a cluster router's run "
          "is delivered locally but never forwarded to the peers with subscribers",
          "broker/publishrun.py",
          "            forwarder.forward_run(topic, [p.payload for p in run], conn.client_id)\n",
          "            pass\n",
          (CROSS, f"{RUN_CROSS}[runs]")),
        m("speed-peer-run-loses-its-last", "cluster/mesh.py on_deliveries: a peer's run of "
          "plain DELIVERs routed without its last message",
          "cluster/peerentries.py",
          "                if j - i > 1 and self.router.route_run(msgs[i:j]):\n",
          "                if j - i > 1 and self.router.route_run(msgs[i:j - 1]):\n",
          (f"{RUN_CROSS}[runs]",)),
        m("speed-run-ignores-peer-groups", "broker/publishrun.py _run_plan: a run is routed as one "
          "while a peer has shared-group members (their share never picked: the peer's "
          "member gets nothing)",
          "broker/publishrun.py",
          "            if forwarder is not None and not forwarder.plain_runs():\n",
          "            if False:\n",
          (f"{RUN_CROSS}[peer-shared-group]",)),
        m("speed-run-size-before-congestion", "broker/publishrun.py _write_one_by_one: a run's "
          "too-large packet is judged by size before congestion (a drop while congested "
          "counted as too_large: review13)",
          "broker/publishrun.py",
          "            if tconn.congested:\n                slow += 1\n"
          "            elif len(data) > limit:\n                large += 1\n",
          "            if len(data) > limit:\n                large += 1\n"
          "            elif tconn.congested:\n                slow += 1\n",
          (RUN_REASONS,)),
        m("speed-logged-run-loses-its-last", "broker/loggedrun.py _logged_run: the run stored "
          "without its last message (the dispatch loop steps over it: never stored, answered "
          "or delivered)",
          "broker/loggedrun.py",
          "        run = packets[start:end]\n",
          "        run = packets[start:end - 1]\n",
          (LRUN_ALL,)),
        m("speed-logged-run-append-loses-its-last", "broker/devicelogs.py append_run: the run's "
          "last message not appended (counted as held by its publisher, never settled)",
          "broker/devicelogs.py",
          "            for i in range(first, len(msgs)):\n",
          "            for i in range(first, len(msgs) - 1):\n",
          (LRUN_ALL,)),
        m("speed-logged-run-scan-ignores-topic", "broker/protocol/_speedups.c publish_run_end: "
          "the scan of a run does not end it at another topic (a logged run stored and "
          "delivered under its first topic)",
          "broker/protocol/_speedups.c",
          "        if (pt != topic && PyUnicode_Compare(pt, topic) != 0)\n",
          "        if (0)\n",
          (LRUN_ALL, RUN_ALL)),
        m("speed-run-py-scan-ignores-qos", "broker/publishrun.py py_run_end (the reference, "
          "BROKER_PURE_PYTHON=1): a publish of another QoS continues a run",
          "broker/publishrun.py",
          "        if p.__class__ is not Publish or p.qos != qos or p.retain or p.dup \\\n",
          "        if p.__class__ is not Publish or p.retain or p.dup \\\n",
          (SCAN_EQ,)),
        m("speed-logged-run-first-unchecked", "broker/loggedrun.py _logged_run: the first packet "
          "of a run not checked for RETAIN or properties (a retained publish stored as a plain "
          "one, never kept; a user property lost)",
          "broker/loggedrun.py",
          "        if first.retain or first.dup or first.properties is not None:\n",
          "        if first.dup:\n",
          (LRUN_ALL,)),
        m("speed-logged-run-takes-dup", "broker/protocol/_speedups.c publish_run_end: the scan "
          "takes a DUP=1 publish into a run (a resend is not looked up in the log: stored "
          "twice)",
          "broker/protocol/_speedups.c",
          "        if (pp != Py_None || pr == Py_True || pd == Py_True)\n",
          "        if (pp != Py_None || pr == Py_True)\n",
          (LRUN_DEDUPE,)),
        m("speed-run-scan-judges-odd-values", "broker/protocol/_speedups.c publish_run_end: a "
          "slot value parse_run never makes (a bool QoS, an int RETAIN, a str subclass topic) "
          "ends the run instead of going to the Python reference (review2)",
          "broker/protocol/_speedups.c",
          "            Py_RETURN_NONE;  /* (not what parse_run makes: Python judges it) */\n",
          "            break;  /* (not what parse_run makes: Python judges it) */\n",
          (SCAN_ODD,)),
        m("speed-run-scan-runs-python", "broker/protocol/_speedups.c publish_run_end: RETAIN "
          "judged by PyObject_IsTrue on a borrowed packet (a __bool__ that empties the list: "
          "freed packets read, segfault; review2)",
          "broker/protocol/_speedups.c",
          "        if (!PyLong_CheckExact(pq) || (pr != Py_False && pr != Py_True)\n"
          "                || (pd != Py_False && pd != Py_True) || !PyUnicode_CheckExact(pt))\n"
          "            Py_RETURN_NONE;  /* (not what parse_run makes: Python judges it) */\n"
          "        if (pp != Py_None || pr == Py_True || pd == Py_True)\n",
          "        if (!PyLong_CheckExact(pq)\n"
          "                || (pd != Py_False && pd != Py_True) || !PyUnicode_CheckExact(pt))\n"
          "            Py_RETURN_NONE;  /* (not what parse_run makes: Python judges it) */\n"
          "        if (pp != Py_None || PyObject_IsTrue(pr) || pd == Py_True)\n",
          (SCAN_SAFE,)),
        m("speed-logged-run-first-dup", "broker/loggedrun.py _logged_run: a DUP=1 publish starts "
          "a run (a resend is not looked up in the log: stored twice)",
          "broker/loggedrun.py",
          "        if first.retain or first.dup or first.properties is not None:\n",
          "        if first.retain or first.properties is not None:\n",
          (LRUN_DEDUPE,)),
        m("speed-logged-run-no-publisher-id", "broker/loggedrun.py _logged_run: with publisher "
          "dedupe on, a run's records carry no :pub header (its resends are never found: "
          "stored twice)",
          "broker/loggedrun.py",
          "                msg.publisher = publisher_id(session, pid)\n",
          "                pass\n",
          (LRUN_DEDUPE,)),
        m("speed-logged-run-no-origin", "broker/devicelogs.py append_run: no :origin header for "
          "a publisher holding a No Local subscription (fed back from the log, it gets its own "
          "messages)",
          "broker/devicelogs.py",
          "        origin = ((_H_ORIGIN, conn.client_id.encode()),) if conn.session.has_no_local "
          "else ()\n",
          "        origin = ()\n",
          (LRUN_NO_LOCAL,)),
        m("speed-logged-run-counted-twice", "broker/loggedrun.py _logged_run: the run's first "
          "PUBLISH packet counted again (meshmq_packets_received_total off by one a run)",
          "broker/loggedrun.py",
          "        stats.packets_in[_PUBLISH] += n - 1",
          "        stats.packets_in[_PUBLISH] += n",
          (LRUN_V5,)),
        m("speed-logged-run-gate-not-asked", "broker/loggedrun.py _logged_run_plan: the write "
          "gate not asked (a run stored while the leader lease is out, instead of refused)",
          "broker/loggedrun.py",
          "        if gate is not None and (gate() is not None or self.gate_held.items):\n",
          "        if False:\n",
          (LRUN_GATE,)),
        m("speed-logged-run-owner-not-asked", "broker/loggedrun.py _logged_run_plan: the log's "
          "owner not asked (a cluster router appends a run to a log another router leads: a "
          "second log, acknowledged there, never in the leader's)",
          "broker/loggedrun.py",
          "        if forwarder is not None and forwarder.owner_of(key) is not None:\n",
          "        if False:\n",
          (LRUN_OWNER,)),
        m("speed-logged-run-failed-prefix-off-by-one", "broker/loggedrun.py _logged_run_failed: "
          "the stored prefix counted one too long (the message the log refused is taken as "
          "stored: never answered, its publisher's later packets held for ever; the next one "
          "refused in its place)",
          "broker/loggedrun.py",
          "        stored = 0\n",
          "        stored = 1\n",
          (LRUN_FULL,)),
        m("speed-logged-run-closed-rest-counted", "broker/loggedrun.py _logged_run_failed: the "
          "rest of a run after its 3.x publisher was closed stays counted as received (never "
          "read, packet by packet)",
          "broker/loggedrun.py",
          "        if left:  # never read, packet by packet: uncounted\n",
          "        if False:\n",
          (LRUN_FULL,)),
        m("retain-order-overtaken", "broker/router.py _handle_packets: what a client publishes "
          "after a retained publish on an unlogged topic is not held behind it (routed at "
          "once, ahead of the retained one still waiting for the disk)",
          "broker/router.py",
          "                    if conn.unsettled:\n"
          "                        packets_in[ptype] -= 1\n",
          "                    if False:\n"
          "                        packets_in[ptype] -= 1\n",
          (RETAIN_ORDER,)),
        m("speed-logged-deliver-position-not-moved", "broker/loggedrun.py _deliver_run: the "
          "part of a run sent in one write does not move the session's position in the device "
          "log (a restart reads what it acked again)",
          "broker/loggedrun.py",
          "                    positions[msgs[0].device] = msgs[take - 1].offset + 1\n",
          "                    pass\n",
          (LR_RESUME,)),
        m("speed-logged-deliver-window-unbounded", "broker/loggedrun.py _deliver_run: the "
          "part sent in one write is the whole run, not what the window has room for "
          "(max_inflight overrun)",
          "broker/loggedrun.py",
          "                take = session.window - len(session.inflight)\n",
          "                take = len(msgs)\n",
          (LR_SLOW,)),
        m("speed-logged-deliver-lag-unchecked", "broker/loggedrun.py _deliver_run: a session "
          "behind on the device is not left to its cursor: a run goes to its window's room "
          "ahead of the older records its cursor has not read yet",
          "broker/loggedrun.py",
          "        elif lag:\n",
          "        elif False:\n",
          (LR_ROOM,)),
        m("speed-logged-deliver-pid-collision", "broker/loggedrun.py _send_run: packet ids "
          "allocated without stepping over the ids still in flight (after the 65535 -> 1 wrap "
          "two messages in flight share an id, and one of them is lost from the window)",
          "broker/loggedrun.py",
          "            while pid in inflight:  # (Session.allocate_pid, inline: the window has "
          "room)\n",
          "            while False:\n",
          (LR_WRAP,)),
        m("speed-logged-deliver-read-loses-last-run", "broker/catchup.py pump: the last run of "
          "plain records collected from a chunk is never handed to the window (its cursor "
          "moved past them: lost)",
          "broker/catchup.py",
          "                if run:\n"
          "                    deliver_run(session, conn, run, run_plan[3])\n"
          "            if not session.lag_behind:\n",
          "            if not session.lag_behind:\n",
          (LR_SLOW,)),
        m("speed-logged-deliver-read-takes-headers", "broker/catchup.py pump: a record with "
          "headers (properties, expiry, origin) is taken into a read-back run as a plain "
          "message (a v5 subscriber loses its user properties)",
          "broker/catchup.py",
          "elif room and rec.attrs == 1 and not rec.headers and plan[1] \\\n",
          "elif room and rec.attrs == 1 and plan[1] \\\n",
          (LR_HEADERS,)),
        m("speed-logged-deliver-rest-dropped", "broker/loggedrun.py _deliver_run: the part of "
          "a run past the one-write part stops after its first message whether or not the "
          "session fell behind (the rest is neither queued nor left to a cursor: lost)",
          "broker/loggedrun.py",
          "            deliver(session, msgs[i], granted, False, sub_ids, None, False, True)\n"
          "            if session.lag_behind:\n",
          "            deliver(session, msgs[i], granted, False, sub_ids, None, False, True)\n"
          "            return\n"
          "            if session.lag_behind:\n",
          (LR_SLOW, LR_MIXED)),
        m("speed-logged-deliver-acl-unchecked", "broker/loggedrun.py _deliver_run: with an "
          "ACL the run's one-write part is taken too (no read check per message: a denied "
          "topic delivered through a wildcard subscription)",
          "broker/loggedrun.py",
          "        if self._acl is not None:\n",
          "        if False:\n",
          (LR_ACL,)),
        m("speed-logged-deliver-groups-ignored", "broker/loggedrun.py _route_run: a run whose "
          "topic a shared group matches is routed as one (the group's members never get "
          "their shares)",
          "broker/loggedrun.py",
          "        if self.forwarder is not None or match.groups:\n",
          "        if self.forwarder is not None:\n",
          (LR_SHARED,)),
        m("speed-logged-deliver-replay-ignored", "broker/loggedrun.py _route_run: a session "
          "whose one subscription reads the log from an offset is handed the run live "
          "(``accept_live`` not asked: what its replay cursor reads too comes twice)",
          "broker/loggedrun.py",
          "            cid, sub = subs[0]\n            if sub.replay is not None:\n",
          "            cid, sub = subs[0]\n            if False:\n",
          (LR_REPLAY,)),
        # the run path's twins of qos1-pubacks-run-switch-drops and
        # review10-gone-publisher-unrouted (those guard the per-message settle)
        m("speed-settle-run-switch-drops", "broker/loggedrun.py _settle_run: a publisher's "
          "stretch of a durable run is acked only when it is the batch's last (the acks of a "
          "publisher followed by another in the batch are dropped)",
          "broker/loggedrun.py",
          "            if not conn.closing and conn.session is not None:\n"
          "                self.send_pubacks(conn, [entry[1] for entry in stretch])\n",
          "            if end == n and not conn.closing and conn.session is not None:\n"
          "                self.send_pubacks(conn, [entry[1] for entry in stretch])\n",
          (SETTLE_TWO,)),
        m("speed-settle-run-gone-publisher-unrouted", "broker/loggedrun.py _settle_run: a "
          "durable run whose publisher has gone is not routed (stored, lost to subscribers)",
          "broker/loggedrun.py",
          "                self._route_run([entry[2] for entry in stretch])\n",
          "                if not conn.closing:\n"
          "                    self._route_run([entry[2] for entry in stretch])\n",
          (SETTLE_GONE,)),
        # broker/protocol/connection.py receive_data: a batch without a packet to check passes
        # in one C pass (issue 25, qos0 76 -> 58 instructions a message)
        m("speed-receive-batch-unchecked", "broker/protocol/connection.py receive_data: every "
          "batch passes unchecked (a second CONNECT, a server-only packet, DISCONNECT's "
          "truncation and v5 topic aliases all skipped)",
          "broker/protocol/connection.py",
          "            if kinds.isdisjoint(_CHECKED) and (level != 5 or Publish not in kinds):\n",
          "            if True:\n",
          ("tests/protocol/test_protocol_connection.py::"
           "test_a_batch_of_plain_packets_is_checked_like_one_packet",)),
        m("speed-receive-batch-v5-aliases", "broker/protocol/connection.py receive_data: a v5 "
          "batch of publishes passes without its properties resolved (a topic alias unset)",
          "broker/protocol/connection.py",
          "            if kinds.isdisjoint(_CHECKED) and (level != 5 or Publish not in kinds):\n",
          "            if kinds.isdisjoint(_CHECKED):\n",
          ("tests/protocol/test_protocol_connection.py::"
           "test_a_batch_of_plain_packets_is_checked_like_one_packet",)),
    )
