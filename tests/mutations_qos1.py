"""Planted bugs for the durable QoS 1 publish path made cheaper by issue 25 (the fsync worker,
the coalesced acks, the shortened append path), run by ``tests/mutate.py`` like every other
guard (``tests/mutate.py qos1-``). Each names the tests that must catch it: the promise is that
a PUBACK means committed, so every shortcut here is checked against an ack for what was not
stored, a lost or reordered ack, and a failed write reported as a success.
"""

from __future__ import annotations

from typing import Any

DF = "tests/commitlog/test_commitlog_disk_full.py"
PB = "tests/broker/test_puback_batches.py"
PB_ORDER = PB + "::test_pipelined_acks_one_per_publish_in_order"
PB_TWO = PB + "::test_two_publishers_of_one_device_each_get_all_their_acks[two-topics]"
RET = "tests/broker/test_retained.py"
REPLAY = "tests/broker/test_devicelog_replay.py::test_puback_offsets_and_earliest_replay_then_live"


def qos1_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("qos1-syncworker-error-lost", "the fsync worker hands a failed job back as a success "
          "with no result (a failed fsync is no longer a failure)",
          "commitlog/syncworker.py", "                self._hand_back(loop, done, None, exc)\n",
          "                self._hand_back(loop, done, None, None)\n",
          (f"{DF}::test_fsync_failure_is_not_retried_into_success",)),
        m("qos1-pubacks-last-run-lost", "a durable batch's last run of PUBACKs is never "
          "written", "broker/ingest.py",
          "        if run:\n            self.send_pubacks(run_conn, run)\n"
          "        self.after_settle(settled)",
          "        self.after_settle(settled)", (PB_ORDER,)),
        m("qos1-pubacks-byte-order", "the coalesced PUBACKs carry their packet ids byte-swapped",
          "broker/pubacks.py", "    if _SWAP:\n", "    if not _SWAP:\n", (PB_ORDER,)),
        m("qos1-pubacks-run-switch-drops", "the run of one publisher's PUBACKs is dropped when "
          "another publisher's message of the same batch comes", "broker/ingest.py",
          "                            if run:\n                                "
          "self.send_pubacks(run_conn, run)\n                                run = []\n",
          "                            if run:\n                                run = []\n",
          (PB_TWO,)),
        m("qos1-pubacks-pubrec-overtakes", "a PUBREC (or an ack with properties) is written "
          "before the PUBACKs of the same publisher's earlier messages",
          "broker/ingest.py", "                    if run:  # what this publisher was owed",
          "                    if False:  # what this publisher was owed", (PB_ORDER,)),
        m("qos1-append-flush-never-scheduled", "broker/devicelogs.py append: the store's append "
          "taken directly even when this tick's flush is not scheduled yet (nothing written, "
          "nothing acknowledged)", "broker/devicelogs.py",
          "            if committer.flush_scheduled and committer.failure is None:\n",
          "            if committer.failure is None:\n", (PB_ORDER,)),
        m("qos1-key-cache-miss-unlogged", "broker/devicelogs.py key_for: a topic not in the "
          "rules' cache yet is taken as unlogged (never resolved: nothing is logged)",
          "broker/devicelogs.py",
          "        if key is _UNCACHED:\n            key = self.rules.key_for(topic)\n",
          "        if key is _UNCACHED:\n            key = None\n", (REPLAY,)),
        m("qos1-parts-v3-retain-lost", "broker/delivery.py _write_publish: a v3.x QoS 1/2 copy "
          "encoded by the compiled encoder directly loses its RETAIN flag (planted in "
          "Message.parts until 2ae833d wrote these copies whole, from _write_publish)",
          "broker/delivery.py", "0x30 | (qos << 1) | (1 if d.retain else 0), d.pid)",
          "0x30 | (qos << 1), d.pid)", (RET,)),
        m("qos1-parts-v3-qos-bits", "broker/message.py parts: a v3.x QoS 1/2 copy encoded by "
          "the compiled encoder directly goes out with the QoS bits of QoS 0",
          "broker/message.py", "0x30 | (qos << 1) | (1 if retain else 0),",
          "0x30 | (1 if retain else 0),", ("tests/broker/test_publish_qos.py",)),
        m("qos1-puback-inline-keeps-flow", "broker/router.py: a subscriber's PUBACK frees the "
          "window but its flow stays in flight (the window fills up and delivery stops)",
          "broker/router.py", "                        del inflight[packet.packet_id]\n", "",
          ("tests/broker/test_publish_qos.py::test_qos1_order_preserved",)),
        m("qos1-puback-ends-qos2-flow", "broker/router.py: a PUBACK ends a QoS 2 flow too",
          "broker/router.py",
          "                    if delivery is not None and delivery.qos == 1:\n",
          "                    if delivery is not None:\n",
          (PB + "::test_a_puback_for_a_qos2_delivery_does_not_end_it",)),
    )
