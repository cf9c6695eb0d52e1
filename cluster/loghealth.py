"""The health of the cluster's device logs, read from their Raft records: what ``meshmq cluster
status`` and the ``meshmq_logs_*`` gauges report, computed the same way on every node.

Why from the Raft records and not by asking each leader: the records are already in every
node's memory (the watch stream feeds every router and the node admin), so any node answers
without a round trip to the others, and a dead leader cannot hide its own logs. The states, as
Kafka's controller reports partitions (``UnderReplicatedPartitions``, ``OfflinePartitionsCount``):

* **under-replicated**: fewer in-sync replicas than replicas (a follower behind or down). Still
  writable while the ISR has ``min_insync_replicas`` members; one more loss away from offline.
  Replicas being *added* by a reassignment are not counted: they are not expected in sync yet
  (Kafka's KIP-352 excludes them the same way).
* **offline**: no leader, or a leader on a node that is not connected to the Raft leader: its
  publishes are refused and its reads fail until leadership moves (the ``failover``
  controller) or the node comes back.
* **reassigning** (``meshmq cluster rebalance``: cluster/rebalance.py): a move in progress,
  its added replicas fetching; finished by the controller once every target replica is in
  sync. Not a fault. **Stuck** when a replica being added is on a node that is not alive: the
  move waits for that node (it finishes by itself when the node returns and catches up, as
  Kafka's reassignment waits for a dead target broker); meanwhile the log keeps its old
  replicas and leader, so nothing is less safe than before the move.
* **lost**: a leader found its log shorter than the floor Raft kept for it (``raise_floor``),
  with no replica to fetch from: acknowledged records are gone (``mark_lost``). Never
  restarted at offset 0 (a reader holding offset 100 would silently read other messages).

Liveness of a node is the Raft leader's view (connected to it or not,
``MetadataServer.voters``); when no leader can say, it is unknown and no log is counted
offline for it (``liveness_known`` false): an unknown is not reported as a fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.settings import ClusterSettings, split_router_id

DEFAULT_LIMIT = 20  # devices listed per state: a status for a person, counts are always whole


def node_liveness(settings: ClusterSettings, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every configured node: its Raft address, whether the Raft leader sees it connected
    (True/False, None unknown), and whether its voter is the Raft leader."""
    voters = meta.get("voters") if isinstance(meta.get("voters"), dict) else {}
    alive = voters.get("alive") or {}
    leader = meta.get("leader")
    out = []
    for n in settings.nodes:
        addr = f"{n.host}:{n.raft_port}"
        out.append({"id": n.id, "raft": addr, "alive": alive.get(addr),
                    "raft_leader": addr == leader})
    return out


def is_stuck(rec: Mapping[str, Any], alive: Mapping[str, bool | None]) -> bool:
    """A reassignment waiting for a replica being added (not in the ISR yet) on a node that
    is not alive (``alive``: node id -> liveness, as ``node_liveness`` says)."""
    isr = set(rec.get("isr") or ())
    return "target" in rec and any(
        r not in isr and not alive.get(split_router_id(r)[0], False)
        for r in rec.get("adding") or ())


def log_health(records: Mapping[str, Mapping[str, Any]],
               liveness: list[dict[str, Any]] | None,
               limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Counts and the first ``limit`` devices (sorted) of each state (see the docstring)."""
    alive = {n["id"]: n["alive"] for n in liveness or ()}
    known = bool(alive) and all(v is not None for v in alive.values())
    under: list[str] = []
    offline: list[str] = []
    lost: list[str] = []
    moving: list[str] = []
    stuck: list[str] = []
    for device, rec in records.items():
        if rec.get("lost"):
            lost.append(device)
            continue
        adding = set(rec.get("adding") or ())
        if "target" in rec:
            moving.append(device)
            if known and is_stuck(rec, alive):
                stuck.append(device)
        isr = rec.get("isr") or []
        if len(isr) < len([r for r in rec.get("replicas") or () if r not in adding]):
            under.append(device)
        leader = rec.get("leader")
        if leader is None or (known and not alive.get(split_router_id(leader)[0], False)):
            offline.append(device)
    limit = max(0, limit)
    return {"logs": len(records), "liveness_known": known,
            "under_replicated": {"count": len(under), "devices": sorted(under)[:limit]},
            "offline": {"count": len(offline), "devices": sorted(offline)[:limit]},
            "lost": {"count": len(lost), "devices": sorted(lost)[:limit]},
            "reassigning": {"count": len(moving), "devices": sorted(moving)[:limit]},
            "reassign_stuck": {"count": len(stuck), "devices": sorted(stuck)[:limit]}}
