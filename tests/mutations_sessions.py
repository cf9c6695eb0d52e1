"""Planted bugs for the session registry in Raft (issue 24: cluster/sessionreg.py,
broker/registry.py, the session commands of cluster/metastate.py), run by ``tests/mutate.py``
(``tests/mutate.py sessions-``). Each test of ``tests/cluster/test_session_registry.py`` and
``tests/cluster/test_sessionreg_unit.py`` is named by at least one mutation it must catch."""

from __future__ import annotations

from typing import Any

REG = "tests/cluster/test_session_registry.py"
UNIT = "tests/cluster/test_sessionreg_unit.py"
CFG = ("tests/meshmq/test_cluster_config.py::test_misconfiguration_exits_2_naming_the_key"
       "[session-checkpoint-interval-zero]")


def sessions_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("sessions-connect-asks-peers", "handle_connect: the Raft claim skipped, the CONNECT "
          "asks every peer (the mesh CLAIM) and waits for a frozen one",
          "broker/handle_connect.py",
          "        if self.registry is not None and not code and self.registry.claim(conn, pkt, "
          "rest):\n",
          "        if False and self.registry.claim(conn, pkt, rest):\n",
          (f"{REG}::test_a_connect_gets_its_connack_while_a_peer_is_frozen",)),
        m("sessions-no-takeover", "broker/registry.py taken: a newer claim elsewhere leaves "
          "this router's connection open (two connections per client id after a partition)",
          "broker/registry.py",
          "        session = router.sessions.get(client_id)\n        if session is None:\n"
          "            return\n        self.claimed.pop(client_id, None)\n",
          "        session = router.sessions.get(client_id)\n        if True:\n"
          "            return\n        self.claimed.pop(client_id, None)\n",
          (f"{REG}::test_one_connection_per_client_id_after_a_healed_partition",)),
        m("sessions-connect-without-commit", "broker/registry.py: a claim that did not commit "
          "(no Raft majority) connects the client anyway",
          "broker/registry.py",
          "            self._refuse(conn, pkt, answer)\n            return\n",
          "            router.finish_connect(conn, pkt, 0)\n            return\n",
          (f"{REG}::test_without_a_raft_majority_a_connect_is_refused",)),
        m("sessions-claim-without-state", "metastate: a claim's answer does not carry the saved "
          "session state (a session on a lost node cannot resume)",
          "cluster/metastate.py",
          'state=saved["state"] if saved and not clean else None)',
          "state=None)",
          (f"{REG}::test_a_persistent_subscriber_resumes_on_another_node_after_its_node_is_lost",
           f"{UNIT}::test_a_claim_answers_with_the_previous_holder_and_the_saved_state")),
        m("sessions-resume-no-offsets", "sessionstore portable: the held log positions are not "
          "saved (the resumed session starts live: what came while away is never delivered)",
          "broker/sessionstore.py",
          '        data["inflight"], data["queue"] = [], []\n',
          '        data["inflight"], data["queue"], data["behind"] = [], [], {}\n',
          (f"{REG}::test_a_persistent_subscriber_resumes_on_another_node_after_its_node_is_lost"
           "[m2-unacked]",)),
        m("sessions-no-handover", "broker/registry.py: the previous holder, alive, is not asked "
          "to hand the session over (queued unlogged messages lost on every move)",
          "broker/registry.py",
          "                and router.forwarder is not None:\n",
          "                and False:\n",
          (f"{REG}::test_a_session_moving_between_live_routers_is_handed_over",)),
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
        m("sessions-cfg-interval-zero", "config: cluster.session_checkpoint_interval = 0 "
          "accepted (a checkpoint timer firing in a loop)",
          "meshmq/config.py",
          '        "session_checkpoint_interval": (_Float(0.0, inclusive=False),\n',
          '        "session_checkpoint_interval": (_Float(-1.0, inclusive=False),\n',
          (CFG,)),
    )
