"""The chaos checker's rules on crafted histories (no processes, milliseconds): each violation
kind is detected, and each legitimate history the module docstring allows is not flagged."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from commitlog.settings import LogSettings
from commitlog.store import LogStore
from tests.chaos.checker import check, payload_for, topic_matches
from tests.chaos.replicas import dump_nodes

T0 = 1000.0


def attempt(device: str, seq: int, n: int = 0, outcome: str = "ok", t: float | None = None,
            offset: int | None = None, reason: str | None = None) -> dict[str, Any]:
    t_send = T0 + 10 + seq if t is None else t
    return {"device": device, "seq": seq, "attempt": n, "node": 0, "t_send": t_send,
            "t_done": t_send + 0.01, "outcome": outcome, "offset": offset, "reason": reason,
            "rc": 0 if outcome == "ok" else None}


def rec(device: str, offset: int, seq: int, n: int = 0) -> list[Any]:
    return [offset, f"devices/{device}/t", payload_for(device, seq, n), T0 + 10 + seq]


def got(device: str, seq: int, n: int = 0, offset: int | None = None) -> list[Any]:
    return [device, seq, n, offset, T0 + 10 + seq]


def base() -> dict[str, Any]:
    """Two devices, three acked messages each, every subscriber kind receiving all of them."""
    attempts = [attempt(d, s, offset=s) for d in ("a", "b") for s in range(3)]
    log = {d: [rec(d, s, s) for s in range(3)] for d in ("a", "b")}
    every = [got(d, s) for d in ("a", "b") for s in range(3)]
    subs = [
        {"name": "p", "kind": "persistent", "filter": "devices/#", "intervals": [[T0, None, 0]],
         "received": list(every)},
        {"name": "l", "kind": "live", "filter": "devices/+/t", "intervals": [[T0, None, 1]],
         "received": list(every)},
        {"name": "r", "kind": "replay", "filter": "devices/a/#", "device": "a",
         "intervals": [[T0, None, 2]], "received": [got("a", s, offset=s) for s in range(3)]},
        {"name": "g0", "kind": "group", "filter": "$share/g/devices/#",
         "intervals": [[T0, None, 0]], "received": every[:3]},
        {"name": "g1", "kind": "group", "filter": "$share/g/devices/#",
         "intervals": [[T0, None, 1]], "received": every[3:]},
    ]
    return {"seed": 7, "attempts": attempts, "log": log, "subscribers": subs, "faults": []}


def deliver_log(h: dict[str, Any]) -> None:
    """Every subscriber received exactly what the log holds (group: member 0 all of it)."""
    for sub in h["subscribers"]:
        rows = [r for d, rs in h["log"].items() for r in rs
                if sub["kind"] != "replay" or d == sub["device"]]
        if sub["name"] == "g1":
            rows = []
        sub["received"] = []
        for off, _topic, payload, ts in rows:
            d, seq, n = payload.split("|")
            sub["received"].append([d, int(seq), int(n),
                                    off if sub["kind"] == "replay" else None, ts])


def counts(h: dict[str, Any]) -> tuple[int, int, int, int, int]:
    r = check(h)
    return r.lost, r.false_acks, r.dups_in_log, r.order_violations, r.missed_deliveries


def test_a_clean_history_passes_with_its_summary_line() -> None:
    r = check(base())
    assert r.ok, r.report()
    assert r.summary() == ("chaos: seed=7 faults=0 acked=6 lost=0 false_acks=0 dups_in_log=0 "
                           "order_violations=0 missed_deliveries=0 max_unavailable_s=0.0")


def test_false_ack_an_acked_message_never_stored_nor_seen() -> None:
    h = base()
    h["log"]["a"].pop()  # a|2 acked, not in the log
    for s in h["subscribers"]:
        s["received"] = [x for x in s["received"] if x[:2] != ["a", 2]]
    assert counts(h) == (0, 1, 0, 0, 0)
    assert "a|2|0" in check(h).findings["false_acks"][0]


def test_lost_an_acked_message_delivered_then_gone_from_the_log() -> None:
    h = base()
    h["log"]["a"].pop()
    assert counts(h)[:2] == (1, 0)


def test_lost_an_acked_offset_that_holds_another_message() -> None:
    h = base()
    h["attempts"][1]["offset"] = 2  # a|1 acked at 2, stored at 1; a|2 acked at 2 too
    r = check(h)
    assert r.lost == 1 and r.findings["offset_reused"], r.report()


def test_dup_in_log_one_attempt_stored_twice() -> None:
    h = base()
    h["log"]["a"].append(rec("a", 3, 2))
    assert counts(h) == (0, 0, 1, 0, 0)


def test_a_retried_write_stored_twice_is_no_dup() -> None:
    """a|3 attempt 0 failed (0x80, yet stored by the owner), attempt 1 acked: both in the log."""
    h = base()
    h["attempts"] += [attempt("a", 3, 0, "fail", reason="0x80"), attempt("a", 3, 1, offset=4)]
    h["log"]["a"] += [rec("a", 3, 3, 0), rec("a", 4, 3, 1)]
    deliver_log(h)
    r = check(h)
    assert r.ok and r.info["retry_copies"] == 1, r.report()


def test_order_violation_an_acked_seq_after_a_later_one() -> None:
    h = base()
    h["log"]["a"] = [rec("a", 0, 0), rec("a", 1, 2), rec("a", 2, 1)]
    for a in h["attempts"]:
        a["offset"] = None
    deliver_log(h)  # subscribers got it in log order: the violation is the log's alone
    assert counts(h) == (0, 0, 0, 1, 0)


def test_a_late_unknown_attempt_out_of_order_is_no_violation() -> None:
    """a|1 attempt 0 timed out (unknown), attempt 1 acked; the link later stored attempt 0
    after a|2: allowed (the client retried a write of unknown outcome)."""
    h = base()
    h["attempts"] += [attempt("a", 1, 1, offset=1)]
    h["attempts"][1].update(outcome="unknown", offset=None)
    h["log"]["a"] = [rec("a", 0, 0), rec("a", 1, 1, 1), rec("a", 2, 2), rec("a", 3, 1, 0)]
    h["attempts"][2]["offset"] = 2
    deliver_log(h)
    r = check(h)
    assert r.ok and r.info["late_copies"] == 1, r.report()


def test_an_unknown_or_failed_outcome_missing_from_the_log_is_no_loss() -> None:
    h = base()
    h["attempts"] += [attempt("a", 3, 0, "unknown"), attempt("a", 3, 1, "fail", reason="0x80")]
    assert check(h).ok


def test_missed_delivery_each_subscriber_kind() -> None:
    for name in ("p", "l", "r"):
        h = base()
        sub = next(s for s in h["subscribers"] if s["name"] == name)
        sub["received"] = [x for x in sub["received"] if x[:2] != ["a", 1]]
        assert counts(h) == (0, 0, 0, 0, 1), name


def test_missed_delivery_a_shared_group_owes_each_message_once() -> None:
    h = base()
    h["subscribers"][3]["received"].pop()  # nobody in the group got a|2
    assert counts(h)[4] == 1
    h = base()
    h["subscribers"][4]["received"].append(got("a", 0))  # two members got a|0: counted only
    r = check(h)
    assert r.ok and r.info["group_dups"] == 1, r.report()


def test_a_clean_session_is_owed_nothing_while_away_or_its_node_faulted() -> None:
    h = base()
    live = h["subscribers"][1]
    live["intervals"] = [[T0, T0 + 10.5, 1], [T0 + 12.5, None, 1]]  # away 10.5 .. 12.5
    live["received"] = [x for x in live["received"] if x[1] != 1]  # missed every seq 1
    assert check(h).ok, check(h).report()
    h2 = base()
    live = h2["subscribers"][1]
    live["received"] = [x for x in live["received"] if x[1] != 2]
    h2["faults"] = [{"kind": "sigstop", "node": 1, "peer": None, "start": T0 + 11.5,
                     "end": T0 + 13}]
    assert check(h2).ok  # its node was stopped from 11.5: seq 2 (sent at 12) is not owed
    h2["faults"][0]["node"] = 0  # a fault elsewhere excuses nothing
    assert check(h2).missed_deliveries == 2


def test_a_persistent_session_is_owed_what_was_stored_while_it_was_away() -> None:
    h = base()
    p = h["subscribers"][0]
    p["intervals"] = [[T0, T0 + 10.5, 0], [T0 + 12.5, None, 2]]
    p["received"] = [x for x in p["received"] if x[1] != 1]
    assert counts(h)[4] == 2


def test_a_session_the_broker_said_was_lost_is_owed_nothing_from_before() -> None:
    """Reconnected with Session Present 0: what was sent while it was away is not owed (the
    broker said so), what is sent after the new SUBACK is."""
    h = base()
    p = h["subscribers"][0]
    p["intervals"] = [[T0, T0 + 10.5, 0, False], [T0 + 12.5, None, 2, False]]
    p["received"] = [x for x in p["received"] if x[1] != 1]
    r = check(h)
    assert r.ok and r.info["sessions_lost"] == 1, r.report()
    p["received"] = [x for x in p["received"] if x[1] != 2]  # sent at 12 < 12.5 + grace
    assert check(h).ok
    h["attempts"] += [attempt("a", 3, t=T0 + 15), attempt("b", 3, t=T0 + 15)]
    h["log"]["a"].append(rec("a", 3, 3))
    h["log"]["b"].append(rec("b", 3, 3))
    for s in h["subscribers"][1:]:
        s["received"] += [got("a", 3, offset=3 if s["kind"] == "replay" else None)]
        if s["kind"] != "replay":
            s["received"] += [got("b", 3)]
    assert check(h).missed_deliveries == 2  # the persistent one got neither


def test_a_group_is_owed_only_while_every_member_is_healthy() -> None:
    h = base()
    h["faults"] = [{"kind": "partition", "node": 1, "peer": None, "start": T0 + 11.5,
                    "end": T0 + 13}]
    g1 = h["subscribers"][4]
    g1["received"] = [x for x in g1["received"] if x[1] != 2]  # b|2 went to g1's dying router
    for s in h["subscribers"]:
        if s["name"] == "l":
            s["received"] = [x for x in s["received"] if x[1] != 2]  # l is on node 1 too
    assert check(h).ok, check(h).report()
    h["faults"] = []
    assert check(h).missed_deliveries == 3  # l (a|2, b|2) and the group (b|2)


def test_duplicate_deliveries_are_counted_not_failed() -> None:
    h = base()
    h["subscribers"][0]["received"].append(got("a", 0))
    r = check(h)
    assert r.ok and r.info["delivery_dups"] == 1


def test_availability_per_fault_kind() -> None:
    h = base()
    h["attempts"] += [attempt("b", 3, 0, "unknown", t=T0 + 14), attempt("b", 3, 1, t=T0 + 24)]
    h["attempts"][-2]["reason"] = "timeout"
    h["log"]["b"].append(rec("b", 3, 3, 1))
    for s in h["subscribers"]:
        if s["kind"] in ("persistent", "live"):
            s["received"].append(got("b", 3, 1))
    h["subscribers"][4]["received"].append(got("b", 3, 1))
    h["faults"] = [{"kind": "kill-node", "node": 2, "peer": None, "start": T0 + 14,
                    "end": T0 + 20}]
    r = check(h)
    assert r.ok, r.report()
    assert 11 < r.max_unavailable_s < 13  # b|2 acked at 12.01, b|3 at 24.01
    assert r.per_fault_kind["kill-node"]["outcomes"] == {"timeout": 1}
    assert "kill-node" in r.report()


def test_topic_matching() -> None:
    assert topic_matches("devices/#", "devices/a/t")
    assert topic_matches("$share/g/devices/+/t", "devices/a/t")
    assert topic_matches("#", "devices/a/t")
    assert not topic_matches("devices/+", "devices/a/t")
    assert not topic_matches("devices/b/#", "devices/a/t")


def test_the_base_history_is_not_changed_by_checking() -> None:
    h = base()
    before = copy.deepcopy(h)
    check(h)
    assert h == before


def test_delivery_order_a_live_subscriber_gets_a_record_after_a_later_one() -> None:
    h = base()
    live = next(s for s in h["subscribers"] if s["name"] == "l")
    a0, a1 = got("a", 0), got("a", 1)
    a0[4], a1[4] = a1[4], a0[4]  # a1 arrives first, a0 after it
    live["received"] = [a1, a0, *[got("b", s) for s in range(3)], got("a", 2)]
    res = check(h)
    assert res.order_violations == 1, res.report()
    assert "l (live)" in res.findings["delivery_order"][0]


def test_delivery_order_duplicates_and_new_sessions_are_no_inversion() -> None:
    h = base()
    live = next(s for s in h["subscribers"] if s["name"] == "l")
    # a redelivered copy of an earlier record is a duplicate, not an inversion
    live["received"] = [*live["received"], [*got("a", 0)[:4], T0 + 50]]
    # a persistent session's inversions are counted, not failed
    p = next(s for s in h["subscribers"] if s["name"] == "p")
    late = got("a", 0)
    late[4] = T0 + 60
    p["received"] = [r for r in p["received"] if r[:3] != ["a", 0, 0]] + [late]
    res = check(h)
    assert res.order_violations == 0, res.report()
    assert res.info["persistent_order_inversions"] == 1, res.report()
    assert res.ok


# -- the replica rules (replica_rules.py), on logs written with the store API -----------------
# Three routers on three nodes hold device "a"'s log; each history is dumped from their
# stores by the same code a run uses (replicas.dump_nodes), then checked.

LEADER, F1, F2 = "n0/0", "n1/0", "n2/0"


def _store(root: Path, rid: str) -> LogStore:
    node, _, idx = rid.partition("/")
    return LogStore.open(str(root / node / f"router-{idx}" / "log"),
                         LogSettings(retention_ms=0))


def _append(st_: LogStore, seqs: list[tuple[int, int]]) -> None:
    """Leader-path appends of ``(seq, attempt)`` for device "a" (timestamps by offset, so
    two stores appending one message at one offset hold the same bytes)."""
    for seq, n in seqs:
        off = st_.log_end("a")
        st_.append("a", 1_000_000 + off, "devices/a/t", 1, None,
                   payload_for("a", seq, n).encode())
    st_.flush_sync_commit()


def _fetch(leader: LogStore, follower: LogStore, upto: int) -> None:
    """The follower fetches the leader's replica stream of "a" up to ``upto``."""
    while (follower.durable_end("a") if "a" in follower else 0) < upto:
        off = follower.durable_end("a") if "a" in follower else 0
        data, _ = leader.read_replica("a", off, upto - off,
                                      last_epoch=follower.latest_epoch("a"))
        if not data:
            break
        follower.append_follower("a", data, leader.latest_epoch("a"))
        follower.flush_sync_commit()


