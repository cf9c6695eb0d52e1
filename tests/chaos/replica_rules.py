"""The checker's replica rules (issue 24): what every replica of every device log must hold
after a run, read from each router's disk once the nodes stopped cleanly
(``replicas.dump_nodes``) and from the Raft records (``replicas.newest_snapshot``). Pure
functions on the history JSON, like ``checker.py``, so each rule is unit-tested on logs
written with the store API (``test_checker.py``).

The rules, each stated so that a correct Kafka-style replication (ISR, high-water mark,
leader epochs, truncation of a diverged tail) can never trip it:

* **isr_replica_missing**: every member of a log's final ISR holds that log. With
  replication absent from the tree (followers do not fetch yet: ``history["replication"]``
  false) only the leader must; the others are counted (``replicas_not_built``), not failed.
* **acked_not_in_replica**: every acknowledged attempt is in every ISR replica's log exactly
  once, at the offset its PUBACK named (when it named one), and a device's acknowledged
  attempts are in publish (seq) order in each replica. An ack is only allowed once the
  record is below the high-water mark, i.e. on every ISR member (Kafka's acks=all), so a
  record acked at the leader's durable end but never fetched breaks this rule: the planted
  bug "ack before the high-water mark passes".
* **replica_diverged**: replicas agree byte-for-byte below the high-water mark: every ISR
  member holds exactly the leader's records below the leader's high-water mark (same
  offsets, same bytes); any other replica agrees with the leader on each offset both hold
  below its own high-water mark (what it was told is committed).
* **epoch_violations** ("no two leaders accepted writes for one log in one epoch"): replicas
  that know an epoch agree where it started; two replicas that hold one offset in one epoch
  hold the same bytes there (Raft's and Kafka's log matching property: one leader per
  epoch, so one writer per (epoch, offset)); no replica holds an epoch Raft never granted
  (above the Raft record's epoch).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Protocol

Key = tuple[str, int, int]


class _Result(Protocol):
    replica_violations: int
    epoch_violations: int
    info: dict[str, int]

    def find(self, kind: str, text: str) -> None: ...


def _parse(payload: str) -> Key | None:
    parts = payload.split("|")
    if len(parts) != 3:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


def _epoch_at(epochs: list[list[int]], starts: list[int], offset: int) -> int:
    """The epoch a replica's table assigns to ``offset`` (-1 before the first entry)."""
    i = bisect.bisect_right(starts, offset) - 1
    return epochs[i][0] if i >= 0 else -1


def check_replicas(history: dict[str, Any], res: _Result,
                   acked: dict[Key, int | None]) -> None:
    """Apply the module's rules. ``acked``: every acknowledged attempt -> the offset its
    PUBACK named (None when it named none)."""
    replicas: dict[str, dict[str, dict[str, Any]]] = history.get("replicas") or {}
    raft_logs: dict[str, dict[str, Any]] = (history.get("raft") or {}).get("logs") or {}
    built = bool(history.get("replication"))
    acked_by_device: dict[str, list[tuple[Key, int | None]]] = defaultdict(list)
    for key, off in sorted(acked.items(), key=lambda kv: kv[0]):  # examples in seq order
        acked_by_device[key[0]].append((key, off))
    not_built = 0
    checked = 0
    for device, rec in sorted(raft_logs.items()):
        leader = str(rec.get("leader"))
        isr = [str(r) for r in rec.get("isr") or [leader]]
        holders = {rid: logs[device] for rid, logs in replicas.items() if device in logs}
        required = isr if built else [leader]
        for rid in isr:
            if rid in holders:
                continue
            if rid in required:
                res.replica_violations += 1
                res.find("isr_replica_missing", f"{device}: ISR member {rid} holds no log "
                         f"(leader {leader}, epoch {rec.get('epoch')}, ISR {isr})")
            else:
                not_built += 1
        lead = holders.get(leader)
        if lead is None:
            continue
        checked += 1
        for rid in isr:
            log = holders.get(rid)
            if log is not None:
                _acked_in(device, rid, log, acked_by_device.get(device, []), res)
        _agree(device, leader, lead, holders, isr, res)
        _epochs(device, holders, rec, res)
    res.info["replicas_not_built"] = not_built
    res.info["replicated_logs_checked"] = checked


