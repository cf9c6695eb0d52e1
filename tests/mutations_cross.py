"""Planted bugs for issue 25's cheaper mesh crossings, second round (``tests/mutate.py
cross-``): the receiving router's plain DELIVERs decoded straight to messages
(``frames.c_decode_plain``, ``MeshLink._on_entries_frame``) and the sending router's plain
DELIVERs queued per batch (``cluster/sendrun.py``). Each is caught by the tests next to what
changed: the compiled decoder against the Python reference, the mesh's version tests, the
link's fault tests, the cost guard."""

from __future__ import annotations

from typing import Any

PLAIN = "tests/cluster/test_cross_plain.py"
PLAIN_DECODE = f"{PLAIN}::test_plain_deliveries_decode_to_the_messages_python_builds"
PLAIN_SLOTS = f"{PLAIN}::test_a_plain_delivery_is_a_message_like_any_other"
GUARD = "tests/bench/test_cost_guard.py::test_hot_paths_within_their_cost_budget"
RUN = "tests/cluster/test_cross_run.py"
FWD = ("tests/cluster/test_cross_forward.py::"
       "test_a_route_change_reaches_a_topic_already_forwarded_or_not")
RUN_C = f"{RUN}::test_compiled_run_encoding_gives_the_python_bytes"
RUN_SPLIT = f"{RUN}::test_a_run_reads_back_as_its_entries_and_splits_without_loss"
RUN_WINDOW = f"{RUN}::test_the_window_bounds_runs_and_a_flap_resends_them_once"
RUN_ITEMS = f"{RUN}::test_a_publishers_run_becomes_the_items_of_one_entry_each"
RUN_END = f"{RUN}::test_the_end_of_a_peers_run_is_found_alike_compiled_and_in_python"
RUN_CROSS = "tests/cluster/test_run_crossing.py::test_a_run_crosses_the_mesh_whole_and_in_order"
FULL = ("tests/cluster/test_review10_crossings.py::"
        "test_a_full_link_drops_and_counts_each_entry_of_its_runs")