def replicated(root: Path, n: int = 10, fetched: tuple[int, int] = (10, 10),
               isr: tuple[str, ...] = (LEADER, F1, F2), epoch: int = 0,
               build: Any = None, replication: bool = True,
               raft_epoch: int | None = None) -> dict[str, Any]:
    """A history of ``n`` acked messages of device "a" (offset = seq) whose leader n0/0 led
    epoch ``epoch`` from offset 0; F1 and F2 fetched up to ``fetched``; the leader's
    high-water mark is the lowest end in ``isr``. ``build(stores)`` changes the stores
    before they are closed and dumped. Raft's record says ``raft_epoch`` (default
    ``epoch``)."""
    stores = {rid: _store(root, rid) for rid in (LEADER, F1, F2)}
    try:
        lead = stores[LEADER]
        lead.start_epoch("a", epoch)
        lead.flush_sync_commit()
        _append(lead, [(s, 0) for s in range(n)])
        for rid, upto in zip((F1, F2), fetched, strict=True):
            if upto:
                _fetch(lead, stores[rid], upto)
        ends = [stores[r].durable_end("a") for r in isr]
        lead.set_high_watermark("a", min(ends))
        for rid in (F1, F2):
            if "a" in stores[rid]:
                stores[rid].set_high_watermark("a", min(min(ends), stores[rid].durable_end("a")))
        if build is not None:
            build(stores)
        for st_ in stores.values():
            st_.flush_sync_commit()
    finally:
        for st_ in stores.values():
            st_.close()
    h = base()
    h["attempts"] = [attempt("a", s, offset=s) for s in range(n)]
    h["log"] = {"a": [rec("a", s, s) for s in range(n)]}
    h["subscribers"] = []
    h["replicas"] = dump_nodes([(node, root / node) for node in ("n0", "n1", "n2")])
    h["raft"] = {"index": 9, "logs": {"a": {"leader": LEADER, "isr": list(isr),
                                            "replicas": [LEADER, F1, F2],
                                            "epoch": epoch if raft_epoch is None else raft_epoch,
                                            "isr_version": 0, "incarnation": 1}}}
    h["replication"] = replication
    return h