def _acked_in(device: str, rid: str, log: dict[str, Any],
              acked: list[tuple[Key, int | None]], res: _Result) -> None:
    where: dict[Key, list[int]] = defaultdict(list)
    for off, payload, _digest in log["records"]:
        key = _parse(payload)
        if key is not None:
            where[key].append(int(off))
    missing: list[str] = []
    twice: list[str] = []
    moved: list[str] = []
    placed: list[tuple[int, int, Key]] = []
    for key, acked_at in acked:
        offs = where.get(key, [])
        name = "|".join(map(str, key))
        if not offs:
            missing.append(f"{name}@{acked_at}")
            continue
        if len(offs) > 1:
            twice.append(f"{name} at {offs}")
        if acked_at is not None and acked_at >= 0 and acked_at not in offs:
            moved.append(f"{name} acked at {acked_at}, here at {offs}")
        placed.append((offs[0], key[1], key))
    placed.sort()
    order = [f"seq {s} @{o} after seq {placed[i - 1][1]} @{placed[i - 1][0]}"
             for i, (o, s, _k) in enumerate(placed) if i and s < placed[i - 1][1]]
    for what, items in (("missing", missing), ("stored twice", twice),
                        ("at another offset", moved), ("out of publish order", order)):
        if items:
            res.replica_violations += len(items)
            res.find("acked_not_in_replica", f"{device} on {rid}: {len(items)} acknowledged "
                     f"{what}, e.g. " + ", ".join(items[:3]))


def _agree(device: str, leader: str, lead: dict[str, Any], holders: dict[str, dict[str, Any]],
           isr: list[str], res: _Result) -> None:
    hw = int(lead["hw"])
    lead_rows = {int(o): d for o, _p, d in lead["records"]}
    for rid, log in holders.items():
        if rid == leader:
            continue
        rows = {int(o): d for o, _p, d in log["records"]}
        if rid in isr:
            # below the leader's mark an ISR member holds exactly what the leader holds
            lo = max(int(log["start"]), int(lead["start"]))
            want = {o: d for o, d in lead_rows.items() if lo <= o < hw}
            have = {o: d for o, d in rows.items() if lo <= o < hw}
        else:
            top = min(hw, int(log["hw"]))
            have = {o: d for o, d in rows.items() if o < top and o in lead_rows}
            want = {o: lead_rows[o] for o in have}
        bad = sorted(o for o in set(want) | set(have) if want.get(o) != have.get(o))
        if bad:
            res.replica_violations += len(bad)
            res.find("replica_diverged", f"{device}: {rid} differs from leader {leader} at "
                     f"{len(bad)} offsets below the high-water mark {hw}, e.g. {bad[:5]}")


def _epochs(device: str, holders: dict[str, dict[str, Any]], rec: dict[str, Any],
            res: _Result) -> None:
    raft_epoch = int(rec.get("epoch", 0))
    starts_of: dict[int, dict[str, int]] = defaultdict(dict)
    by_epoch_offset: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for rid, log in holders.items():
        epochs = sorted((list(e) for e in log.get("epochs") or []), key=lambda e: e[1])
        starts = [int(e[1]) for e in epochs]
        for e in epochs:
            starts_of[int(e[0])][rid] = int(e[1])
            if int(e[0]) > raft_epoch:
                res.epoch_violations += 1
                res.find("epoch_violations", f"{device}: {rid} holds epoch {e[0]} (from "
                         f"offset {e[1]}) above Raft's epoch {raft_epoch}")
        if not epochs:
            continue
        for off, _payload, digest in log["records"]:
            epoch = _epoch_at(epochs, starts, int(off))
            if epoch >= 0:
                by_epoch_offset[(epoch, int(off))][rid] = digest
    for epoch, where in sorted(starts_of.items()):
        if len(set(where.values())) > 1:
            res.epoch_violations += 1
            res.find("epoch_violations", f"{device}: epoch {epoch} starts at different "
                     f"offsets on different replicas: {dict(sorted(where.items()))}")
    clashes = sorted((e, o) for (e, o), by in by_epoch_offset.items()
                     if len(set(by.values())) > 1)
    if clashes:
        res.epoch_violations += len(clashes)
        res.find("epoch_violations", f"{device}: {len(clashes)} offsets written differently "
                 f"by two leaders in one epoch, e.g. (epoch, offset) {clashes[:5]}")
