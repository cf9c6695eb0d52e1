"""Planted bugs for issue 28's will hand-over, retained-clear and MQTT 5 details (the
``mqttfix`` work), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py
mqttfix-``). Each new test is named by at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

D5 = "tests/broker/test_mqtt5_details.py"
WH = "tests/cluster/test_will_handover.py"
WH_DUE = f"{WH}::test_due_will_is_published_and_early_one_cancelled_at_a_cross_node_handover"
WH_CLEAN = f"{WH}::test_clean_start_at_another_node_publishes_the_pending_will"
FW = "broker/forwarding.py"
WR = ("tests/broker/test_will_resume.py::"
      "test_due_will_published_when_its_client_reconnects_before_the_sweep")
RA = "tests/broker/test_retained_ack.py"
SH = "tests/broker/test_shared.py::test_shared_subscription_gets_no_retained_messages"


def mqttfix_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("mqttfix-sub-id-twice", "broker/delivery.py merge: overlapping subscriptions of one "
          "session "
          "send an identifier they share once per subscription ([2333, 2333])",
          "broker/delivery.py",
          "            if sub.sub_id not in entry[2]:  # each identifier once "
          "[MQTT-3.3.4-3]\n                entry[2].append(sub.sub_id)\n",
          "            entry[2].append(sub.sub_id)\n",
          (f"{D5}::test_overlapping_subscriptions_with_one_identifier_send_it_once",)),
        m("mqttfix-protocol-error-no-drain", "router.protocol_error: DISCONNECT then an "
          "immediate close, so a client still writing gets a TCP reset",
          "broker/router.py",
          "        conn.close(err.reason_code, drain=True)",
          "        conn.close(err.reason_code, drain=False)",
          (f"{D5}::test_receive_maximum_violation_disconnect_is_not_followed_by_a_reset",)),
        m("mqttfix-handover-drops-due-will", "RemoteSessions.release_session: a delayed will "
          "due at the hand-over (not swept yet) is dropped with the moved session",
          FW, "            if (due := session.resume_will(time.monotonic())) is not None:\n"
          "                router.publish_will(due)\n",
          "            session.resume_will(time.monotonic())\n", (WH_DUE,)),
        m("mqttfix-handover-publishes-early-will", "RemoteSessions.release_session: a "
          "delayed will not yet due is published at the hand-over instead of cancelled",
          FW, "            if (due := session.resume_will(time.monotonic())) is not None:\n",
          "            if (due := session.will) is not None:\n", (WH_DUE,)),
        m("mqttfix-handover-clean-drops-will", "RemoteSessions.release_session: a clean start "
          "at another router discards the pending will instead of ending the session with it",
          FW, "        log.info(\"session %s to router %s\", what, to, "
          "extra={\"client_id\": client_id})\n        router.end_session(session)\n",
          "        log.info(\"session %s to router %s\", what, to, "
          "extra={\"client_id\": client_id})\n        session.will = None\n"
          "        router.end_session(session)\n", (WH_CLEAN,)),
        m("mqttfix-resume-cancels-due-will", "Session.resume_will: a will already due when "
          "its client comes back is cancelled like one not yet due (same node and hand-over)",
          "broker/session.py",
          "        if will is not None and due is not None and due <= now:\n",
          "        if False:\n", (WR, WH_DUE)),
        m("mqttfix-sys-retained-held", "DeviceLogs.key_for: a retained publish on a $SYS/ "
          "topic (never written to #retained) is held for a group commit with nothing to "
          "flush: its PUBACK waits for an unrelated flush", "broker/devicelogs.py",
          "        if key is None and retain and self.retain_log is not None \\\n"
          "                and self.retain_log.keeps(topic):\n",
          "        if key is None and retain and self.retain_log is not None:\n", (RA,)),
        # Issue 28 (a), "a retained message is sent for a new shared subscription", did not
        # reproduce (single node and a 3-node cluster, every publisher/subscriber node pair,
        # exact and wildcard shared filters, v5 and 3.1.1): the gate below exists. This keeps
        # the existing guard test honest.
        m("mqttfix-shared-gets-retained", "router._on_subscribe: retained messages sent for "
          "a new shared subscription too (v5 4.8.2: only for non-shared ones)",
          "broker/handle_subscribe.py", "            if group is None and (opts.retain_handling "
          "== 0\n",
          "            if (opts.retain_handling == 0\n", (SH,)),
    )
