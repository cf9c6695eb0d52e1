"""Planted bugs for cluster/'s placement seam, request table and import graph (issue 26, the
cluster/ part), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py mesh-``).

Each new test of ``tests/cluster/test_placement_unit.py``, ``tests/cluster/test_requests_unit.py``
and the import-circle check of ``tests/test_lint.py`` is named by at least one mutation it must
catch.
"""

from __future__ import annotations

from typing import Any

PL = "tests/cluster/test_placement_unit.py"
RQ = "tests/cluster/test_requests_unit.py"


def mesh_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("mesh-placement-change-unseen", "cluster/placement.py leader_of: a leader move is "
          "recorded but never answered (the static hash wins for ever)",
          "cluster/placement.py",
          "        moved = self._moved.get(device)\n        if moved is not None:\n",
          "        moved = None\n        if moved is not None:\n",
          (f"{PL}::test_a_leader_change_is_seen_at_once_and_fires_the_event",)),
        m("mesh-placement-owner-change-unseen", "cluster/placement.py owner_of: the broker's "
          "owner lookup ignores leader moves (routing, APPEND and cursors go to the old one)",
          "cluster/placement.py",
          "        rid = self._hashed(device) if moved is None else moved.router\n",
          "        rid = self._hashed(device)\n",
          (f"{PL}::test_a_leader_change_is_seen_at_once_and_fires_the_event",
           f"{PL}::test_a_replay_cursor_reads_the_leader_at_each_read")),
        m("mesh-cursor-owner-fixed-at-subscribe", "broker/cursors.py LogCursor: "
          "the owner is read once when the cursor is made and kept (the cache issue 26 removes)",
          "broker/cursors.py",
          "        self.owner_of = owner_of  # device -> leading router, None when this one\n",
          "        self.owner_of = (lambda _d, o=owner_of(device): o)  # fixed at subscribe\n",
          (f"{PL}::test_a_replay_cursor_reads_the_leader_at_each_read",)),
        m("mesh-requests-link-down-ignored", "cluster/requests.py link_down: a request whose "
          "link went down is not failed (it waits for its timeout, or for ever)",
          "cluster/requests.py", "                self._guard(req.fail, why, False)\n",
          "                pass\n",
          (f"{RQ}::test_a_link_going_down_fails_what_waits_on_it_at_once",
           f"{RQ}::test_a_claim_ends_when_every_link_answered_or_went_down")),
        m("mesh-requests-any-link-answers", "cluster/requests.py answer: an answer counts from "
          "any link (a reply on the wrong connection settles a read)",
          "cluster/requests.py", "        if req is None or link not in req.waiting:\n",
          "        if req is None:\n",
          (f"{RQ}::test_a_link_going_down_fails_what_waits_on_it_at_once",)),
        m("mesh-import-circle", "cluster/link.py imports the mesh again (under TYPE_CHECKING: "
          "a type-only circle, the one issue 26 removed)", "cluster/link.py",
          "from typing import Any, Protocol\n",
          "from typing import TYPE_CHECKING, Any, Protocol\n\nif TYPE_CHECKING:\n"
          "    from cluster.mesh import Mesh  # noqa: F401\n",
          ("tests/test_lint.py::test_cluster_has_no_import_circle",)),
    )
