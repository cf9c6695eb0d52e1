"""cluster/placement.py: one answer to "who leads this device log", with change events, and
the replay cursors that ask it at every read (not once at subscribe)."""

from __future__ import annotations

import pytest

from broker.devicelogs import RemoteReplayCursor
from cluster.placement import NO_LEADER, UNKNOWN, Leader, Placement, StaleEpoch

ROUTERS = ["n0/0", "n0/1", "n1/0"]


def _device_led_by(placement: Placement, router: str) -> str:
    return next(f"d{k}" for k in range(10_000)
                if placement.leader_of(f"d{k}").router == router)


def test_static_layout_is_the_rendezvous_hash_at_epoch_zero():
    a, b = Placement(ROUTERS, "n0/0"), Placement(list(ROUTERS), "n1/0")
    devices = [f"d{k}" for k in range(300)]
    # every router computes the same leader with no coordination, spread over all of them
    assert [a.leader_of(d) for d in devices] == [b.leader_of(d) for d in devices]
    assert {a.leader_of(d).router for d in devices} == set(ROUTERS)
    assert {a.leader_of(d).epoch for d in devices} == {0}
    mine = _device_led_by(a, "n0/0")
    assert a.owner_of(mine) is None  # this router leads it
    assert b.owner_of(mine) == "n0/0"
    assert a.owner_of("#retained") is None  # a router's own state log, never another's


def test_a_leader_change_is_seen_at_once_and_fires_the_event():
    placement = Placement(ROUTERS, "n0/0")
    device = _device_led_by(placement, "n0/1")
    assert placement.owner_of(device) == "n0/1"  # asked (and cached) before the change
    seen: list[tuple[str, Leader, Leader]] = []
    placement.subscribe(lambda d, before, after: seen.append((d, before, after)))
    placement.update(device, "n1/0", 1)
    assert seen == [(device, Leader("n0/1", 0), Leader("n1/0", 1))]
    assert placement.leader_of(device) == Leader("n1/0", 1)
    assert placement.owner_of(device) == "n1/0"  # nothing kept past the change
    placement.update(device, "n0/0", 2)
    assert placement.owner_of(device) is None  # moved here
    with pytest.raises(StaleEpoch):
        placement.update(device, "n0/1", 2)  # fenced: not above the current epoch
    assert placement.leader_of(device) == Leader("n0/0", 2)
    assert len(seen) == 2


def test_an_unknown_leader_is_no_router():
    placement = Placement(ROUTERS, "n0/0")
    device = _device_led_by(placement, "n0/1")
    placement.update(device, None, 1)
    assert placement.leader_of(device) == Leader(None, 1)
    assert UNKNOWN.router is None
    # the broker's callable: a router id no link has, so a publish is refused, never stored
    assert placement.owner_of(device) == NO_LEADER


def test_a_failing_listener_does_not_hide_the_change_from_the_others():
    placement = Placement(ROUTERS, "n0/0")
    device = _device_led_by(placement, "n0/1")
    seen: list[str] = []

    def broken(*_: object) -> None:
        raise RuntimeError("listener bug")

    placement.subscribe(broken)
    unsubscribe = placement.subscribe(lambda d, *_: seen.append(d))
    placement.update(device, "n1/0", 1)
    assert seen == [device]
    unsubscribe()
    placement.update(device, "n0/1", 2)
    assert seen == [device]


def test_a_replay_cursor_reads_the_leader_at_each_read():
    """A cursor made while one router led the log reads from the new leader after a move
    (the read path, broker/replay.py, asks ``cursor.owner`` for every FETCH)."""
    placement = Placement(ROUTERS, "n0/0")
    device = _device_led_by(placement, "n0/1")
    cursor = RemoteReplayCursor(device, 5, placement.owner_of)
    assert cursor.owner == "n0/1"
    placement.update(device, "n1/0", 1)
    assert cursor.owner == "n1/0"
    placement.update(device, "n0/0", 2)
    assert cursor.owner is None  # led here now: read from the local store


def test_an_append_naming_an_epoch_of_the_same_leaders_unbroken_run_is_accepted() -> None:
    """A router re-elected after its process restarted (cluster/controller.py) leads at a new
    epoch; APPENDs its peers queued for the previous epoch are for the same log (no other
    leader in between: ``leader_since``), so they are not fenced; after another leader they
    are."""
    p = Placement(["a/0", "b/0"], me="a/0", static=False)
    p.learn("d", "a/0", 1)
    p.learn("d", "a/0", 3, since=1)
    assert p.leads("d", 3) and p.leads("d", 2) and p.leads("d", 1)
    assert not p.leads("d", 0) and not p.leads("d", 4)
    p.learn("d", "b/0", 4)
    p.learn("d", "a/0", 5)
    assert p.leads("d", 5) and not p.leads("d", 3)
