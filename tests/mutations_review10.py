"""Planted bugs for review10's attacks on issue 25's cheaper hot paths (the mesh's forward
cache and plain-DELIVER runs; the durable QoS 1 path's PUBACK runs under a failing fsync), run
by ``tests/mutate.py review10-``."""

from __future__ import annotations

from typing import Any

X = "tests/cluster/test_review10_crossings.py"
FWD = X + "::test_the_forward_cache_follows_a_peer_subscribing_and_unsubscribing"
MIXED = X + "::test_interleaved_qos0_and_qos1_runs_survive_a_flap"
FULL = X + "::test_a_full_link_drops_and_counts_each_entry_of_its_runs"
FIT = X + "::test_a_run_that_fits_only_without_its_entries_overhead_goes_entry_by_entry"
PURE = X + "::test_a_pure_python_router_and_a_compiled_one_exchange_the_same_entries"
P = "tests/broker/test_review10_puback_runs.py"
GONE = P + "::test_a_publisher_gone_with_acks_pending_loses_nothing_stored[two-topics]"
FSYNC = P + "::test_fsync_failing_mid_burst_acks_only_what_is_stored"


def review10_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("review10-forward-cache-kept", "cluster/routes.py: a route change empties only the "
          "table's own peers cache, not the mesh's topic -> links cache (a topic cached as "
          "'no link' stays so after a peer subscribes)", "cluster/routes.py",
          "        for cache in self._caches:\n", "        for cache in self._caches[:1]:\n",
          (FWD,)),
        m("review10-run-mixes-qos", "cluster/link.py deliver: a plain DELIVER of another QoS "
          "joins the open run (a QoS 1 entry in a QoS 0 run is dropped with it at a reconnect)",
          "cluster/linkqueue.py",
          "        if (run is None or run.qos != qos or run.size >= MAX_RUN_BYTES"
          "\n                or run.seq + run.count != self.next_seq):  # (never: a guard for "
          "the seqs)\n            run = self._open = Run(self.next_seq, qos)\n"
          "            self.unsent.append(run)\n        run.items += (head, body, epoch)\n",
          "        if (run is None or run.size >= MAX_RUN_BYTES"
          "\n                or run.seq + run.count != self.next_seq):  # (never: a guard for "
          "the seqs)\n            run = self._open = Run(self.next_seq, qos)\n"
          "            self.unsent.append(run)\n        run.items += (head, body, epoch)\n",
          (MIXED,)),
        m("review10-pure-run-one-seq", "cluster/sendrun.py encode_run (the Python reference, "
          "CLUSTER_PURE_PYTHON=1): every entry of a run written with the run's first seq",
          "cluster/sendrun.py", "        parts.append(items[i + 1])\n        seq += 1\n",
          "        parts.append(items[i + 1])\n", (PURE,)),
        m("review10-link-bound-without-overhead", "cluster/link.py deliver: the queue bound "
          "compared with the body alone while the entry counts body + 64 (main before review10: "
          "the queue ends up to 64 bytes past link_max_queued_bytes)", "cluster/linkqueue.py",
          "        if self.queued_bytes + size > self._max_bytes:\n            if self._dropping "
          "and self.stats",
          "        if self.queued_bytes + len(body) > self._max_bytes:\n            if "
          "self._dropping and self.stats", (FULL,)),
        m("review10-run-bound-without-overhead", "cluster/link.py deliver_run: a run's fit "
          "under the queue bound judged on its bodies alone while its entries count body + 64 "
          "each (the queue ends up past link_max_queued_bytes)", "cluster/linkqueue.py",
          "        if self.queued_bytes + size > self._max_bytes:\n            if self._dropping "
          "and self.queued_bytes",
          "        if self.queued_bytes + body_bytes > self._max_bytes:\n            if "
          "self._dropping and self.queued_bytes", (FIT,)),
        m("link-full-spell-uncounted", "cluster/link.py deliver: the drops of a full spell "
          "after its first are not counted (meshmq_link_dropped_total short of what was lost)",
          "cluster/linkqueue.py",
          "            if self._dropping and self.stats[\"dropped_full\"] & 1023:\n"
          "                self.stats[\"dropped_full\"] += 1\n",
          "            if self._dropping and self.stats[\"dropped_full\"] & 1023:\n"
          "                pass\n", (FULL,)),
        m("link-full-run-uncounted", "cluster/link.py deliver_run: a run dropped whole by a "
          "full link counts one drop, not each of its entries",
          "cluster/linkqueue.py",
          "                stats[\"dropped_full\"] = end\n",
          "                stats[\"dropped_full\"] = count + 1\n", (FULL,)),
        m("review10-gone-publisher-unrouted", "broker/ingest.py _on_durable: a stored "
          "publish whose publisher has gone is not routed (stored, lost to subscribers)",
          "broker/ingest.py", "                self.route(msg)\n                if msg.qos and",
          "                if not conn or not conn.closing:\n                    self.route(msg)"
          "\n                if msg.qos and", (GONE,)),
        m("review10-failed-qos1-acked", "broker/ingest.py _on_durable: a QoS 1 publish whose "
          "write or fsync failed is routed and acknowledged in the PUBACK run like a stored "
          "one", "broker/ingest.py", "                if exc is not None:\n",
          "                if exc is not None and msg.qos != 1:\n", (FSYNC,)),
    )
