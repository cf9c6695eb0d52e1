"""Planted bugs for review11's fixes and checks (``tests/mutate.py review11-``): requests of
timed-out metadata proposal attempts are forgotten (cluster/metaclient.py), and the compiled
makers and whole-packet encoder (broker/protocol/_speedups.c) against what the tests of 2ae833d
missed."""

from __future__ import annotations

from typing import Any


def review11_mutations(mutation: Any) -> tuple[Any, ...]:
    m = mutation
    return (
        m("attempts-unbounded", "cluster/metaclient.py Proposer.propose_until: one attempt "
          "waits until the deadline (a proposal Raft dropped refuses the held publishes at "
          "append_timeout: the CI failure of 2026-11-26)", "cluster/metaclient.py",
          "                return await asyncio.wait_for(client.propose(cmd), min(left, "
          "attempt))\n",
          "                return await asyncio.wait_for(client.propose(cmd), left)\n",
          ("tests/cluster/test_proposal_attempts.py::"
           "test_a_proposal_raft_never_answers_is_proposed_again_before_the_deadline",)),
        m("review11-session-commands-retried", "cluster/sessionreg.py _propose: a claim and a "
          "save are proposed again after 3 s like a CAS (a slow claim commits twice and skips "
          "the real holder's handover; a late save puts an older session state back)",
          "cluster/sessionreg.py",
          '        return self.proposer.propose_until(cmd, deadline, bounded=cmd[0] == '
          '"release_session")\n',
          "        return self.proposer.propose_until(cmd, deadline, bounded=True)\n",
          ("tests/cluster/test_review11_retried_claims.py::"
           "test_a_claim_retried_after_its_first_attempt_committed_still_hands_the_session_over",
           "tests/cluster/test_review11_retried_claims.py::"
           "test_a_save_retried_after_a_newer_one_committed_does_not_put_the_old_state_back")),
        m("review11-abandoned-requests-kept", "cluster/metaclient.py _flush: a request every "
          "caller stopped waiting for (a timed-out attempt) is kept until its answer comes",
          "cluster/metaclient.py",
          "            if not fut.done() and all(w.done() for _, w in batch):\n",
          "            if False:\n",
          ("tests/cluster/test_metadata_raft.py::"
           "test_attempts_that_timed_out_leave_no_request_behind",)),
        m("review11-pid-topic-length-high-byte", "broker/protocol/_speedups.c "
          "publish_header (publish_packet_pid's and publish_packet's): the topic length's high "
          "byte shifted by 9 (topics of 256 bytes and more get a wrong length)",
          "broker/protocol/_speedups.c",
          "    hdr[hl++] = (unsigned char)(tl >> 8);\n",
          "    hdr[hl++] = (unsigned char)(tl >> 9);\n",
          ("tests/broker/test_review11_v3_whole_packet.py::"
           "test_v3_qos1_and_2_copies_are_the_same_bytes_from_c_and_pure_python",)),
        m("review11-maker-template-ref-kept", "broker/protocol/_speedups.c slot_maker: an "
          "argument replaces the template's value in its slot without releasing it (every "
          "made object leaks a reference to a shared None/0/\"\")",
          "broker/protocol/_speedups.c",
          "        Py_SETREF(*(PyObject **)((char *)obj + mk->field_offset[j]), "
          "Py_NewRef(args[j]));\n",
          "        *(PyObject **)((char *)obj + mk->field_offset[j]) = Py_NewRef(args[j]);\n",
          ("tests/protocol/test_slot_maker.py::"
           "test_made_objects_keep_no_reference_to_what_they_no_longer_hold",)),
        m("review11-maker-untracked", "broker/protocol/_speedups.c slot_maker: a made object "
          "is taken out of the GC (a cycle through it is never collected)",
          "broker/protocol/_speedups.c",
          "    if (obj == NULL)\n        return NULL;\n"
          "    for (Py_ssize_t i = 0; i < mk->nslots; i++)\n",
          "    if (obj == NULL)\n        return NULL;\n    PyObject_GC_UnTrack(obj);\n"
          "    for (Py_ssize_t i = 0; i < mk->nslots; i++)\n",
          ("tests/protocol/test_slot_maker.py::"
           "test_a_made_object_in_a_reference_cycle_is_collected",)),
    )
