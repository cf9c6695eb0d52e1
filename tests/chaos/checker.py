"""The history checker of the chaos suite: reads what clients saw and what the logs hold, and
says which of meshmq's promises broke. Pure functions on plain data (the history JSON the
runner writes), so its rules are unit-tested on crafted histories (``test_checker.py``).

The rules, and why each is free of false positives (Jepsen's Elle and Knossos take the same
stance: an outcome the client could not observe is never held against the system):

* **Identity.** Every PUBLISH a publisher sends is one *attempt*, payload
  ``"<device>|<seq>|<attempt>"``: a publisher sends its sequence one message at a time (window
  1), so its send order is its seq order, and a retry of seq *n* (after a failure reason code,
  a timeout or a lost connection) is a new attempt with its own identity. Each attempt goes out
  once, on a fresh clean connection (no QoS 1 session resend), so the same attempt at two
  offsets can only be a duplicate the broker made.
* **Outcomes.** ``ok`` (PUBACK reason < 0x80: the broker said "stored"), ``fail`` (reason >=
  0x80: may or may not be stored, e.g. a remote owner that stored it after the router gave up),
  ``unknown`` (no PUBACK: a lost connection or our timeout). Only ``ok`` obliges the broker.
* **lost** (L): an ``ok`` attempt missing from the final log although a subscriber received it
  (so it *was* stored, then lost), or present but not at the offset its PUBACK named (its
  position was reused or moved).
* **false_acks** (K): an ``ok`` attempt that is nowhere in the final log and that no subscriber
  ever received: nothing shows it was ever stored.
* **dups_in_log** (D): one attempt stored at more than one offset. Two *different* attempts of
  one seq both stored is legitimate (a client retried a write whose outcome it did not know,
  as Kafka's non-idempotent producer may): counted as ``retry_copies``, not failed.
* **order_violations** (O): an ``ok`` attempt of seq *s* stored after a record of a higher seq
  of the same device. The PUBACK of *s* came before seq *s+1* was sent, so nothing of a later
  seq may precede it. An attempt whose outcome was unknown or failed may land late (a link
  resends it after the client already retried elsewhere): ``late_copies``, not failed.
* **missed_deliveries** (M), per subscriber kind:
  - *persistent* (QoS 1, clean start 0, long session expiry): owed every stored record its
    filter matches whose attempt was sent at least ``GRACE_S`` after its first SUBACK: a
    persistent session holds its subscription across disconnects and moves with the client.
    A reconnect answered Session Present 0 (the broker said the session is gone) ends that
    span where its last connection (or the first fault on that node) ended; the next starts
    at the new SUBACK (listed as ``sessions_lost``, not failed).
  - *live* clean sessions (``live``, ``wildcard``, shared ``group`` members): owed a stored
    record only when the attempt's whole publish (send to PUBACK) fell inside one interval in
    which it held the subscription: from SUBACK + ``GRACE_S`` (routes reach the other routers
    after the SUBACK) to ``GRACE_S`` before the interval ended, the interval cut short at the
    first fault that hit the node it was connected to (its connection may be dead before the
    client notices). Records with an unknown or failed outcome have no known store time: not
    owed to clean sessions.
  - *replay* (``offset`` = earliest on one device, resuming from the last offset received +
    1): owed every record of its device's final log.
  - a shared group is owed what *every* member is owed (which member gets a message is the
    broker's choice, and one handed to a member whose connection is dying is lost with that
    clean session); any member's delivery satisfies it; a
    message delivered to two members is counted (``group_dups``), not failed (QoS 1 allows a
    redelivery to another member after a disconnect).
  Duplicate deliveries to one subscriber are counted, not failed.
* **Delivery order** (per subscriber, per device): the first copy of each record a subscriber
  gets must come after every record of the same device with a lower offset that it already
  got, within one session (a clean subscriber's connection; a persistent session's span, see
  below). An inversion of a *live*, *wildcard* or *replay* subscriber is an
  ``order_violation`` (O). A *persistent* session's inversions are counted
  (``persistent_order_inversions``), not failed, until the session registry of the
  replication issue lands: today, after a node is killed or frozen past the claim timeout, a
  client id can hold a session on two routers (the CONNACK says Session Present 1 when the
  older one moves in), and the older one delivers its own backlog, behind what the newer one
  already gave. Shared-group members are not checked (which member gets which message, and
  when a departing member's unacked messages go to another, is the broker's choice).
* **Replicas** (runs with ``--placement raft``: the history holds every router's logs, read
  from disk after a clean stop, and the Raft records): ``replica_violations`` and
  ``epoch_violations``, the rules of ``replica_rules.py`` (every acked message in every ISR
  replica once, at its offset, in order; replicas byte-identical below the high-water mark;
  one writer per epoch). Printed on a ``chaos replicas:`` line above the summary.
* **Availability** (reported, never failed): for each fault, the longest time any device went
  without a success PUBACK while its publisher kept trying, around the fault, and the outcomes
  publishers saw meanwhile (reason codes, ``timeout``, ``disconnected``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.replica_rules import check_replicas

GRACE_S = 2.0
# An availability gap (and the outcomes seen) is attributed to a fault when it overlaps
# [start, end + this]: short, so a sequential schedule does not blame the next fault's effects.
AVAIL_TAIL_S = 1.5

Key = tuple[str, int, int]  # (device, seq, attempt)


def payload_for(device: str, seq: int, attempt: int) -> str:
    return f"{device}|{seq}|{attempt}"


def parse_payload(payload: str) -> Key | None:
    parts = payload.split("|")
    if len(parts) != 3:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


def topic_matches(flt: str, topic: str) -> bool:
    """MQTT filter matching (``+``, ``#``; a ``$share/<group>/`` prefix is dropped)."""
    if flt.startswith("$share/"):
        flt = flt.split("/", 2)[2]
    fl, tl = flt.split("/"), topic.split("/")
    for i, part in enumerate(fl):
        if part == "#":
            return True
        if i >= len(tl) or (part != "+" and part != tl[i]):
            return False
    return len(fl) == len(tl)


@dataclass
class Result:
    seed: int = 0
    faults: int = 0
    acked: int = 0
    lost: int = 0
    false_acks: int = 0
    dups_in_log: int = 0
    order_violations: int = 0
    missed_deliveries: int = 0
    max_unavailable_s: float = 0.0
    # the replica rules (replica_rules.py), when the history holds replicas (raft placement)
    replica_violations: int = 0
    epoch_violations: int = 0
    replicas_checked: bool = False
    info: dict[str, int] = field(default_factory=dict)
    findings: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    per_fault_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_fault: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.false_acks or self.dups_in_log or self.order_violations
                    or self.missed_deliveries or self.replica_violations
                    or self.epoch_violations)

    def summary(self) -> str:
        return (f"chaos: seed={self.seed} faults={self.faults} acked={self.acked} "
                f"lost={self.lost} false_acks={self.false_acks} dups_in_log={self.dups_in_log} "
                f"order_violations={self.order_violations} "
                f"missed_deliveries={self.missed_deliveries} "
                f"max_unavailable_s={self.max_unavailable_s:.1f}")

    def replica_summary(self) -> str:
        """The replica rules' line (printed above the summary when they ran)."""
        return (f"chaos replicas: logs={self.info.get('replicated_logs_checked', 0)} "
                f"replica_violations={self.replica_violations} "
                f"epoch_violations={self.epoch_violations} "
                f"replicas_not_built={self.info.get('replicas_not_built', 0)}")

    def find(self, kind: str, text: str) -> None:
        self.findings[kind].append(text)

    def report(self, limit: int = 10) -> str:
        """The findings (the first ``limit`` of each kind), a table per fault kind, the
        informational counts, and the summary line last."""
        lines: list[str] = []
        for kind, items in sorted(self.findings.items()):
            lines.append(f"{kind}: {len(items)}")
            lines.extend(f"  {t}" for t in items[:limit])
            if len(items) > limit:
                lines.append(f"  ... {len(items) - limit} more (history.json, check.json)")
        if self.per_fault_kind:
            lines.append(f"{'fault kind':<16}{'count':>6}{'max_unavail_s':>15}"
                         f"{'mean_unavail_s':>16}  outcomes seen meanwhile")
            for kind, row in sorted(self.per_fault_kind.items()):
                outs = ", ".join(f"{k}={v}" for k, v in sorted(row["outcomes"].items())) or "-"
                lines.append(f"{kind:<16}{row['count']:>6}{row['max_unavailable_s']:>15.1f}"
                             f"{row['mean_unavailable_s']:>16.1f}  {outs}")
        if self.info:
            lines.append("info: " + " ".join(f"{k}={v}" for k, v in sorted(self.info.items())))
        if self.replicas_checked:
            lines.append(self.replica_summary())
        lines.append(self.summary())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary(), "ok": self.ok, "info": self.info,
                "replicas": self.replica_summary() if self.replicas_checked else None,
                "findings": dict(self.findings), "per_fault_kind": self.per_fault_kind,
                "per_fault": self.per_fault}


