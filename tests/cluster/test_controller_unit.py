"""The controller's decisions (cluster/controller.py) and the contact clock behind node liveness
and the leader lease (cluster/raftcontact.py), sans-I/O: what is elected, when a node counts as
dead, and when a voter last knew a majority counted it in. The same rules on real nodes:
tests/cluster/test_failover.py."""

from __future__ import annotations

import math

from cluster.controller import alive_nodes, plan
from cluster.raftcontact import AGE_KEY, RaftContact

ROUTERS = {r: {"incarnation": f"{r[0]}1", "node": r[0], "kept_logs": True}
           for r in ("a/0", "b/0", "c/0")}


def _log(leader: str | None, isr: list[str], epoch: int = 0, inc: str | None = None,
         replicas: list[str] | None = None) -> dict:
    rec = {"leader": leader, "isr": isr, "replicas": replicas or ["a/0", "b/0", "c/0"],
           "epoch": epoch, "isr_version": 0, "incarnation": 1}
    if inc is not None:
        rec["leader_incarnation"] = inc
    return rec


def test_a_dead_nodes_logs_go_to_a_live_isr_member_in_one_batch() -> None:
    logs = {f"d{k}": _log("a/0", ["a/0", "b/0", "c/0"], epoch=k, inc="a1") for k in range(1000)}
    logs["mine"] = _log("b/0", ["b/0", "a/0"], inc="b1")  # led by a live router: stays
    cmds, offline = plan(logs, ROUTERS, frozenset({"b", "c"}))
    assert offline == []
    assert len(cmds) == 1000  # every log of the dead node, in the one proposal
    for cmd in cmds:
        k = int(cmd[1][1:])
        # the first live ISR member in replica order; the dead one out of the ISR
        assert cmd == ["elect", f"d{k}", k, "b/0", ["b/0", "c/0"]], cmd


def test_only_isr_members_are_elected_never_a_replica_that_left_it() -> None:
    logs = {"d": _log("a/0", ["a/0", "c/0"], inc="a1")}  # b/0 is a replica, not in the ISR
    cmds, _ = plan(logs, ROUTERS, frozenset({"b", "c"}))
    assert cmds == [["elect", "d", 0, "c/0", ["c/0"]]]
    logs = {"d": _log("a/0", ["a/0"], inc="a1")}  # no live ISR member: offline, no election
    cmds, offline = plan(logs, ROUTERS, frozenset({"b", "c"}))
    assert cmds == [] and offline == ["d"]


def test_the_router_the_device_is_connected_to_is_preferred() -> None:
    logs = {"dev1": _log("a/0", ["a/0", "b/0", "c/0"], inc="a1")}
    sessions = {"dev1": {"router": "c/0", "epoch": 3}}
    cmds, _ = plan(logs, ROUTERS, frozenset({"b", "c"}), sessions)
    assert cmds == [["elect", "dev1", 0, "c/0", ["b/0", "c/0"]]]


def test_a_restarted_leader_is_elected_again_or_replaced() -> None:
    lost = dict(ROUTERS, **{"a/0": {"incarnation": "a2", "node": "a", "kept_logs": False}})
    logs = {"d": _log("a/0", ["a/0", "b/0"], epoch=2, inc="a1"),
            "new": _log("a/0", ["a/0", "b/0"], inc="a2"),  # elected as the new process: stays
            "old_build": _log("a/0", ["a/0", "b/0"])}  # no incarnation recorded: stays
    cmds, offline = plan(logs, lost, frozenset({"a", "b", "c"}))
    assert cmds == [["elect", "d", 2, "b/0", ["b/0"]]] and offline == []  # its disk was lost
    kept = dict(ROUTERS, **{"a/0": {"incarnation": "a2", "node": "a", "kept_logs": True}})
    sessions = {"d": {"router": "b/0", "epoch": 1}}
    cmds, offline = plan(logs, kept, frozenset({"a", "b", "c"}), sessions)
    # back with its logs: elected again (a new epoch records the new process), before the
    # router the device is connected to
    assert cmds == [["elect", "d", 2, "a/0", ["a/0", "b/0"]]] and offline == []


def test_a_restarted_leader_whose_recovery_quarantined_a_record_is_not_elected_again() -> None:
    """Review 7: its recovery found a corrupt record of the log (``damaged``): another ISR
    member leads and it leaves the ISR (it repairs as a follower); its other logs, and a log
    it is the last replica of, it leads again."""
    damaged = dict(ROUTERS, **{"a/0": {"incarnation": "a2", "node": "a", "kept_logs": True,
                                       "damaged": ["d", "alone"]}})
    logs = {"d": _log("a/0", ["a/0", "b/0", "c/0"], epoch=2, inc="a1"),
            "fine": _log("a/0", ["a/0", "b/0"], epoch=1, inc="a1"),
            "alone": _log("a/0", ["a/0"], epoch=3, inc="a1")}
    cmds, offline = plan(logs, damaged, frozenset({"a", "b", "c"}))
    assert sorted(cmds) == [["elect", "alone", 3, "a/0", ["a/0"]],
                            ["elect", "d", 2, "b/0", ["b/0", "c/0"]],
                            ["elect", "fine", 1, "a/0", ["a/0", "b/0"]]] and offline == []