def findings(h: dict[str, Any]) -> tuple[Any, dict[str, list[str]]]:
    r = check(h)
    return r, dict(r.findings)


def test_replicas_a_clean_replicated_log_passes_and_prints_its_line(tmp_path: Path) -> None:
    r, _ = findings(replicated(tmp_path))
    assert r.ok, r.report()
    assert r.info["replicated_logs_checked"] == 1
    assert "chaos replicas: logs=1 replica_violations=0 epoch_violations=0" in r.report()
    assert r.report().splitlines()[-1] == r.summary()  # the summary line stays last


def test_replicas_ack_before_the_high_water_mark_passes_is_caught(tmp_path: Path) -> None:
    """The planted bug of issue 24: the leader acked at its durable end (10) while both
    followers had fetched 7: three acked messages are on no follower."""
    r, f = findings(replicated(tmp_path, fetched=(7, 7)))
    assert r.replica_violations == 6, r.report()
    assert len(f["acked_not_in_replica"]) == 2
    assert "3 acknowledged missing" in f["acked_not_in_replica"][0], f


def test_replicas_an_isr_member_without_the_log(tmp_path: Path) -> None:
    r, f = findings(replicated(tmp_path, fetched=(10, 0)))
    assert r.replica_violations >= 1 and any(F2 in t for t in f["isr_replica_missing"]), f


