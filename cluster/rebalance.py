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

Who does what once ``reassign`` is committed (no step needs the operator):

1. every router hears the record (``RaftFeed.learn``: a new replica set at the same epoch is
   news): an added router starts following the log from the leader (cluster/replication.py,
   cluster/fetcher.py); the leader serves it (``LeaderState.replicas_changed``) and, once it
   has caught up to the high-water mark, adds it to the ISR (``set_isr``, its usual check);
2. the controller (cluster/controller.py ``completes``) proposes ``complete_reassign`` when
   every target replica is in the ISR and on a live node: the old replicas leave, and a
   leader that is not a target hands over to the first target replica at a new epoch;
3. a router dropped from the replicas stops following; a leader dropped refuses the acks still
   waiting on it (never acknowledged: the publisher sends again, to the new leader). Its copy
   of the log **stays on its disk** (never served: it leads nothing and no one fetches from
   it, like any follower's copy it is not what listings show): deleting it is not
   needed for safety and a copy kept is never wrong (if the log comes back to it, the fetch's
   divergence check truncates what differs and it fetches the rest); the space it takes is
   freed by retention like any log's. Deleting it at once (Kafka's StopReplica with delete)
   is not built;
4. ``meshmq cluster rebalance`` (meshmq/clustercli.py) polls ``progress`` through the node
   admin until every move is done, electing the plan's preferred leader where
   ``complete_reassign`` kept a leader that is a target but not the first one.

A target router on a dead node keeps its move waiting (reported **stuck**: cluster/loghealth.py,
``meshmq cluster status``, ``meshmq_logs_reassign_stuck``): it finishes by itself when the node
returns and catches up. Meanwhile the log keeps its old replicas and leader (its ISR and
``min_insync_replicas`` are what they were), so a stuck move is no less safe than no move.
Cancelling one is not built (it would be a new Raft command: replicas back to the old ones).
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


def progress(moves: list[Mapping[str, Any]], records: Mapping[str, Mapping[str, Any]],
             stuck: set[str] | frozenset[str] = frozenset()
             ) -> tuple[list[dict[str, Any]], list[list]]:
    """Where each move of a plan stands, judged from the records as Raft holds them now (never
    from a proposal's answer: an unknown outcome is read back here), and the ``elect``
    commands that finish the ones whose replicas moved but whose leader is not the planned
    one yet (``complete_reassign`` keeps a leader that is a target replica; the plan's
    preferred leader, ``new_replicas[0]``, then takes over by a clean election of an in-sync
    replica, Kafka's preferred-leader election after a reassignment).

    States: ``done``; ``copying`` (the reassignment is in Raft, its added replicas not all in
    sync yet; ``waiting`` lists them); ``stuck`` (``copying``, with an added replica on a node
    that is down: ``stuck`` names those logs, from cluster/loghealth.py); ``electing`` (an
    ``elect`` is proposed with this answer); ``waiting`` (the new leader is a replica outside
    the ISR: it joins once caught up); ``not moved`` (the record has neither the planned
    replicas nor a reassignment to them: refused, or another change came first); ``gone``
    (no record). The first four and ``waiting`` may still finish; the last two never will."""
    out: list[dict[str, Any]] = []
    cmds: list[list] = []
    for m in moves:
        device = str(m["device"])
        new_leader, new = m["new_leader"], list(m["new_replicas"])
        rec = records.get(device)
        entry: dict[str, Any] = {"device": device}
        if rec is None:
            entry["state"] = "gone"
        elif "target" in rec:
            if list(rec["target"]) == new:
                isr = set(rec.get("isr") or ())
                entry["state"] = "stuck" if device in stuck else "copying"
                entry["waiting"] = [r for r in new if r not in isr]
            else:
                entry["state"] = "not moved"
                entry["why"] = f"another reassignment of it is in progress (to {rec['target']})"
        elif sorted(rec.get("replicas") or ()) != sorted(new):
            entry["state"] = "not moved"
            entry["why"] = (f"its replicas are {rec.get('replicas')}, not the planned {new} "
                            "(refused, or changed since the plan: run it again)")
        elif rec.get("leader") == new_leader:
            entry["state"] = "done"
        elif new_leader in (rec.get("isr") or ()):
            entry["state"] = "electing"
            cmds.append(["elect", device, rec["epoch"], new_leader])
        else:
            entry["state"] = "waiting"
            entry["waiting"] = [new_leader]
        out.append(entry)
    return out, cmds


FINISHED = ("done",)
FAILED = ("not moved", "gone")
