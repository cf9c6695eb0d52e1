"""The chaos checker's rules on crafted histories (no processes, milliseconds): each violation
kind is detected, and each legitimate history the module docstring allows is not flagged."""

from __future__ import annotations

import copy
from typing import Any

from tests.chaos.checker import check, payload_for, topic_matches

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