def _key_of(item: list[Any] | tuple[Any, ...]) -> Key:
    return str(item[0]), int(item[1]), int(item[2])


def check(history: dict[str, Any]) -> Result:
    """Apply every rule of the module docstring to one recorded history."""
    res = Result(seed=int(history.get("seed", 0)), faults=len(history.get("faults", [])))
    attempts: dict[Key, dict[str, Any]] = {}
    for a in history.get("attempts", []):
        attempts[(a["device"], int(a["seq"]), int(a["attempt"]))] = a

    # -- the final logs ------------------------------------------------------------------------
    offsets_of: dict[Key, list[int]] = defaultdict(list)
    log_keys: dict[str, list[tuple[int, Key | None]]] = {}
    for device, records in history.get("log", {}).items():
        rows: list[tuple[int, Key | None]] = []
        for rec in sorted(records, key=lambda r: int(r[0])):
            key = parse_payload(rec[2])
            rows.append((int(rec[0]), key))
            if key is None:
                res.find("foreign_records", f"{device}@{rec[0]}: payload {rec[2][:40]!r}")
                continue
            offsets_of[key].append(int(rec[0]))
        log_keys[device] = rows

    for key, offs in offsets_of.items():
        if len(offs) > 1:
            res.dups_in_log += len(offs) - 1
            res.find("dups_in_log", f"{payload_for(*key)} stored at offsets {offs}")
    per_seq: dict[tuple[str, int], set[int]] = defaultdict(set)
    for key in offsets_of:
        per_seq[(key[0], key[1])].add(key[2])
    res.info["retry_copies"] = sum(len(v) - 1 for v in per_seq.values() if len(v) > 1)

    # -- what subscribers received -------------------------------------------------------------
    delivered_anywhere: set[Key] = set()
    offset_claims: dict[tuple[str, int], set[Key]] = defaultdict(set)
    for sub in history.get("subscribers", []):
        for item in sub.get("received", []):
            key = _key_of(item)
            delivered_anywhere.add(key)
            if len(item) > 3 and item[3] is not None:
                offset_claims[(key[0], int(item[3]))].add(key)

    # -- acknowledged attempts -------------------------------------------------------------------
    ok_keys: set[Key] = set()
    for key, a in attempts.items():
        if a.get("outcome") != "ok":
            continue
        ok_keys.add(key)
        res.acked += 1
        where = offsets_of.get(key)
        acked_at = a.get("offset")
        if acked_at is not None and int(acked_at) < 0:
            # a success PUBACK whose offset property says -1: the router acknowledged without
            # knowing where it was stored (listed; the log decides whether it is there)
            res.find("acks_with_offset_-1", f"{payload_for(*key)} acked via node "
                     f"{a.get('node')} at t={a.get('t_done', 0):.1f}")
            acked_at = None
        if acked_at is not None:
            offset_claims[(key[0], int(acked_at))].add(key)
        if not where:
            if key in delivered_anywhere:
                res.lost += 1
                res.find("lost", f"{payload_for(*key)} acked (offset {acked_at}, via "
                         f"{a.get('node')}) and delivered, but not in the log")
            else:
                res.false_acks += 1
                res.find("false_acks", f"{payload_for(*key)} acked at t={a.get('t_done', 0):.1f}"
                         f" (offset {acked_at}, via {a.get('node')}) but never stored")
        elif acked_at is not None and int(acked_at) not in where:
            res.lost += 1
            res.find("lost", f"{payload_for(*key)} acked at offset {acked_at} but stored at "
                     f"{where}: the acked position holds something else")
    for (device, off), keys in sorted(offset_claims.items()):
        if len(keys) > 1:
            res.find("offset_reused", f"{device}@{off} claimed by "
                     + ", ".join(payload_for(*k) for k in sorted(keys)))

    # -- per-device order ------------------------------------------------------------------------
    late = 0
    for device, rows in log_keys.items():
        high = -1
        for off, key in rows:
            if key is None:
                continue
            if key[1] < high:
                if key in ok_keys:
                    res.order_violations += 1
                    res.find("order_violations", f"{device}@{off}: acked seq {key[1]} after "
                             f"seq {high}")
                else:
                    late += 1
            high = max(high, key[1])
    res.info["late_copies"] = late

    # -- deliveries ------------------------------------------------------------------------------
    _check_deliveries(history, res, attempts, offsets_of, log_keys)

    # -- replicas (raft placement runs: every router's log read from its disk) -------------------
    if "replicas" in history:
        res.replicas_checked = True
        acked_offsets: dict[Key, int | None] = {}
        for key in ok_keys:
            off = attempts[key].get("offset")
            acked_offsets[key] = None if off is None or int(off) < 0 else int(off)
        check_replicas(history, res, acked_offsets)

    # -- availability ----------------------------------------------------------------------------
    _availability(history, res, attempts)
    return res


