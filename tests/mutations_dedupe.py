"""Planted bugs for publisher dedupe (issue 24, ``broker/pubdedupe.py``), run by
``tests/mutate.py dedupe-``. Each test of ``tests/broker/test_publish_dedupe.py`` and
``tests/cluster/test_publish_dedupe_cluster.py`` is named by at least one mutation it catches.
"""

from __future__ import annotations

from typing import Any

ONE = "tests/broker/test_publish_dedupe.py"
RESTART = ONE + "::test_resend_after_lost_connection_and_restart_is_stored_once"
OTHER = ONE + "::test_another_clients_resend_with_the_same_packet_id_is_stored"
MSGID = ONE + "::test_message_id_property_dedupes_across_client_ids"
DEFAULT = ONE + "::test_a_single_node_keeps_no_publisher_header_by_default"
CLEAN = ONE + "::test_a_new_clean_session_is_another_publisher"
WINDOWS = ONE + "::test_a_copy_outside_the_windows_is_stored_again"
HELD = ONE + "::test_a_resend_of_a_copy_not_yet_committed_waits_for_it"
MESH = ("tests/cluster/test_publish_dedupe_cluster.py::"
        "test_a_resend_at_another_node_after_the_publishers_node_died_is_stored_once")
PD = "broker/pubdedupe.py"
CFG = "tests/meshmq/test_config.py::test_env_errors_name_key_value_and_source"


def dedupe_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("dedupe-off", "publisher dedupe: a resend is never looked up (stored twice)",
          PD, "        if pub is None and mid is None:\n", "        if True:\n",
          (RESTART, MSGID, MESH)),
        m("dedupe-any-publisher", "publisher dedupe: matched by packet id, ignoring which "
          "client published it", PD, '    return pub[:8]\n', '    return b""\n', (OTHER,)),
        m("dedupe-any-payload", "publisher dedupe: the latest record with the packet id "
          "matches whatever its topic and payload (a reused id's new message lost)",
          PD, "        if rec.topic != msg.topic or bytes(rec.payload) != msg.payload:\n",
          "        if False:\n", (RESTART,)),
        m("dedupe-peer-path", "publisher dedupe: a peer's APPEND is never looked up",
          "broker/forwarding.py", "        if msg.maybe_stored and logs.dedupe is not None:\n",
          "        if False:\n", (MESH,)),
        m("dedupe-wire", "publisher dedupe: an APPEND's publisher identity is not read",
          "cluster/peerentries.py", "            if e.group is not None:  # the client's identity",
          "            if False:  # the client's identity", (MESH,)),
        m("dedupe-uncommitted-scan", "publisher dedupe: the scan stops at the high-water "
          "mark (a first copy not yet committed is missed)", "commitlog/store.py",
          "        return self._read(dev, offset, dev.durable_end, max_records, max_bytes)\n"
          "\n    def read_replica",
          "        return self._read(dev, offset, dev.high_watermark, max_records, max_bytes)\n"
          "\n    def read_replica", (HELD,)),
        m("dedupe-ack-uncommitted", "publisher dedupe: a resend found in the log is acked at "
          "once, before its copy is committed", PD,
          "        self.committer.when_high_watermark(device, offset, callback)\n",
          "        callback(None)\n", (HELD,)),
        m("dedupe-any-epoch", "publisher dedupe: the session epoch is ignored (a new clean "
          "session's message matched against the previous session's record)", PD,
          "                if rest[:4] == epoch or _UNKNOWN in (epoch, rest[:4]):\n",
          "                if True:\n", (CLEAN,)),
        m("dedupe-no-inflight-window", "publisher dedupe: a client's packet id matched "
          "however many of its records came after (ids are reused once acknowledged)", PD,
          "mine = by_client[client] = deque(maxlen=in_flight)",
          "mine = by_client[client] = deque()",
          (WINDOWS,)),
        m("dedupe-no-window", "publisher dedupe: the whole log is read, mqtt.dedupe_window "
          "ignored", PD, "        low = max(start, end - self.window)\n",
          "        low = start\n", (WINDOWS,)),
        m("dedupe-cfg-window-zero", "config: mqtt.dedupe_window = 0 accepted (every lookup "
          "reads nothing)", "meshmq/config.py", '"dedupe_window": _Int(1, 1 << 24)',
          '"dedupe_window": _Int(0, 1 << 24)',
          (f"{CFG}[MESHMQ_MQTT__DEDUPE_WINDOW-0-mqtt.dedupe_window-an integer between 1 and "
           "16777216]",)),
        m("dedupe-single-node-default", "publisher dedupe on a single node by default (its "
          "header's cost on the single node's hot path)", "broker/settings.py",
          "    publisher_dedupe: DedupeMode = DedupeMode.CLUSTER\n",
          "    publisher_dedupe: DedupeMode = DedupeMode.ON\n", (DEFAULT,)),
    )