def test_replicas_not_built_yet_only_the_leader_must_hold_the_log(tmp_path: Path) -> None:
    """Today's tree (no followers fetch): RF 3 placement with only the leader's log is no
    violation, only counted."""
    r, _ = findings(replicated(tmp_path, fetched=(0, 0), replication=False))
    assert r.ok, r.report()
    assert r.info["replicas_not_built"] == 2


def test_replicas_an_acked_message_twice_or_out_of_order_in_a_replica(tmp_path: Path) -> None:
    """F2 (not in the ISR, so only its own committed range is compared byte for byte) holds
    a|3 a second time and a|8 before a|7: both are acked, so F2 breaks the replica rule only
    once it is listed in the ISR."""
    def build(stores: dict[str, LogStore]) -> None:
        _fetch(stores[LEADER], stores[F2], 3)
        _append(stores[F2], [(3, 0), (3, 0), (4, 0), (5, 0), (6, 0), (8, 0), (7, 0), (9, 0)])

    r, f = findings(replicated(tmp_path, fetched=(10, 0), isr=(LEADER, F1, F2), build=build))
    text = " ".join(f["acked_not_in_replica"])
    assert "stored twice" in text and "out of publish order" in text, r.report()


def test_replicas_a_follower_differing_below_the_high_water_mark(tmp_path: Path) -> None:
    """F1 holds another message at offset 5 (a|5 attempt 1) below the mark."""
    def build(stores: dict[str, LogStore]) -> None:
        stores[F1].truncate("a", 5)
        stores[F1].flush_sync_commit()
        _append(stores[F1], [(5, 1)] + [(s, 0) for s in range(6, 10)])

    r, f = findings(replicated(tmp_path, build=build))
    assert any(F1 in t and "[5]" in t for t in f["replica_diverged"]), r.report()


