"""Planted bugs for the one cursor engine (issue 26: ``broker/cursors.py``, offset replay and
catch-up reading through one ``LogSource``), run by ``tests/mutate.py`` like every other guard
(``tests/mutate.py cursors-``). Each names the test of ``tests/cluster/test_cursor_reads.py``
that must catch it.
"""

from __future__ import annotations

from typing import Any

CR = "tests/cluster/test_cursor_reads.py"
RETRY = CR + "::test_reads_failing_while_the_owner_is_down_are_retried_for_replay_and_catch_up"
BACK = CR + "::test_a_live_replay_cursor_reads_back_what_a_killed_owner_never_routed"


def cursors_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("cursors-retry-never-resumes", "broker/cursors.py LogSource: a failed read of "
          "another router's log is never tried again (the cursor stays marked retrying, so "
          "neither the replay nor the lagging session reads on once the owner is back)",
          "broker/cursors.py", "    def _retry(self, session: Session, c: LogCursor, "
          "reader: Reader) -> None:\n        c.retrying = False\n",
          "    def _retry(self, session: Session, c: LogCursor, "
          "reader: Reader) -> None:\n        pass\n", (RETRY,)),
        m("cursors-retry-uncounted", "broker/cursors.py LogSource: a retried read is not "
          "counted in meshmq_log_read_retries_total", "broker/cursors.py",
          "        self.stats.log_read_retries += 1\n", "        pass\n", (RETRY,)),
        m("cursors-retry-path-raises", "broker/cursors.py LogSource: the retry after a failed "
          "remote read raises AttributeError (defect 1: after the rooms split replay's retry "
          "called self.self.pump, and no test ran that path)", "broker/cursors.py",
          "        if reader.wants(session, c):\n            reader.resume(session)\n",
          "        if reader.wants(session, c):\n            reader.self.resume(session)\n",
          (RETRY,)),
        m("cursors-live-replay-not-read-back", "broker/positions.py owner_back: a live replay "
          "cursor is not read back when its owner's link comes back (what the owner stored "
          "and never routed is lost to the offset subscriber: chaos run 20261126-034209-23)",
          "broker/positions.py", "        started = self._replays.owner_back(owner)\n",
          "        started = 0\n", (BACK,)),
    )
