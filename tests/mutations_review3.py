"""Planted bugs for review3's fixes (a fault-finder's review of the delivery, shared and idem
merges), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py review3-``). Each
new test is named by at least one mutation it must catch.
"""

from __future__ import annotations

from typing import Any

RG = "tests/cluster/test_routegap_bounds.py"
RG_LATE = RG + "::test_routes_arriving_past_the_window_get_nothing_and_the_state_is_released"
RG_FULL = RG + "::test_a_full_link_stops_the_read"
RG_CAP = RG + "::test_the_read_stops_at_scan_max_records"
FLAP = ("tests/cluster/test_owner_back_reads.py::"
        "test_a_link_flap_with_many_positions_has_no_read_refused_and_misses_nothing")
PROTO = "tests/cluster/test_link_protocol.py::test_a_peer_of_mesh_protocol_1_is_refused"
DOWN = ("tests/cluster/test_idempotence_unit.py::"
        "test_an_owner_down_longer_than_the_lookback_still_finds_what_it_stored")


def review3_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("review3-routegap-no-deadline", "cluster/routegap.py: a peer's routes arriving hours "
          "after this router's start still get every record stored since, in one synchronous "
          "read (and a peer that never comes back is tracked forever)",
          "cluster/routegap.py", "        if self._clock() <= self._deadline:\n",
          "        if True:\n", (RG_LATE,)),
        m("review3-routegap-past-full", "cluster/routegap.py: the read goes on to the log end "
          "after the link refused a DELIVER as full (everything after is dropped anyway)",
          "cluster/routegap.py", "                    if ok is None:\n",
          "                    if False:\n", (RG_FULL,)),
        m("review3-routegap-no-cap", "cluster/routegap.py: no cap on the records read for a "
          "peer whose routes match little of the backlog",
          "cluster/routegap.py", "        budget = self._scan_max\n",
          "        budget = 1 << 62\n", (RG_CAP,)),
        m("review3-idem-lookback-from-start", "cluster/idempotence.py: the resend lookback "
          "is measured back from this process's start, so an owner down longer than it stores "
          "every resent APPEND a second time",
          "cluster/idempotence.py", "            if recs and recs[0].offset < first_new:\n",
          "            if False:\n", (DOWN,)),
        m("review3-mesh-protocol-1", "cluster/frames.py: the mesh protocol stays at 1 with "
          "SHARE_ON and ':src', so an older build links and silently drops handed-on shares",
          # (was frames.VERSION = 2 -> 1; with negotiation the text matched MIN_VERSION, whose
          # import-time assertion made the plant a collection error, not a test failure: the
          # acceptor's "no common version" check is where a protocol-1 peer is refused now)
          "cluster/handshake.py",
          "            if chosen < max(peer.version, self.me.version):\n",
          "            if False:\n", (PROTO,)),
        m("review3-catchup-unpaced", "broker/cursors.py: every catch-up read of an owner's "
          "logs goes out at once after a link comes back; the owner refuses past 64 as busy",
          "broker/cursors.py", "FETCHES_PER_OWNER = 32\n", "FETCHES_PER_OWNER = 1 << 30\n",
          (FLAP,)),
    )
