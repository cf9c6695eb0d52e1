"""Planted bugs for issue 25's cheap mesh crossings (``tests/mutate.py crossing-``): each one is
caught by the cost guard's ``crossing`` workload (bench/costguard.py: two routers of one node,
a real mesh link, every message crossing it) or by the crossing tests next to what changed
(the compiled entry codec against the Python one, ``fresh_of`` against ``fresh``, the mesh's
shared subscriptions, the cluster bench's cost per crossing)."""

from __future__ import annotations

from typing import Any

GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"
PURE = ("tests/bench/test_cost_guard.py::"
        "test_a_crossing_on_the_pure_python_entry_codec_delivers_every_message")
SPEED = "tests/cluster/test_frames_speedups.py"
FRESH = "tests/cluster/test_crossing_unit.py::test_fresh_of_a_frame_is_fresh_of_each_entry"
SHARED = ("tests/cluster/test_mesh_routing.py::"
          "test_shared_subscription_members_on_every_node_split_the_messages")
BENCH = ("tests/bench/test_cluster_bench.py::"
         "test_crossing_cost_is_the_extra_cpu_per_crossed_message")


def crossing_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("crossing-link-enqueue-scan", "cluster/link.py deliver_run: every plain DELIVER's "
          "topic scanned byte by byte in Python (a per-character check, ~20 calls more per "
          "crossing: the guard's crossing workload over its budget)",
          "cluster/linkqueue.py",
          "        run.items += items\n",
          "        for k in range(1, len(items), 3):\n"
          "            if any(c == 0 for c in items[k][:items[k - 1][1]]):\n"
          "                return\n"
          "        run.items += items\n",
          (GUARD,)),
        m("crossing-c-epoch-mode", "cluster/frames.py: the compiled decoder told version 3's "
          "epoch rule on a version-4 link (a DELIVER's epoch read as its topic)",
          "cluster/frames.py",
          "c_decode_run(body, p, count, 2 if all_epochs else 1 if epochs else 0, out)",
          "c_decode_run(body, p, count, 1 if all_epochs or epochs else 0, out)",
          (f"{SPEED}::test_compiled_decoding_gives_the_python_entries",)),
        m("crossing-python-decode-one-short", "cluster/frames.py: the Python entry loop decodes "
          "one entry fewer than the frame holds after the compiled run (the pure-Python build "
          "refuses every frame as trailing bytes)",
          "cluster/frames.py",
          "    for _ in range(count - len(out)):\n",
          "    for _ in range(count - len(out) - 1 if c_decode_run is None else 0):\n",
          (f"{SPEED}::test_compiled_decoding_gives_the_python_entries", PURE)),
        m("crossing-fresh-of-resend", "cluster/inbound.py fresh_of: an entry at the last "
          "processed seq (a resend after a reconnect) taken as fresh on the one-call path",
          "cluster/inbound.py",
          "            if seq <= received:\n                break\n",
          "            if seq < received:\n                break\n", (FRESH,)),
        m("crossing-flush-wanted-stuck", "cluster/mesh.py _flush: a flushed link stays marked "
          "as wanting a flush, so its later entries are never written",
          "cluster/mesh.py",
          "            link.flush_wanted = False  # as wanting a flush that is no longer "
          "scheduled\n",
          "            pass\n", (GUARD,)),
        m("crossing-has-groups-stale", "cluster/routes.py add: a peer's shared group not seen "
          "by has_groups (its members never get a share)",
          "cluster/routes.py",
          "        self._groups += group is not None\n        self.has_groups = self._groups > 0\n",
          "        self._groups += group is not None\n", (SHARED,)),
        m("crossing-bench-share", "bench/cluster.py crossing_costs: the 2 routers' extra CPU "
          "not divided by the share of messages that crossed",
          "bench/cluster.py",
          "        out.append(((r2 - r1) / share, ",
          "        out.append(((r2 - r1), ", (BENCH,)),
    )
