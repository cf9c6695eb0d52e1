"""Planted bugs for the mesh protocol's versions, epochs and fencing (issue 26, Wire), run by
``tests/mutate.py`` like every other guard (``tests/mutate.py wire-``).

Each test of ``tests/cluster/test_wire_versions.py`` (sans-I/O: the handshake, the codecs,
fencing, the config key) and ``tests/cluster/test_wire_mixed.py`` (real processes: a node capped
at 2 beside a default one, the raw mesh peer for fencing) is named by at least one mutation it
must catch. The tests that load the version-2 build from git skip in a mutant's copy (it has no
``.git``), so no mutation relies on them.
"""

from __future__ import annotations

from typing import Any

WV = "tests/cluster/test_wire_versions.py"
WM = "tests/cluster/test_wire_mixed.py"
HS = "cluster/handshake.py"
FR = "cluster/frames.py"


def wire_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        # ------------------------------------------------------------------ negotiation
        m("wire-negotiate-highest-of-either", "handshake: the acceptor picks the higher of the "
          "two caps, not the highest both speak", HS,
          "            chosen = min(peer.highest, self.me.highest)\n",
          "            chosen = max(peer.highest, self.me.highest)\n",
          (f"{WV}::test_the_handshake_settles_on_the_highest_version_both_speak",)),
        m("wire-cap2-hello-tail", "handshake: a router capped at 2 still sends its highest "
          "version after the incarnation (not the version-2 HELLO)", HS,
          "    tail = _U16.pack(h.top) if ftype == frames.HELLO and h.top > h.version else proof\n",
          "    tail = _U16.pack(h.highest) if ftype == frames.HELLO else proof\n",
          (f"{WV}::test_a_router_capped_at_2_speaks_exactly_version_2",)),
        m("wire-proof-blind-to-version", "handshake: the version-3 proofs do not cover the "
          "negotiation (a middlebox can change the versions)", HS,
          "    if chosen >= frames.V_EPOCHS:\n        parts.append(",
          "    if False:\n        parts.append(",
          (f"{WV}::test_a_middlebox_cannot_talk_two_new_routers_down_to_another_version",)),
        m("wire-dialer-takes-any-version", "handshake: the dialer accepts a version it did not "
          "offer", HS, "            if not self.me.version <= chosen <= self.me.highest:\n",
          "            if False:\n",
          (f"{WV}::test_a_dialer_refuses_a_version_it_did_not_offer",)),
        m("wire-no-common-version-linked", "handshake: ranges that do not meet are linked at "
          "the lower cap", HS,
          "            if chosen < max(peer.version, self.me.version):\n",
          "            if False:\n",
          (f"{WV}::test_no_common_version_is_refused_naming_both_and_the_key",)),
        m("wire-config-cap-unchecked", "config: cluster.protocol_version accepts any integer",
          "meshmq/config.py",
          '        "protocol_version": (_Int(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION),\n',
          '        "protocol_version": (_Int(MIN_PROTOCOL_VERSION - 1),\n',
          (f"{WV}::test_a_protocol_version_this_build_does_not_speak_is_a_config_error",)),
        m("wire-mesh-cap-ignored", "mesh: the router's cap never reaches the handshake (a node "
          "with protocol_version = 2 speaks 3)", "cluster/mesh.py",
          "                set(self.links), self._resume_point, self.settings.protocol_version)",
          "                set(self.links), self._resume_point)",
          (f"{WM}::test_a_node_capped_at_version_2_and_a_default_one_keep_a_working_link",)),
        # ------------------------------------------------------------------ the bytes per version
        m("wire-epoch-head-on-v2-link", "link: an APPEND's epoch is written on a version-2 "
          "link too (the peer misreads every entry after it)", "cluster/link.py",
          "        epochs = self.version >= _V_EPOCHS\n", "        epochs = True\n",
          (f"{WM}::test_a_node_capped_at_version_2_and_a_default_one_keep_a_working_link",)),
        m("wire-entries-read-as-newest", "link: entries decoded as the newest version whatever "
          "the link negotiated (those after a frame's plain DELIVERs: the compiled codec's "
          "path, MeshLink._on_entries_frame)", "cluster/link.py",
          "            self._on_entries(frames.decode_entries_at(body, pos, rest, self.version))\n",
          "            self._on_entries(frames.decode_entries_at(body, pos, rest, "
          "frames.VERSION))\n",
          (f"{WM}::test_a_node_capped_at_version_2_and_a_default_one_keep_a_working_link",)),
        m("wire-records-log-end-lost", "frames: RECORDS at version 3 says no log end", FR,
          "        head += _RECORDS_V3.pack(r.log_end, ",
          "        head += _RECORDS_V3.pack(-1, ",
          (f"{WV}::test_records_round_trip_log_end_high_watermark_and_epochs_at_version_3",)),
        m("wire-fetch-replica-lost", "frames: FETCH at version 3 does not say who asks", FR,
          "        body += _s(f.replica) + _I32.pack(f.last_epoch)\n",
          '        body += _s("") + _I32.pack(f.last_epoch)\n',
          (f"{WV}::test_fetch_round_trips_its_replica_and_last_epoch_at_version_3",)),
        m("wire-append-epoch-dropped", "frames: a version-3 APPEND's epoch is read as none", FR,
          "            (epoch,) = _EPOCH.unpack_from(body, p)\n            p += 4\n",
          "            p += 4\n",
          (f"{WV}::test_version_3_appends_carry_their_epoch_and_nothing_else_does",)),
        # ------------------------------------------------------------------ fencing
        m("wire-no-leader-fence", "fencing: an APPEND for a log this router does not lead is "
          "applied (the bug the issue names)", "cluster/placement.py",
          "        return router == self.me and (epoch < 0 or epoch == current)\n",
          "        return epoch < 0 or epoch == current\n",
          (f"{WM}::test_an_append_at_a_stale_epoch_or_at_a_non_leader_is_refused_and_stored"
           "_nowhere",)),
        m("wire-no-epoch-fence", "fencing: an APPEND naming a stale leader epoch is applied",
          "cluster/placement.py",
          "        return router == self.me and (epoch < 0 or epoch == current)\n",
          "        return router == self.me\n",
          (f"{WM}::test_an_append_at_a_stale_epoch_or_at_a_non_leader_is_refused_and_stored"
           "_nowhere[3]",)),
        m("wire-no-epoch-fence-unit", "fencing (sans-I/O): the stale-epoch check is gone",
          "cluster/placement.py",
          "        return router == self.me and (epoch < 0 or epoch == current)\n",
          "        return router == self.me\n",
          (f"{WV}::test_an_append_is_applied_only_by_the_leader_at_the_current_epoch",)),
        m("wire-divergence-unseen", "fencing: a replica whose last fetched epoch ended "
          "before its fetch offset here is sent records, not where its log diverged",
          "cluster/fencing.py", "    if epoch != last_epoch or end < offset:\n",
          "    if False:\n",
          (f"{WV}::test_the_leader_answers_a_diverged_replica_with_the_epoch_and_where_it_"
           "ended",)),
        m("wire-fenced-result-is-success", "link: a RESULT_FENCED outcome is taken for stored "
          "(the publisher gets a PUBACK of success)", "cluster/link.py",
          "            _tell(done, None if status == frames.RESULT_STORED\n",
          "            _tell(done, None if status in (frames.RESULT_STORED, "
          "frames.RESULT_FENCED)\n",
          (f"{WM}::test_a_fenced_append_is_a_refusal_to_its_publisher_never_a_success",)),
    )
