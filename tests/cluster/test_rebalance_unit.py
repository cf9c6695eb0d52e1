"""Carrying out ``meshmq cluster rebalance`` (cluster/rebalance.py), sans-I/O, through the real
state machine (cluster/metastate.py): each router's role follows a reassignment at the same
epoch (``RaftFeed.learn``), the leader serves an added replica and takes it into the ISR once
caught up (``LeaderState``), the controller completes the move only when every target
replica is in sync on a live node, a move waiting on a dead node is reported stuck, and the
CLI's progress reading says where each move stands. The same on real nodes:
tests/cluster/test_rebalance.py."""

from __future__ import annotations

from cluster.controller import plan as controller_plan
from cluster.loghealth import log_health
from cluster.metastate import MetadataState
from cluster.placement import Placement
from cluster.raftplace import RaftFeed
from cluster.rebalance import commands, progress
from cluster.rebalance import plan as rebalance_plan
from cluster.replica import LeaderState

ROUTERS = ["n0/0", "n1/0", "n2/0", "n3/0"]
REGISTERED = {r: {"incarnation": r[:2], "node": r[:2], "kept_logs": True, "since": 0}
              for r in ROUTERS}
ALL = frozenset({"n0", "n1", "n2", "n3"})


def _state(leader: str = "n0/0", replicas: tuple[str, ...] = ("n0/0", "n1/0", "n2/0")
           ) -> MetadataState:
    st = MetadataState()
    for r in ROUTERS:
        st.apply(["register_router", r, r[:2], {"kept_logs": True}])
    assert st.apply(["create_log", "d", leader, list(replicas), leader[:2]])[0]
    return st


def _liveness(alive: dict[str, bool]) -> list[dict]:
    return [{"id": n, "alive": a} for n, a in alive.items()]


def test_a_reassignment_is_news_to_every_router_and_a_late_older_copy_is_not() -> None:
    st = _state()
    feed = RaftFeed(Placement(ROUTERS, "n3/0", static=False), "/nonexistent/meta.sock")
    heard: list[list[str]] = []
    feed.listeners.append(lambda d, rec: heard.append(list(rec["replicas"])))
    before = dict(st.logs["d"])
    feed.learn("d", before)
    # the plan moves n2's replica to n3: same epoch, same ISR version, other replicas
    applied, after, _ = st.apply(["reassign", "d", 0, ["n0/0", "n1/0", "n3/0"]])
    assert applied and after["epoch"] == 0 and after["isr_version"] == before["isr_version"]
    feed.learn("d", after)
    assert heard[-1] == ["n0/0", "n1/0", "n3/0", "n2/0"]  # n3/0 hears it must follow
    feed.learn("d", before)  # a proposal's answer from before the reassignment, arriving late
    assert feed.records["d"]["target"] == ["n0/0", "n1/0", "n3/0"] and len(heard) == 2


def test_the_leader_serves_an_added_replica_and_takes_it_into_the_isr_once_caught_up() -> None:
    lead = LeaderState("n0/0", 0, 0, {"n0/0", "n1/0", "n2/0"}, ["n0/0", "n1/0", "n2/0"], 2,
                       lag_max_s=2.0, started_at=0.0)
    for r in ("n1/0", "n2/0"):
        lead.on_fetch(r, 50, 0, 50, lambda e: (0, 50), now=1.0)
    assert lead.high_watermark == 50
    lead.replicas_changed(["n0/0", "n1/0", "n3/0", "n2/0"], now=1.0)
    assert lead.isr_change(1.0) is None  # added, not caught up: outside the ISR
    lead.on_fetch("n3/0", 0, -1, 50, lambda e: (0, 50), now=1.1)
    assert lead.high_watermark == 50  # a replica outside the ISR holds nothing back
    assert lead.isr_change(1.2) is None
    lead.on_fetch("n3/0", 50, 0, 50, lambda e: (0, 50), now=1.3)
    assert lead.isr_change(1.4) == {"n0/0", "n1/0", "n2/0", "n3/0"}
    lead.isr_changed({"n0/0", "n1/0", "n3/0"}, 50)  # completed: n2/0 dropped
    lead.replicas_changed(["n0/0", "n1/0", "n3/0"], now=1.5)
    assert "n2/0" not in lead.followers and lead.isr_change(1.6) is None


def test_the_controller_completes_a_move_only_with_every_target_in_sync_and_alive() -> None:
    st = _state()
    st.apply(["reassign", "d", 0, ["n3/0", "n1/0", "n0/0"]])  # n3/0 to lead it
    cmds, _ = controller_plan(st.logs, st.routers, ALL)
    assert cmds == []  # n3/0 not in the ISR yet
    rec = st.logs["d"]
    st.apply(["set_isr", "d", 0, rec["isr_version"], ["n0/0", "n1/0", "n2/0", "n3/0"]])
    cmds, _ = controller_plan(st.logs, st.routers, ALL - {"n3"})
    assert cmds == []  # in sync, but its node is dead: it would lead a log from a dead node
    cmds, _ = controller_plan(st.logs, st.routers, ALL)
    assert cmds == [["complete_reassign", "d", 0]]
    applied, rec, _ = st.apply(cmds[0])
    assert applied and rec["replicas"] == ["n3/0", "n1/0", "n0/0"]
    assert rec["leader"] == "n0/0" and rec["epoch"] == 0  # the leader is a target: it stays
    assert "target" not in rec and sorted(rec["isr"]) == ["n0/0", "n1/0", "n3/0"]
    assert controller_plan(st.logs, st.routers, ALL)[0] == []
    # the CLI then elects the planned leader (in sync now) and calls the move done
    move = {"device": "d", "new_leader": "n3/0", "new_replicas": ["n3/0", "n1/0", "n0/0"]}
    states, elects = progress([move], st.logs)
    assert states[0]["state"] == "electing" and elects == [["elect", "d", 0, "n3/0"]]
    assert st.apply(elects[0])[0]
    assert progress([move], st.logs) == ([{"device": "d", "state": "done"}], [])


