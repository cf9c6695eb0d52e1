"""The operations side's pure parts, without processes: the Raft commands that keep a log's
floor, mark it lost and move its replicas (cluster/metastate.py, applied exactly as every voter
applies them), and the rebalance plan (cluster/rebalance.py)."""

from __future__ import annotations

from collections import Counter

from cluster.loghealth import log_health
from cluster.metastate import MetadataState
from cluster.rebalance import commands, plan


def _state() -> MetadataState:
    s = MetadataState()
    assert s.apply(["create_log", "d", "a/0", ["a/0", "b/0", "c/0"]])[0]
    return s


def test_a_floor_only_rises_and_only_for_its_incarnation() -> None:
    s = _state()
    inc = s.logs["d"]["incarnation"]
    assert s.apply(["raise_floor", "d", inc, 10])[0]
    assert not s.apply(["raise_floor", "d", inc, 10])[0]  # a retry: already so
    applied, rec, change = s.apply(["raise_floor", "d", inc, 7])  # a late batch
    assert not applied and change is None and rec["floor"] == 10
    assert not s.apply(["raise_floor", "d", inc + 1, 50])[0]  # another incarnation's view
    assert s.apply(["raise_floor", "d", inc, 12])[1]["floor"] == 12


def test_a_log_is_marked_lost_only_below_the_floor_it_was_read_with() -> None:
    s = _state()
    inc = s.logs["d"]["incarnation"]
    s.apply(["raise_floor", "d", inc, 10])
    assert not s.apply(["mark_lost", "d", inc, 10, 10])[0]  # not short: nothing lost
    assert not s.apply(["mark_lost", "d", inc, 9, 0])[0]  # read from an older floor
    applied, rec, _ = s.apply(["mark_lost", "d", inc, 10, 3])
    assert applied and rec["lost"] == {"floor": 10, "end": 3, "leader": "a/0"}
    assert not s.apply(["mark_lost", "d", inc, 10, 3])[0]  # once
    health = log_health(s.logs, [{"id": n, "alive": True} for n in "abc"])
    assert health["lost"] == {"count": 1, "devices": ["d"]}
    assert health["offline"]["count"] == 0  # lost, reported as such, not also offline


def test_a_reassignment_adds_replicas_first_and_drops_the_old_ones_once_in_sync() -> None:
    s = _state()
    applied, rec, _ = s.apply(["reassign", "d", 0, ["d/0", "b/0", "c/0"]])
    assert applied
    assert rec["replicas"] == ["d/0", "b/0", "c/0", "a/0"]  # added, nothing dropped yet
    assert rec["isr"] == ["a/0", "b/0", "c/0"] and rec["leader"] == "a/0"
    assert rec["adding"] == ["d/0"] and rec["removing"] == ["a/0"]
    assert not s.apply(["reassign", "d", 0, ["b/0", "c/0", "d/0"]])[0]  # one at a time
    # not under-replicated while the new replica catches up (it is not expected in sync)
    assert log_health(s.logs, None)["under_replicated"]["count"] == 0
    applied, rec, _ = s.apply(["complete_reassign", "d", 0])
    assert not applied and rec["replicas"] == ["d/0", "b/0", "c/0", "a/0"], \
        "completed before the new replica was in sync: the only copy could be dropped"
    assert s.apply(["set_isr", "d", 0, 0, ["a/0", "b/0", "c/0", "d/0"]])[0]  # caught up
    applied, rec, _ = s.apply(["complete_reassign", "d", 0])
    assert applied
    assert rec["replicas"] == ["d/0", "b/0", "c/0"] and sorted(rec["isr"]) == ["b/0", "c/0",
                                                                                 "d/0"]
    assert rec["leader"] == "d/0" and rec["epoch"] == 1  # moved off a/0: a new epoch
    assert "target" not in rec and "adding" not in rec
    assert not s.apply(["complete_reassign", "d", 1])[0]  # nothing in progress


def _records(n_logs: int, nodes: int, rf: int) -> dict[str, dict]:
    recs = {}
    for i in range(n_logs):
        reps = [f"n{(i + k) % nodes}/0" for k in range(rf)]
        recs[f"dev{i:03d}"] = {"leader": reps[0], "replicas": reps, "isr": list(reps),
                               "epoch": 0, "isr_version": 0, "incarnation": i + 1}
    return recs


def test_the_plan_gives_a_new_node_a_fair_share_and_keeps_rf() -> None:
    recs = _records(30, 3, 2)
    nodes = ["n0", "n1", "n2", "n3"]  # n3 just added: holds and leads nothing
    moves = plan(recs, nodes)
    after = {d: list(r["replicas"]) for d, r in recs.items()}
    for m in moves:
        assert m["replicas"] == recs[m["device"]]["replicas"]
        after[m["device"]] = m["new_replicas"]
    held = Counter(r.split("/")[0] for reps in after.values() for r in reps)
    led = Counter(reps[0].split("/")[0] for reps in after.values())
    assert max(held.values()) - min(held[n] for n in nodes) <= 1, held
    assert max(led.values()) - min(led[n] for n in nodes) <= 1, led
    for reps in after.values():
        assert len(reps) == 2 and len({r.split("/")[0] for r in reps}) == 2, reps
    cmds = dict(commands(moves, recs))
    assert all(c[0] in ("reassign", "elect") for c in cmds.values()), cmds
    assert plan(recs, ["n0", "n1", "n2"]) == []  # already fair: nothing to do
    assert len(plan(recs, nodes, max_moves=3)) == 3


def test_the_plan_leaves_lost_and_moving_logs_alone() -> None:
    recs = _records(6, 2, 1)
    recs["dev000"]["lost"] = {"floor": 1, "end": 0, "leader": "n0/0"}
    recs["dev001"]["target"] = ["n1/0"]
    moves = plan(recs, ["n0", "n1", "n2"])
    assert {m["device"] for m in moves}.isdisjoint({"dev000", "dev001"})
