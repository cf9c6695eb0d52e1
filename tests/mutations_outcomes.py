"""Planted bugs for APPEND outcomes across link faults and ``cluster.append_timeout`` (issue 28,
defects 1 and 5), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py
outcomes-``). Each test of ``tests/cluster/test_append_outcomes.py`` and the config cases of
``cluster.append_timeout`` are named by at least one mutation they must catch.
"""

from __future__ import annotations

from typing import Any

AO = "tests/cluster/test_append_outcomes.py"
FAILED = AO + "::test_failed_writes_whose_results_were_lost_are_refused_not_acked"
STORED = AO + "::test_stored_writes_whose_results_were_lost_are_acked_once_stored_once"
FROZEN = AO + "::test_a_frozen_owner_gets_its_publishers_refused_after_append_timeout"
GONE = AO + "::test_a_publish_refused_before_it_ever_left_is_never_stored_later"
KILLED = AO + "::test_stored_writes_whose_owner_was_killed_before_answering_are_acked_and_kept"
UNIT = "tests/cluster/test_outcomes_unit.py"
STATUS = AO + "::test_cluster_status_shows_appends_awaiting_an_outcome"
CASE = "tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"


def outcomes_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("outcomes-ack-means-stored", "cluster/link.py: an ACK (processed) completes an "
          "APPEND still waiting for its RESULT as stored (the issue's false PUBACK)",
          "cluster/link.py",
          "            if out.done is not None:\n                ask.append(out)\n"
          "                continue\n",
          "            if out.done is not None:\n                done, out.done = out.done, None\n"
          "                del self.awaiting[out.seq]\n                done(None, -1)\n",
          (FAILED,)),
        m("outcomes-successes-forgotten", "cluster/link.py: the owner remembers only failed "
          "APPENDs, so a resent stored one is answered 'outcome unknown'",
          "cluster/link.py", "            self.outcomes.stored(seq, offset)\n",
          "            pass\n", (STORED,)),
        m("outcomes-resent-appended-again", "cluster/link.py: a resent APPEND the owner "
          "already processed is not answered (its publisher waits for ever)",
          "cluster/link.py", "                if entry.kind == frames.APPEND:\n"
          "                    self._answer_again(entry.seq)\n",
          "                pass\n", (STORED,)),
        m("outcomes-ring-slot-unchecked", "cluster/outcomes.py: a slot answers for any seq "
          "that maps to it (an older seq gets a newer one's 'stored')",
          "cluster/outcomes.py", "if seqs is None or seqs[seq & _MASK] != seq:",
          "if seqs is None:",
          (UNIT + "::test_a_slot_taken_by_a_newer_seq_answers_nothing_for_the_older_one",)),
        m("outcomes-not-cleared", "cluster/outcomes.py: a new peer incarnation keeps the old "
          "one's outcomes", "cluster/outcomes.py",
          "        self._seqs = self._offsets = None\n", "        pass\n",
          (UNIT + "::test_a_new_incarnation_forgets_everything",)),
        m("outcomes-ack-before-results", "cluster/link.py: the owner's ACK goes ahead of "
          "the RESULTs it covers, so a healthy link asks every outcome again",
          "cluster/link.py", "            parts.append(frames.encode_seq(frames.ACK, ack))\n",
          "            parts.insert(0, frames.encode_seq(frames.ACK, ack))\n", (STORED,)),
        m("outcomes-restart-resend-dropped", "cluster/link.py: APPENDs in flight when the "
          "link drops are not resent (as QoS 0 deliveries), so a restarted owner never gets them",
          "cluster/link.py", "            if out.qos == 0 and out.kind == frames.DELIVER:\n",
          "            if out.kind == frames.APPEND or out.qos == 0 and out.kind == frames.DELIVER:"
          "\n", (KILLED,)),
        m("outcomes-no-append-timeout", "cluster/link.py: an APPEND waits for its outcome "
          "for ever (cluster.append_timeout ignored)",
          "cluster/link.py", "            if now - out.at < timeout:\n",
          "            if True:\n", (FROZEN,)),
        m("outcomes-unsent-kept", "cluster/link.py: a publish refused at append_timeout "
          "before it ever left stays queued, and is stored when the owner is back",
          "cluster/link.py",
          "            self.unsent = deque(o for o in self.unsent if o.seq not in unsent)\n",
          "            pass\n", (GONE,)),
        m("outcomes-unsent-said-unknown", "cluster/link.py: a publish that never left is "
          "refused as 'outcome unknown' though it is known not stored",
          "cluster/link.py",
          "_tell(done, AppendTimeout(self.peer, timeout, out.seq <= sent_upto), -1)",
          "_tell(done, AppendTimeout(self.peer, timeout, True), -1)", (GONE,)),
        m("outcomes-reason-string-anonymous", "broker/ingest.py: a publish its owner did not "
          "store gets the local disk's reason string, not the owner's name",
          "broker/ingest.py", "            why = {Prop.REASON_STRING: str(err) if remote else",
          "            why = {Prop.REASON_STRING: _NOT_STORED if remote else", (FROZEN,)),
        m("outcomes-log-line-anonymous", "broker/ingest.py: the not-stored log line blames "
          "this router's disk for a publish its owner did not confirm",
          "broker/ingest.py", '"message not stored" if remote', "_NOT_STORED if remote",
          (FROZEN,)),
        m("outcomes-awaiting-metric", "meshmq/cluster_wiring.py: "
          "meshmq_link_appends_awaiting always 0",
          "meshmq/cluster_wiring.py", "        awaiting.add_metric(peer, len(link.awaiting))\n",
          "        awaiting.add_metric(peer, 0)\n", (STORED,)),
        m("outcomes-status-column", "meshmq/clustercli.py: cluster status does not show the "
          "appends awaiting an outcome", "meshmq/clustercli.py",
          "    if count is None:\n        return \"-\"\n",
          "    if True:\n        return \"-\"\n", (STATUS,)),
        m("outcomes-awaiting-metric-renamed", "meshmq/cluster_wiring.py: the awaiting gauge "
          "renamed, leaving the dashboard's panel blank",
          "meshmq/cluster_wiring.py", 'GaugeMetricFamily("meshmq_link_appends_awaiting"',
          'GaugeMetricFamily("meshmq_link_appends_waiting"', ("tests/meshmq/test_dashboard.py",)),
        m("outcomes-cfg-append-timeout", "config: cluster.append_timeout <= 0 accepted",
          "meshmq/config.py",
          '"append_timeout": (_Float(0.0, inclusive=False),',
          '"append_timeout": (_Float(-1e9, inclusive=True),',
          (f"{CASE}[append-timeout-zero]", f"{CASE}[append-timeout-env]")),
    )
