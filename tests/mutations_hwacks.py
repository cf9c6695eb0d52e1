"""Planted bugs for acks and routing driven by the high-water mark (issue 26, "Ack when the
high-water mark passes"), run by ``tests/mutate.py`` like every other guard
(``tests/mutate.py hwacks-``).

On one node the high-water mark is the durable end, so "acked at the fsync" and "acked when the
mark passes" are the same instant and only a test that holds the mark back can tell them apart
(``tests/broker/test_hwm_acks.py`` with the test-only failpoint in ``meshmq/hwmhold.py``; across
the mesh, the owner's answer to an APPEND: ``tests/cluster/test_hwm_results.py``).
"""

from __future__ import annotations

from typing import Any

HWM = ("tests/broker/test_hwm_acks.py::test_ack_and_delivery_wait_for_the_high_watermark",
       "tests/cluster/test_hwm_results.py::"
       "test_owner_answers_and_routes_an_append_only_past_the_high_watermark")


SETTLE = ("tests/broker/test_devicelogs_settle.py::"
          "test_a_held_device_settles_alone_and_keeps_the_batch_unrouted")
WRITE_FAILURE = ("tests/broker/test_log_write_failure.py::"
                 "test_failed_fsync_is_refused_and_a_restart_recovers")
DISK_FULL = "tests/broker/test_disk_full.py::test_full_tmpfs_acks_only_what_is_stored"


def hwacks_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("hwacks-ack-at-fsync", "broker/devicelogs.py _seal: a device's publishes are routed "
          "and acknowledged when their write is durable here, not when the device's high-water "
          "mark passes them (replication would ack what a leader change can take back)",
          "broker/devicelogs.py",
          "                committer.when_high_watermark(key, group[-1][2].offset, passed)\n",
          "                committer.when_durable(passed)\n", HWM),
        m("hwacks-failed-device-acked", "broker/devicelogs.py _passed: a device whose records "
          "were not stored (failed write or fsync: the store fails its waiters) is settled as "
          "stored: PUBACK 0 for what the log refused",
          "broker/devicelogs.py",
          "            self._loop.call_soon(self._on_durable, group, exc)\n",
          "            self._loop.call_soon(self._on_durable, group, None)\n",
          (WRITE_FAILURE, DISK_FULL)),
        m("hwacks-checkpoint-forgets-held-batch", "broker/devicelogs.py _passed: a sealed "
          "batch is dropped from the unrouted ones when its first device settles, though another "
          "device of it waits for its high-water mark (a session checkpoint then claims records "
          "not yet routed)",
          "broker/devicelogs.py",
          "        while queue and not queue[0].left:\n            queue.popleft()\n",
          "        if queue:\n            queue.popleft()\n", (SETTLE,)),
        m("hwacks-stall-refuses-watches", "commitlog/store.py fail_high_watermark_waiters: a "
          "stuck mark's refusal fails the Watch waiters too (a refused record waiting to be "
          "routed once committed, a fetch long poll), each counted as a refused ack at every "
          "check for as long as the mark stays stuck", "commitlog/store.py",
          "        gone = self._waiters.take_acks_after(key, dev.high_watermark)\n",
          "        gone = self._waiters.take_between(key, dev.high_watermark, 1 << 62)\n",
          ("tests/commitlog/test_commitlog_replication_hooks.py",
           "tests/cluster/test_replication.py::test_without_min_insync_replicas_a_publish_is_"
           "refused_never_acked")),
    )