def _fault_hits(fault: dict[str, Any], node: int) -> bool:
    nodes = {fault.get("node"), fault.get("peer")}
    return node in nodes and fault["kind"] != "disk-full"


def _windows(sub: dict[str, Any], faults: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """A clean session's owed windows: each interval it held the subscription, from SUBACK +
    GRACE_S, cut at the first fault on its node, ending GRACE_S before it ended."""
    out = []
    for iv in sub.get("intervals", []):
        lo, hi = iv[0] + GRACE_S, _clean_end(iv, faults) - GRACE_S
        if hi > lo:
            out.append((lo, hi))
    return out


def _check_deliveries(history: dict[str, Any], res: Result, attempts: dict[Key, dict[str, Any]],
                      offsets_of: dict[Key, list[int]],
                      log_keys: dict[str, list[tuple[int, Key | None]]]) -> None:
    faults = history.get("faults", [])
    stored: list[tuple[str, str, Key]] = []  # (device, topic, key)
    topic_of = history.get("topics", {})
    for device, rows in log_keys.items():
        for _off, key in rows:
            if key is not None:
                stored.append((device, topic_of.get(device, f"devices/{device}/t"), key))
    unique_stored = {k: (d, t) for d, t, k in stored}

    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dups = 0
    for sub in history.get("subscribers", []):
        got = Counter(_key_of(item) for item in sub.get("received", []))
        dups += sum(c - 1 for c in got.values() if c > 1)
        if sub["kind"] == "group":
            groups[sub["filter"]].append(sub)
            continue
        owed = _owed(sub, unique_stored, attempts, faults)
        missing = sorted(k for k in owed if k not in got)
        if missing:
            res.missed_deliveries += len(missing)
            res.find("missed_deliveries", f"{sub['name']} ({sub['kind']} {sub['filter']}): "
                     f"{len(missing)} of {len(owed)} owed, e.g. "
                     + ", ".join(payload_for(*k) for k in missing[:5]))
    group_dups = 0
    for flt, members in groups.items():
        # owed only while *every* member held the subscription on a healthy node: which
        # member's router a message goes to is the broker's round-robin choice, and one sent
        # to a member whose connection is dying is lost with it (a clean session, MQTT 4.8.2)
        owed_any: set[Key] = _owed(members[0], unique_stored, attempts, faults)
        got_any: Counter[Key] = Counter()
        for sub in members:
            owed_any &= _owed(sub, unique_stored, attempts, faults)
            got_any.update(set(_key_of(item) for item in sub.get("received", [])))
        group_dups += sum(c - 1 for c in got_any.values() if c > 1)
        missing = sorted(k for k in owed_any if k not in got_any)
        if missing:
            res.missed_deliveries += len(missing)
            res.find("missed_deliveries", f"group {flt} ({len(members)} members): "
                     f"{len(missing)} of {len(owed_any)} owed, e.g. "
                     + ", ".join(payload_for(*k) for k in missing[:5]))
    res.info["delivery_dups"] = dups
    lost_sessions = [f"{sub['name']} at t={iv[0]:.1f} (node {iv[2]})"
                     for sub in history.get("subscribers", []) if sub["kind"] == "persistent"
                     for iv in sub.get("intervals", [])[1:] if len(iv) > 3 and not iv[3]]
    res.info["sessions_lost"] = len(lost_sessions)
    for text in lost_sessions:
        res.find("sessions_lost", text)
    res.info["group_dups"] = group_dups
    _check_order(history, res, log_keys)


def _check_order(history: dict[str, Any], res: Result,
                 log_keys: dict[str, list[tuple[int, Key | None]]]) -> None:
    """The delivery-order rule of the module docstring."""
    offset_of: dict[Key, int] = {}
    for rows in log_keys.values():
        for off, key in rows:
            if key is not None:
                offset_of.setdefault(key, off)
    persistent_inversions = 0
    for sub in history.get("subscribers", []):
        kind = sub["kind"]
        if kind == "group":
            continue
        # a session starts at every connection of a clean subscriber, and at a reconnect
        # answered Session Present 0 for a persistent one
        starts = sorted(iv[0] for i, iv in enumerate(sub.get("intervals", []))
                        if kind != "persistent" or i == 0 or (len(iv) > 3 and not iv[3]))
        items = sub.get("received", [])  # in the order they arrived
        seen: set[Key] = set()
        highest: dict[str, int] = {}
        session = -1
        inversions: list[str] = []
        for item in items:
            t = item[4] if len(item) > 4 else 0
            now_in = sum(1 for st in starts if st <= t)
            if now_in != session:
                session, seen, highest = now_in, set(), {}
            key = _key_of(item)
            off = offset_of.get(key)
            if key in seen or off is None:
                continue
            seen.add(key)
            top = highest.get(key[0], -1)
            if off < top:
                inversions.append(f"{key[0]}@{off} after @{top}")
            else:
                highest[key[0]] = off
        if not inversions:
            continue
        if kind == "persistent":
            persistent_inversions += len(inversions)
            res.find("persistent_order_inversions",
                     f"{sub['name']}: {len(inversions)}, e.g. " + ", ".join(inversions[:3]))
        else:
            res.order_violations += len(inversions)
            res.find("delivery_order", f"{sub['name']} ({kind}): {len(inversions)} records "
                     f"first received after a later one, e.g. " + ", ".join(inversions[:3]))
    res.info["persistent_order_inversions"] = persistent_inversions


def _session_segments(sub: dict[str, Any],
                      faults: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """A persistent session's owed spans: from its first SUBACK (+ GRACE_S) on, across
    disconnects, until a reconnect whose CONNACK said Session Present 0 (the broker told the
    client its session was lost: listed as ``sessions_lost``). What that lost session had
    not delivered is gone with it, so the span ends as a clean session's window would: at
    the end of its last connection, or the first fault on that connection's node, less
    GRACE_S. The next span starts at the new SUBACK."""
    spans: list[tuple[float, float]] = []
    start: float | None = None
    prev: list[Any] | None = None
    for iv in sub.get("intervals", []):
        present = iv[3] if len(iv) > 3 else True
        if start is None:
            start = iv[0] + GRACE_S
        elif not present and prev is not None:
            spans.append((start, _clean_end(prev, faults) - GRACE_S))
            start = iv[0] + GRACE_S
        prev = iv
    if start is not None:
        spans.append((start, float("inf")))
    return spans


def _clean_end(iv: list[Any], faults: list[dict[str, Any]]) -> float:
    """When a connection's interval really ended: its end, or the first fault on its node."""
    t0, t1, node = iv[0], iv[1], iv[2]
    end = t1 if t1 is not None else float("inf")
    for f in faults:
        if _fault_hits(f, node) and f["start"] < end and (f.get("end") or end) > t0:
            end = min(end, f["start"])
    return end


def _owed(sub: dict[str, Any], stored: dict[Key, tuple[str, str]],
          attempts: dict[Key, dict[str, Any]], faults: list[dict[str, Any]]) -> set[Key]:
    kind, flt = sub["kind"], sub["filter"]
    if kind == "replay":
        return {k for k, (d, _t) in stored.items() if d == sub["device"]}
    matching = [k for k, (_d, t) in stored.items() if topic_matches(flt, t)]
    if kind == "persistent":
        segments = _session_segments(sub, faults)
        return {k for k in matching if k in attempts
                and any(lo <= attempts[k]["t_send"] <= hi for lo, hi in segments)}
    windows = _windows(sub, faults)
    out = set()
    for k in matching:
        a = attempts.get(k)
        if a is None or a.get("outcome") != "ok":
            continue
        t0, t1 = a["t_send"], a["t_done"]
        if any(lo <= t0 and t1 <= hi for lo, hi in windows):
            out.add(k)
    return out


def _availability(history: dict[str, Any], res: Result,
                  attempts: dict[Key, dict[str, Any]]) -> None:
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in attempts.values():
        by_device[a["device"]].append(a)
    gaps: dict[str, list[tuple[float, float]]] = {}
    for device, items in by_device.items():
        items.sort(key=lambda a: a["t_send"])
        spans = []
        last_ok = items[0]["t_send"] if items else 0.0
        for a in items:
            if a.get("outcome") == "ok":
                if a["t_done"] - last_ok > 0:
                    spans.append((last_ok, a["t_done"]))
                last_ok = a["t_done"]
        gaps[device] = spans
    kinds: dict[str, dict[str, Any]] = {}
    for f in history.get("faults", []):
        lo, hi = f["start"], (f.get("end") or f["start"]) + AVAIL_TAIL_S
        worst = 0.0
        for spans in gaps.values():
            for a, b in spans:
                if b > lo and a < hi:
                    worst = max(worst, b - a)
        outcomes: Counter[str] = Counter()
        for a in attempts.values():
            if lo <= a["t_send"] <= hi and a.get("outcome") != "ok":
                outcomes[a.get("reason") or a.get("outcome", "?")] += 1
        row = {"kind": f["kind"], "node": f.get("node"), "peer": f.get("peer"),
               "start": f["start"], "end": f.get("end"), "unavailable_s": round(worst, 2),
               "outcomes": dict(outcomes)}
        res.per_fault.append(row)
        agg = kinds.setdefault(f["kind"], {"count": 0, "max_unavailable_s": 0.0, "sum": 0.0,
                                           "outcomes": Counter()})
        agg["count"] += 1
        agg["sum"] += worst
        agg["max_unavailable_s"] = max(agg["max_unavailable_s"], worst)
        agg["outcomes"].update(outcomes)
        res.max_unavailable_s = max(res.max_unavailable_s, worst)
    for kind, agg in kinds.items():
        res.per_fault_kind[kind] = {
            "count": agg["count"], "max_unavailable_s": round(agg["max_unavailable_s"], 2),
            "mean_unavailable_s": round(agg["sum"] / agg["count"], 2),
            "outcomes": dict(agg["outcomes"])}


def check_file(path: str) -> Result:
    with open(path) as f:
        return check(json.load(f))