def test_a_leader_not_in_the_target_hands_over_to_the_first_target_replica() -> None:
    st = _state()
    st.apply(["reassign", "d", 0, ["n3/0", "n1/0", "n2/0"]])
    rec = st.logs["d"]
    st.apply(["set_isr", "d", 0, rec["isr_version"], ["n0/0", "n1/0", "n2/0", "n3/0"]])
    cmds, _ = controller_plan(st.logs, st.routers, ALL)
    applied, rec, _ = st.apply(cmds[0])
    assert applied and rec["leader"] == "n3/0" and rec["epoch"] == 1
    assert rec["leader_incarnation"] == "n3"


def test_a_move_waiting_on_a_dead_node_is_stuck_and_progress_says_so() -> None:
    st = _state()
    st.apply(["reassign", "d", 0, ["n0/0", "n1/0", "n3/0"]])
    up = {"n0": True, "n1": True, "n2": True, "n3": True}
    health = log_health(st.logs, _liveness(up))
    assert health["reassigning"]["count"] == 1 and health["reassign_stuck"]["count"] == 0
    assert health["under_replicated"]["count"] == 0  # the added replica is not expected yet
    health = log_health(st.logs, _liveness(dict(up, n3=False)))
    assert health["reassign_stuck"] == {"count": 1, "devices": ["d"]}
    move = {"device": "d", "new_leader": "n0/0", "new_replicas": ["n0/0", "n1/0", "n3/0"]}
    assert progress([move], st.logs, {"d"})[0] == [
        {"device": "d", "state": "stuck", "waiting": ["n3/0"]}]
    assert progress([move], st.logs)[0][0]["state"] == "copying"


def test_a_move_refused_or_overtaken_is_not_moved() -> None:
    st = _state()
    moves = rebalance_plan(st.logs, ["n0", "n1", "n2", "n3"])
    assert moves == []  # one log of RF 3 over 4 nodes: already fair
    move = {"device": "d", "epoch": 0, "leader": "n0/0", "replicas": ["n0/0", "n1/0", "n2/0"],
            "new_leader": "n0/0", "new_replicas": ["n0/0", "n1/0", "n3/0"]}
    [(_, cmd)] = commands([move], st.logs)
    st.apply(["elect", "d", 0, "n1/0"])  # the epoch moved since the plan
    assert st.apply(cmd)[0] is False
    states, elects = progress([move], st.logs)
    assert states[0]["state"] == "not moved" and elects == []
    assert progress([dict(move, device="nope")], st.logs)[0][0]["state"] == "gone"


def test_a_cancelled_move_gives_the_old_replicas_back_and_the_added_one_stops_following() -> None:
    """``cancel_reassign`` (KIP-455's cancel): replicas and ISR without the added router, the
    leader and epoch kept, a newer ISR version (news to every router: the added one stops
    following); refused with no move in progress, at a stale epoch, and after completion."""
    st = _state()
    assert st.apply(["cancel_reassign", "d", 0])[0] is False  # nothing in progress
    st.apply(["reassign", "d", 0, ["n0/0", "n1/0", "n3/0"]])
    rec = st.logs["d"]
    # the added replica caught up and joined the ISR before the cancel
    st.apply(["set_isr", "d", 0, rec["isr_version"], ["n0/0", "n1/0", "n2/0", "n3/0"]])
    before = st.logs["d"]
    assert st.apply(["cancel_reassign", "d", 1])[0] is False  # stale epoch
    applied, rec, _ = st.apply(["cancel_reassign", "d", 0])
    assert applied, rec
    assert rec["replicas"] == ["n0/0", "n1/0", "n2/0"] and rec["isr"] == ["n0/0", "n1/0", "n2/0"]
    assert rec["leader"] == "n0/0" and rec["epoch"] == 0
    assert rec["isr_version"] == before["isr_version"] + 1
    assert "target" not in rec and "adding" not in rec and "removing" not in rec
    health = log_health(st.logs, _liveness({"n0": True, "n1": True, "n2": True, "n3": False}))
    assert health["reassign_stuck"]["count"] == 0 and health["under_replicated"]["count"] == 0
    feed = RaftFeed(Placement(ROUTERS, "n3/0", static=False), "/nonexistent")
    heard: list[dict] = []
    feed.listeners.append(lambda _d, r: heard.append(r) and None)
    feed.learn("d", before)
    feed.learn("d", rec)
    assert heard[-1] is rec and "n3/0" not in heard[-1]["replicas"]  # news: it stops following
    # a completed move cannot be cancelled (no target any more)
    st.apply(["reassign", "d", 0, ["n0/0", "n1/0", "n3/0"]])
    rec = st.logs["d"]
    st.apply(["set_isr", "d", 0, rec["isr_version"], ["n0/0", "n1/0", "n2/0", "n3/0"]])
    assert st.apply(["complete_reassign", "d", 0])[0]
    assert st.apply(["cancel_reassign", "d", 0])[0] is False
