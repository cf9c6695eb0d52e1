"""Planted bugs for publishes across a leader change: moved from a deposed leader to the new one
(cluster/appendmove.py), and held while the leader lease is out for an election
(broker/gatehold.py); run by ``tests/mutate.py`` (``tests/mutate.py appendmove-``)."""

from __future__ import annotations

from typing import Any

REAL = ("tests/cluster/test_append_move.py::test_publishes_waiting_on_a_killed_leader_are_"
        "acknowledged_by_the_new_one")
HOLD = ("tests/cluster/test_lease_hold.py::test_killing_the_raft_leader_s_node_refuses_and_"
        "disconnects_no_publisher")


def appendmove_mutations(mutation: Any) -> tuple[Any, ...]:
    """The mutations, built with tests/mutate.py's ``Mutation`` class (passed in: no cycle)."""
    m = mutation
    return (
        m("appendmove-unwired", "meshmq/cluster_wiring.py: the mover never hears a leader "
          "change (publishes wait on the dead leader until cluster.append_timeout)",
          "meshmq/cluster_wiring.py", "    mesh.placement.subscribe(mover.on_change)\n",
          "    pass\n", (REAL,)),
        m("appendmove-sent-kept", "cluster/link.py take_appends: only never-sent APPENDs "
          "move (the sent ones wait for the timeout)", "cluster/link.py",
          "and (out.seq > sent_upto or resendable(out.retry))]",
          "and out.seq > sent_upto]", (REAL,)),
        m("appendmove-lease-hold-off", "broker/gatehold.py: a publish is never held for the "
          "lease (refused at once, as before: an election disconnects every 3.x publisher)",
          "broker/gatehold.py", "        if until is None or until <= time.monotonic():",
          "        if True:", (HOLD,)),
    )