def test_replicas_two_leaders_wrote_one_offset_in_one_epoch(tmp_path: Path) -> None:
    """A returning old leader that kept writing in the epoch the new leader also writes in
    (F2, out of the ISR, committed only up to 5): offset 5 of epoch 1 holds two messages."""
    def build(stores: dict[str, LogStore]) -> None:
        lead = stores[LEADER]
        lead.truncate("a", 5)
        lead.flush_sync_commit()
        lead.start_epoch("a", 1)
        lead.flush_sync_commit()
        _append(lead, [(s, 0) for s in range(5, 10)])
        lead.set_high_watermark("a", lead.durable_end("a"))
        f2 = stores[F2]
        f2.truncate("a", 5)
        f2.flush_sync_commit()
        f2.start_epoch("a", 1)
        f2.flush_sync_commit()
        _append(f2, [(5, 1)])
        f2.set_high_watermark("a", 5)

    r, f = findings(replicated(tmp_path, fetched=(10, 10), isr=(LEADER, F1), raft_epoch=1,
                               build=build))
    assert any("written differently by two leaders" in t and "(1, 5)" in t
               for t in f["epoch_violations"]), r.report()
    assert "replica_diverged" not in f, f  # F2's own mark is 5: its tail is not compared


def test_replicas_one_epoch_starting_at_two_offsets(tmp_path: Path) -> None:
    """F2 (out of the ISR) records epoch 1 from offset 7, the leader from 5."""
    def build(stores: dict[str, LogStore]) -> None:
        for rid, at in ((LEADER, 5), (F2, 7)):
            st_ = stores[rid]
            st_.truncate("a", at)
            st_.flush_sync_commit()
            st_.start_epoch("a", 1)
            st_.flush_sync_commit()
            _append(st_, [(s, 0) for s in range(at, 10)])
        stores[LEADER].set_high_watermark("a", 10)
        stores[F2].set_high_watermark("a", 5)

    r, f = findings(replicated(tmp_path, isr=(LEADER, F1), raft_epoch=1, build=build))
    assert any("epoch 1 starts at different offsets" in t for t in f["epoch_violations"]), \
        r.report()


def test_replicas_an_epoch_raft_never_granted(tmp_path: Path) -> None:
    """Every replica holds epoch 3 (the leader's, fetched), the Raft record says 2."""
    r, f = findings(replicated(tmp_path, epoch=3, raft_epoch=2))
    assert any("above Raft's epoch 2" in t for t in f["epoch_violations"]), r.report()
