"""Planted bugs for a resent APPEND stored once across an owner's restart (issue 28, the chaos
suite's ``dups_in_log``), run by ``tests/mutate.py`` like every other guard (``tests/mutate.py
idem-``). Each test of ``tests/cluster/test_resend_idempotence.py`` is named by at least one
mutation it must catch.
"""

from __future__ import annotations

from typing import Any

RI = "tests/cluster/test_resend_idempotence.py"
KILLED = RI + "::test_appends_stored_before_the_owner_was_killed_are_stored_once"
UNIT = "tests/cluster/test_idempotence_unit.py"
OWN_INC = UNIT + "::test_a_resent_append_is_found_only_for_its_own_publisher_incarnation"
SPARK = ("tests/spark_connector/test_internal_headers.py::"
         "test_the_internal_source_header_is_not_a_spark_header")
LOOKBACK = UNIT + "::test_records_older_than_the_lookback_are_not_looked_for"
LATER = RI + "::test_a_new_publisher_incarnation_never_matches_the_adopted_ones_records"


def idem_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("idem-no-lookup", "cluster/idempotence.py: the restarted owner never finds a resent "
          "APPEND in its log and stores it again (at least once, the issue's dups_in_log)",
          "cluster/idempotence.py",
          "        return index.get(_SRC.pack(self._inc, seq, self._owner))\n",
          "        return None\n", (KILLED,)),
        m("idem-no-source-header", "cluster/mesh.py: a peer's record is stored without its "
          "':src' header, so nothing names it after a restart",
          "cluster/peerentries.py",
          "                                              source_value(inc, e.seq, self.rid))\n",
          "                                              None)\n", (KILLED,)),
        m("idem-never-adopted", "cluster/link.py: a peer incarnation first heard after our "
          "start is not checked against the log",
          "cluster/link.py", "                self.resends.adopt(est.peer_incarnation)\n",
          "                pass\n", (KILLED,)),
        m("idem-source-shown", "broker/devicelogs.py: the internal ':src' header is handed to "
          "MQTT subscribers replaying the log as a user property",
          "broker/devicelogs.py", "            if name == _H_ORIGIN or name == H_SOURCE:\n",
          "            if name == _H_ORIGIN:\n", (KILLED,)),
        m("idem-first-incarnation-kept", "cluster/idempotence.py: a restarted publisher's "
          "seqs (starting again from 1) are matched against its previous run's records",
          "cluster/idempotence.py", "        self._inc = incarnation[:8]\n",
          "        self._inc = self._inc or incarnation[:8]\n", (OWN_INC,)),
        m("idem-no-window", "cluster/idempotence.py: every APPEND of the adopted incarnation "
          "is looked up, not only the first link_window (never resent past it)",
          "cluster/idempotence.py", "        if seq >= first + self.window:\n",
          "        if False:\n", (OWN_INC,)),
        m("idem-no-lookback", "cluster/idempotence.py: the whole device log is read back, "
          "not the records of the lookback before the previous run's last write",
          "cluster/idempotence.py",
          "            since = self._last_before_start(store, device, start) - back\n",
          "            since = 0\n", (LOOKBACK,)),
        m("idem-source-in-spark", "spark_connector/arrow.py: Spark's headers column shows "
          "the internal ':src' header",
          "spark_connector/arrow.py", " for n, v in h if n not in _INTERNAL}\n",
          " for n, v in h}\n", (SPARK,)),
        m("idem-found-not-routed", "cluster/mesh.py: a resent APPEND found in the log is "
          "answered but not routed: a subscriber elsewhere never gets what the killed owner "
          "stored and had not delivered",
          "cluster/peerentries.py", "        msg.offset = found\n        router.route_again(msg)\n",
          "        msg.offset = found\n", (KILLED,)),
        m("idem-other-incarnation-looked-up", "cluster/idempotence.py: an APPEND of another "
          "incarnation than the adopted one is looked up as the adopted one's",
          "cluster/idempotence.py",
          "        if not self._inc or incarnation[:8] != self._inc:\n            return None\n",
          "", (OWN_INC,)),
        m("idem-later-incarnation-matched", "cluster/idempotence.py: the publisher "
          "restarting again after the owner adopted it has its new seqs (from 1) matched "
          "against the adopted incarnation's records: false acks, never stored (chaos seed 11)",
          "cluster/idempotence.py",
          "        if not self._inc or incarnation[:8] != self._inc:\n",
          "        if not self._inc:\n", (LATER,)),
    )