def cross_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("cross-plain-epochs-mode", "cluster/frames.py epochs_mode: a version-3 link read as "
          "version 4 (every plain DELIVER's topic read 4 bytes late)",
          "cluster/frames.py",
          "    return 2 if version >= V_DELIVER_EPOCHS else 1 if version >= V_EPOCHS else 0\n",
          "    return 2 if version >= V_EPOCHS else 0\n", (PLAIN_DECODE,)),
        m("cross-plain-template", "cluster/frames.py: decode_plain's template message made "
          "with properties {} (every plain DELIVER reaches subscribers unlike a local one)",
          "cluster/frames.py",
          '    _speedups.setup_message(Message, Message("", b"", 0, False, None, None, None))\n',
          '    _speedups.setup_message(Message, Message("", b"", 0, False, {}, None, None))\n',
          (PLAIN_SLOTS,)),
        m("cross-plain-not-processed", "cluster/link.py _on_entries_frame: the plain DELIVERs "
          "taken are not recorded as processed (no ACK for them: the window fills and the link "
          "stalls; a resend is delivered again)",
          "cluster/link.py",
          "        pos, inbound.received = frames.c_decode_plain(\n",
          "        pos, _ = frames.c_decode_plain(\n", (GUARD,)),
        m("cross-run-window-ignored", "cluster/link.py flush: a run goes whole whatever room "
          "the window has (more than link_window entries unacknowledged)",
          "cluster/link.py",
          "            if out.count > room:  # a run larger than the window's room",
          "            if out.count > room and False:  # a run larger than the window's room",
          (RUN_WINDOW,)),
        m("cross-run-take-overlap", "cluster/sendrun.py take: the part left after a split "
          "starts one seq early (an entry sent twice, one never)",
          "cluster/sendrun.py",
          "        self.seq += n\n",
          "        self.seq += n - 1\n", (RUN_SPLIT,)),
        m("cross-run-python-epoch", "cluster/sendrun.py encode_run: the reference writes no "
          "epoch (a version-4 peer misreads every entry after the first)",
          "cluster/sendrun.py",
          "        if with_epoch:\n            parts.append(",
          "        if False:\n            parts.append(", (RUN_C,)),
        m("cross-run-unacked-not-reset", "cluster/link.py established: the window's count "
          "of unacknowledged entries kept across a reconnect (the resent ones counted twice: "
          "the window shrinks with every flap until the link stalls)",
          "cluster/link.py",
          "        self.inflight = deque()\n        self.unacked = 0\n",
          "        self.inflight = deque()\n", (RUN_WINDOW,)),
        m("cross-forward-cache-stale", "cluster/routes.py _changed: a route change empties "
          "only the table's own cache, not the mesh's per-topic links (a topic cached as going "
          "nowhere is never forwarded to a new subscriber's router)",
          "cluster/routes.py",
          "        for cache in self._caches:\n",
          "        for cache in self._caches[:1]:\n", (FWD,)),
        m("cross-run-open-after-flush", "cluster/link.py flush: the run that went stays open, "
          "so the next plain DELIVERs are added to a run already written (never sent)",
          "cluster/link.py",
          "            self._open = None  # it goes now (or its first part): later ones start "
          "a new run\n",
          "            pass\n", (GUARD, RUN_WINDOW)),
        # a publisher's run onto each link in one step (Mesh.forward_run -> entry_items ->
        # MeshLink.deliver_run) and a peer's run found in one call (plain_run_end)
        m("cross-items-origin-unflagged", "cluster/_speedups.c entry_items: the origin written "
          "but its flag not set (the peer reads the origin's bytes as the next entry: No Local "
          "and the rest of the frame broken)",
          "cluster/_speedups.c",
          "            return NULL;\n        flags |= F_ORIGIN;\n    }\n    PyObject *epoch",
          "            return NULL;\n    }\n    PyObject *epoch", (RUN_ITEMS,)),
        m("cross-run-end-ignores-origin", "cluster/_speedups.c plain_run_end: messages of "
          "another origin join the run (routed with the first one's origin: No Local wrong "
          "for them)",
          "cluster/_speedups.c",
          "        if (same == 1)\n"
          "            same = PyObject_RichCompareBool(mo, origin, Py_EQ);\n",
          "", (RUN_END,)),
        m("cross-py-run-end-ignores-topic", "cluster/sendrun.py plain_run_end (the reference, "
          "CLUSTER_PURE_PYTHON=1): messages on another topic join the run (delivered to the "
          "first one's subscribers)",
          "cluster/sendrun.py",
          "        if m.qos or m.retain or m.topic != topic or m.origin != origin:\n",
          "        if m.qos or m.retain or m.origin != origin:\n", (RUN_END,)),
        m("cross-link-run-seqs-short", "cluster/link.py deliver_run: a run appended whole moves "
          "the link's next seq by one, not by its count (the next entries reuse its seqs: the "
          "peer drops them as already processed)",
          "cluster/linkqueue.py",
          "        self.next_seq += count\n",
          "        self.next_seq += 1\n", (RUN_CROSS, RUN_WINDOW)),
        m("cross-link-run-overflow-uncounted", "cluster/link.py deliver_run: a run that does "
          "not fit whole under link_max_queued_bytes is dropped without a count (not entry by "
          "entry: meshmq_link_dropped_total short of what was lost)",
          "cluster/linkqueue.py",
          "        deliver = self.deliver\n        for k in range(0, 3 * count, 3):\n",
          "        deliver = self.deliver\n        for k in range(0):\n", (FULL,)),
        m("costguard-crossing-run-per-entry", "cluster/link.py deliver_run: every run queued "
          "entry by entry through deliver (the same entries, the old cost: only the cost guard "
          "can see it)",
          "cluster/linkqueue.py",
          "        size = body_bytes + ENTRY_OVERHEAD * count\n"
          "        if self.queued_bytes + size > self._max_bytes:\n",
          "        size = body_bytes + ENTRY_OVERHEAD * count\n"
          "        if True:\n", (GUARD,)),
        m("cross-older-build-fatal", "cluster/frames.py: a _speedups built from older source "
          "(no entry_items) is used anyway: every router dies at import with AttributeError",
          "cluster/frames.py",
          "if _speedups is not None and not all(\n",
          "if False and not all(\n",
          ("tests/cluster/test_frames_speedups.py::"
           "test_an_extension_built_from_older_source_is_set_aside_not_fatal",)),
    )
