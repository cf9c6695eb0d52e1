"""``RaftFeed`` (cluster/raftplace.py) as the replica manager's source of roles: which record is
newer, who leads by incarnation (the restart safety contract with the controller's ``elect``),
and a listener holding a placement change until the new leader's epoch has started. No
metadata process: records are fed to ``learn`` as the watch stream would."""

from __future__ import annotations

from cluster.placement import NO_LEADER, Placement
from cluster.raftplace import RaftFeed

ROUTERS = ["n0/0", "n1/0", "n2/0"]


def _feed(me: str = "n0/0", incarnation: str = "aa") -> RaftFeed:
    feed = RaftFeed(Placement(ROUTERS, me, static=False), "/nonexistent/meta.sock")
    feed.incarnation = incarnation
    return feed


def _rec(leader: str, epoch: int, isr_version: int = 0, **extra) -> dict:
    return {"leader": leader, "isr": list(ROUTERS), "replicas": list(ROUTERS), "epoch": epoch,
            "isr_version": isr_version, "incarnation": 1, **extra}


def test_a_record_naming_an_older_incarnation_of_this_router_leads_nothing_here() -> None:
    feed = _feed()
    feed.learn("d", _rec("n0/0", 3, leader_incarnation="old"))
    assert feed.placement.owner_of("d") == NO_LEADER  # a follower-in-waiting: no appends here
    feed.learn("d", _rec("n0/0", 4, leader_incarnation="aa"))  # the controller elected us
    assert feed.placement.owner_of("d") is None  # this router leads it
    other = _feed(me="n1/0")
    other.learn("d", _rec("n0/0", 3, leader_incarnation="old"))
    assert other.placement.owner_of("d") == "n0/0"  # elsewhere, the named router leads


def test_a_record_without_an_incarnation_is_led_by_the_router_it_names() -> None:
    feed = _feed()
    feed.learn("d", _rec("n0/0", 0))
    assert feed.placement.owner_of("d") is None


def test_the_same_epochs_later_isr_replaces_an_earlier_one_never_the_reverse() -> None:
    feed = _feed()
    heard: list[tuple[int, int]] = []
    feed.listeners.append(lambda d, rec: heard.append((rec["epoch"], rec["isr_version"])))
    feed.learn("d", _rec("n1/0", 0, 0))
    feed.learn("d", _rec("n1/0", 0, 2))
    feed.learn("d", _rec("n1/0", 0, 1))  # a late copy of an older ISR
    feed.learn("d", _rec("n1/0", 0, 2))  # the same record again
    assert heard == [(0, 0), (0, 2)]
    assert feed.records["d"]["isr_version"] == 2


def test_a_listener_holds_the_placement_until_it_releases_it() -> None:
    feed = _feed()
    feed.learn("d", _rec("n1/0", 0))
    feed.listeners.append(lambda d, rec: False)  # e.g. appends still pending here
    feed.learn("d", _rec("n0/0", 1))
    assert feed.placement.owner_of("d") == "n1/0"  # no publish taken here yet
    feed.learn("d", _rec("n0/0", 1))  # seen again meanwhile: still held
    assert feed.placement.owner_of("d") == "n1/0"
    feed.release("d")
    assert feed.placement.owner_of("d") is None