def test_a_follower_restarted_since_the_isr_was_set_leaves_it_and_is_never_elected() -> None:
    routers = dict(ROUTERS, **{"c/0": {"incarnation": "c2", "node": "c", "kept_logs": True,
                                       "since": 9}})
    log = dict(_log("a/0", ["a/0", "b/0", "c/0"], epoch=3, inc="a1"), isr_at=5, isr_version=2)
    cmds, _ = plan({"d": log}, routers, frozenset({"a", "b", "c"}))
    assert cmds == [["set_isr", "d", 3, 2, ["a/0", "b/0"]]]  # its leader lets it back later
    cmds, _ = plan({"d": log}, routers, frozenset({"b", "c"}))  # the leader's node died
    assert cmds == [["elect", "d", 3, "b/0", ["b/0"]]]
    rejoined = dict(log, isr_at=10)  # its leader expanded the ISR after the registration
    assert plan({"d": rejoined}, routers, frozenset({"a", "b", "c"}))[0] == []


def test_a_restarted_sole_isr_member_leads_again_only_if_it_kept_its_logs() -> None:
    logs = {"d": _log("a/0", ["a/0"], epoch=4, inc="a1")}
    kept = dict(ROUTERS, **{"a/0": {"incarnation": "a2", "node": "a", "kept_logs": True}})
    cmds, offline = plan(logs, kept, frozenset({"a", "b", "c"}))
    assert cmds == [["elect", "d", 4, "a/0", ["a/0"]]] and offline == []
    lost = dict(ROUTERS, **{"a/0": {"incarnation": "a2", "node": "a", "kept_logs": False}})
    cmds, offline = plan(logs, lost, frozenset({"a", "b", "c"}))
    assert cmds == [] and offline == ["d"]  # its disk came back empty: never leads it again


def test_unregistered_routers_are_not_elected() -> None:
    routers = {k: v for k, v in ROUTERS.items() if k != "b/0"}
    cmds, _ = plan({"d": _log("a/0", ["a/0", "b/0", "c/0"], inc="a1")}, routers,
                   frozenset({"b", "c"}))
    assert cmds == [["elect", "d", 0, "c/0", ["c/0"]]]


def test_a_node_is_dead_only_after_node_timeout_counted_from_the_controllers_start() -> None:
    nodes = {"b": "h:2", "c": "h:3"}
    heard = {"h:2": 100.0, "h:3": 99.0}.get
    last = lambda a: heard(a, -math.inf)  # noqa: E731
    # c unheard for 1.0 s, node_timeout 1.5: alive (its routers' lease may still be valid)
    assert alive_nodes(100.0, nodes, "a", last, 0.0, 1.5) == {"a", "b", "c"}
    assert alive_nodes(100.6, nodes, "a", last, 0.0, 1.5) == {"a", "b"}
    # a controller that took over at 100.5 counts everyone heard then: no one dead sooner
    assert alive_nodes(101.9, nodes, "a", last, 100.5, 1.5) == {"a", "b", "c"}
    assert alive_nodes(102.0, nodes, "a", last, 100.5, 1.5) == {"a"}
    never = lambda a: -math.inf  # noqa: E731
    # never heard since this voter started: still starting, not dead (logs not moved off it)
    assert alive_nodes(50.0, nodes, "a", never, 4.5, 1.0) == {"a", "b", "c"}


def test_majority_contact_for_a_leader_and_for_a_follower() -> None:
    now = [10.0]
    c = RaftContact(3, clock=lambda: now[0])
    assert c.majority_at(leader=True) == -math.inf  # no answer yet: no lease
    c.received("b", {"type": "next_node_idx"})
    now[0] = 10.5
    c.received("c", {"type": "next_node_idx"})
    assert c.majority_at(leader=True) == 10.5  # one follower answering is a majority of 3
    assert c.age(leader=True) == 0.0
    five = RaftContact(5, clock=lambda: now[0])
    five.received("b", {"type": "next_node_idx"})
    now[0] = 11.0
    five.received("c", {"type": "next_node_idx"})
    assert five.majority_at(leader=True) == 10.5  # the second-newest of the answers
    five.received("d", {"type": "append_entries", AGE_KEY: 0.25})
    assert five.majority_at(leader=False) == 10.75  # the leader's majority time, not receipt
    five.received("d", {"type": "append_entries", AGE_KEY: math.inf})  # ignored
    assert five.majority_at(leader=False) == 10.75
    assert five.last_heard("d") == 11.0 and five.last_heard("zz") == -math.inf
    assert RaftContact(1).age(leader=True) == 0.0  # one voter is its own majority
