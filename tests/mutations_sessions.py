"""Planted bugs for the session registry in Raft (issue 24: cluster/sessionreg.py,
broker/registry.py, the session commands of cluster/metastate.py), run by ``tests/mutate.py``
(``tests/mutate.py sessions-``). Each test of ``tests/cluster/test_session_registry.py`` and
``tests/cluster/test_sessionreg_unit.py`` is named by at least one mutation it must catch."""

from __future__ import annotations

from typing import Any

UNIT = "tests/cluster/test_sessionreg_unit.py"


def sessions_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("sessions-stale-save", "metastate save_session: no compare-and-set on the session "
          "epoch (a router that lost the client id overwrites the new holder's state)",
          "cluster/metastate.py",
          '        if old is None or old["router"] != router or old["epoch"] != epoch:\n'
          '            return False, old, None\n        self._states()[client_id]',
          "        if old is None:\n"
          '            return False, old, None\n        self._states()[client_id]',
          (f"{UNIT}::test_a_save_under_a_stale_claim_is_refused",)),
        m("sessions-clean-keeps-state", "metastate claim_session: a clean start keeps the old "
          "saved state (a later resume brings back a session the client ended)",
          "cluster/metastate.py",
          "        saved = states.pop(client_id, None) if clean else states.get(client_id)\n",
          "        saved = states.get(client_id)\n",
          (f"{UNIT}::test_a_clean_claim_drops_the_state_and_a_release_drops_both",)),
        m("sessions-epoch-per-id", "metastate claim_session: epochs counted per client id, "
          "restarting at 1 after a release (a stale watch change looks newer)",
          "cluster/metastate.py",
          '        rec = {"router": router, "epoch": self.session_seq}\n',
          '        rec = {"router": router, "epoch": (old["epoch"] + 1) if old else 1}\n',
          (f"{UNIT}::test_epochs_never_go_back_after_a_release",)),
    )
