"""``meshmq cluster rebalance``: a plan that moves device-log replicas and leadership so every
node holds and leads a fair share, and the Raft commands that carry it out.

Why opt-in and never automatic: placement is state, not a hash (issue 24). Adding a node
moves no log (new logs use it); moving an existing one costs a full copy of it over the mesh,
so the operator decides when, the way Kafka ships ``kafka-reassign-partitions`` and leaves
``auto.leader.rebalance`` to leadership only.

The plan (``plan``), deterministic for one set of records:

1. **Replicas**: while the node holding the most replicas holds two more than the node holding
   the fewest, move one replica of a log from the fullest node to the emptiest one (a log the
   emptiest node does not hold yet; its router with the same index). Each move keeps RF and
   keeps the replicas on distinct nodes.
2. **Leadership**: while the node leading the most logs leads two more than the one leading
   the fewest, a log led by the first whose target replicas include a router of the second
   gets that router first in its target (the preferred leader, Kafka's term).

Carrying it out (``commands``): a log whose replica set changes gets ``reassign`` (Kafka's
KIP-455 order: the new replicas are *added*, fetch until they join the ISR, and only then
``complete_reassign`` removes the old ones and moves leadership when the leader is not a
target replica); a log whose only change is its leader gets ``elect`` when the new leader is in
the ISR. Both are compare-and-sets on the leader epoch (cluster/metastate.py): a plan computed
from records that changed since is refused, never applied to the wrong state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.settings import split_router_id


def _node(rid: str) -> str:
    return split_router_id(rid)[0]


def plan(records: Mapping[str, Mapping[str, Any]], nodes: list[str],
         max_moves: int = 1000) -> list[dict[str, Any]]:
    """The moves, one per log that changes: ``{"device", "epoch", "leader", "replicas",
    "new_leader", "new_replicas"}`` (``new_replicas[0]`` is the preferred leader). Logs that
    are lost or already being reassigned are left alone; at most ``max_moves`` logs change."""
    target: dict[str, list[str]] = {}
    for device in sorted(records):
        rec = records[device]
        if rec.get("lost") or "target" in rec or not rec.get("leader"):
            continue
        reps = [rec["leader"]] + [r for r in rec.get("replicas") or () if r != rec["leader"]]
        target[device] = reps
    held = {n: 0 for n in nodes}
    for reps in target.values():
        for r in reps:
            held[_node(r)] = held.get(_node(r), 0) + 1
    changed: set[str] = set()

    def budget() -> bool:
        return len(changed) < max_moves

    # 1. replicas, from the fullest node to the emptiest
    while budget():
        full = max(held, key=lambda n: (held[n], n))
        empty = min(held, key=lambda n: (held[n], n))
        if held[full] - held[empty] < 2:
            break
        for device, reps in target.items():
            nodes_of = [_node(r) for r in reps]
            if full in nodes_of and empty not in nodes_of:
                i = nodes_of.index(full)
                reps[i] = f"{empty}/{split_router_id(reps[i])[1]}"
                held[full] -= 1
                held[empty] += 1
                changed.add(device)
                break
        else:
            break  # no log can move between these two: done
    # 2. leadership, by reordering targets (the first replica leads)
    leads = {n: 0 for n in nodes}
    for reps in target.values():
        leads[_node(reps[0])] = leads.get(_node(reps[0]), 0) + 1
    while True:
        most = max(leads, key=lambda n: (leads[n], n))
        least = min(leads, key=lambda n: (leads[n], n))
        if leads[most] - leads[least] < 2:
            break
        for device, reps in target.items():
            if _node(reps[0]) != most or (not budget() and device not in changed):
                continue
            there = [r for r in reps if _node(r) == least]
            if there:
                reps.remove(there[0])
                reps.insert(0, there[0])
                leads[most] -= 1
                leads[least] += 1
                changed.add(device)
                break
        else:
            break
    moves = []
    for device in sorted(changed):
        rec = records[device]
        new = target[device]
        old = list(rec.get("replicas") or ())
        if new[0] == rec["leader"] and sorted(new) == sorted(old):
            continue  # reordered back to where it was
        moves.append({"device": device, "epoch": rec["epoch"], "leader": rec["leader"],
                      "replicas": old, "new_leader": new[0], "new_replicas": new})
    return moves


def commands(moves: list[dict[str, Any]],
             records: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, list]]:
    """The Raft command of each move, or why none can be proposed now: ``(device, cmd)`` with
    ``cmd`` a metastate command list, or ``(device, ["skip", why])``."""
    out: list[tuple[str, list]] = []
    for m in moves:
        device = m["device"]
        rec = records.get(device) or {}
        if sorted(m["new_replicas"]) != sorted(rec.get("replicas") or ()):
            out.append((device, ["reassign", device, m["epoch"], m["new_replicas"]]))
        elif m["new_leader"] in (rec.get("isr") or ()):
            out.append((device, ["elect", device, m["epoch"], m["new_leader"]]))
        else:
            out.append((device, ["skip", f"{m['new_leader']} is not in the ISR yet"]))
    return out


# Whether this build carries a plan out. Moving a replica or a leader needs followers that
# fetch (the new replica must hold the log before it leads or counts): until the replica
# fetcher lands, every replica but the leader is empty, and ``elect`` would make an empty
# replica the leader of a log at offset 0 again. So ``--execute`` is refused (the dry run
# works): the ``fetcher`` change sets this once followers fetch and join the ISR.
EXECUTABLE = False
NOT_EXECUTABLE = ("this build does not move replicas yet: followers do not fetch, so a moved "
                  "replica or leader would hold no records (use --dry-run to see the plan)")
