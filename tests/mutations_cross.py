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
    )
