"""``RaftPlacer`` (cluster/raftplace.py) against three real metadata processes: the placement
decisions a router makes on a new device's first publishes, where the real-node tests
(test_raft_placement.py) cannot pick the interleaving.

The placer runs in this test's event loop with a placement that has not heard the watch
stream yet (a router that has just started, or is slower than another router), so its
``create_log`` meets the compare-and-set:

* another router placed the log first: every held publish goes to that winner, in order,
  none is appended here;
* the held publishes are bounded (``cluster.placement_max_held``): past it refused at once;
* no Raft majority (two voters SIGSTOPped): refused as not stored after
  ``cluster.append_timeout``, never released as placed;
* the Raft leader killed -9 with proposals in flight: each is proposed again (the same
  compare-and-set) and placed once, none refused while a new leader comes within the timeout.

The publish path's two exits (forward to a router, append here) are recorded in lists: they
are the mesh's ``append_at``/``append_here``, which the real-node tests drive.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.broker import free_port

from broker.message import Message
from cluster.placement import Placement
from cluster.raftplace import PlacementHeldFull, PlacementRefused, RaftFeed, RaftPlacer
from cluster.settings import ClusterSettings, NodeAddress

pytestmark = pytest.mark.timeout(180)


def _voters_module() -> Any:
    """test_metadata_raft.py's real-voter helpers (Voter, leader_of_group, propose), loaded by
    path: the test directories are not packages."""
    path = Path(__file__).with_name("test_metadata_raft.py")
    spec = importlib.util.spec_from_file_location("_metadata_raft_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_V = _voters_module()
Voter, leader_of_group, propose = _V.Voter, _V.leader_of_group, _V.propose
ROUTERS = ["n0/0", "n1/0", "n2/0"]


@pytest.fixture()
def voters(tmp_path: Path) -> Iterator[list[Voter]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    vs = [Voter(tmp_path, i, addrs) for i in range(3)]
    try:
        for v in vs:
            v.start()
        leader_of_group(vs)
        yield vs
    finally:
        for v in vs:
            if v.proc is not None:
                os.kill(v.proc.pid, signal.SIGCONT)
                v.proc.kill()
                v.proc.wait(timeout=20)


class Exits:
    """Where the placer sends each released publish."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []
        self.here: list[tuple[str, bytes]] = []
        self.done: dict[bytes, tuple[BaseException | None, int]] = {}

    def send(self, owner: str, device: str, msg: Message, expiry: Any, done: Any) -> None:
        self.sent.append((owner, device, msg.payload))

    def append_here(self, device: str, msg: Message, expiry: Any, done: Any) -> None:
        self.here.append((device, msg.payload))

    def answer(self, payload: bytes) -> Any:
        return lambda exc, offset: self.done.__setitem__(payload, (exc, offset))


def _placer(voter: Voter, exits: Exits, *, timeout: float = 3.0,
            max_held: int = 100) -> RaftPlacer:
    settings = ClusterSettings(
        name="t", node_id="n0", routers=1, secret=b"s" * 16, placement="raft",
        nodes=tuple(NodeAddress(f"n{i}", "127.0.0.1", 1000 + i) for i in range(3)),
        append_timeout=timeout, placement_max_held=max_held)
    feed = RaftFeed(Placement(ROUTERS, "n0/0", static=False), voter.sock)  # not started
    return RaftPlacer(settings, "n0/0", feed, exits.send, exits.append_here)


def _msg(payload: bytes) -> Message:
    return Message("devices/d/t", payload, 1, False, None, None, "c")


async def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_held_publishes_go_to_the_router_that_placed_the_log_first(voters) -> None:
    # n1/0 placed "raced" already; this router has not heard it yet
    assert propose(voters[0], ["create_log", "raced", "n1/0", ["n1/0", "n0/0"]])[0][0]

    async def run() -> None:
        exits = Exits()
        placer = _placer(voters[0], exits)
        try:
            for p in (b"a", b"b", b"c"):
                placer.hold("raced", _msg(p), None, exits.answer(p))
            placer.hold("fresh", _msg(b"f"), None, exits.answer(b"f"))
            await _until(lambda: len(exits.sent) + len(exits.here) == 4)
            assert exits.sent == [("n1/0", "raced", b"a"), ("n1/0", "raced", b"b"),
                                  ("n1/0", "raced", b"c")]
            assert exits.here == [("fresh", b"f")]
            assert placer.placement.leader_of("raced").router == "n1/0"
            rec = placer.feed.records["fresh"]
            assert rec["leader"] == "n0/0" and rec["replicas"][0] == "n0/0"
            assert sorted(rec["replicas"]) == ROUTERS  # RF 3 on three nodes
            assert placer.held_count == 0 and not exits.done
        finally:
            await placer.close()
    asyncio.run(run())


def test_held_publishes_are_bounded(voters) -> None:
    async def run() -> None:
        exits = Exits()
        placer = _placer(voters[0], exits, max_held=2)
        try:
            for p in (b"1", b"2", b"3"):
                placer.hold("bounded", _msg(p), None, exits.answer(p))
            assert isinstance(exits.done.get(b"3", (None,))[0], PlacementHeldFull), exits.done
            assert "cluster.placement_max_held" in str(exits.done[b"3"][0])
            await _until(lambda: len(exits.here) == 2)
            assert exits.here == [("bounded", b"1"), ("bounded", b"2")]
            assert placer.stats["held_full"] == 1
        finally:
            await placer.close()
    asyncio.run(run())


def test_without_a_majority_held_publishes_are_refused_not_placed(voters) -> None:
    frozen = voters[1:]
    for v in frozen:
        os.kill(v.proc.pid, signal.SIGSTOP)
    try:
        async def run() -> None:
            exits = Exits()
            placer = _placer(voters[0], exits, timeout=2.0)
            try:
                placer.hold("alone", _msg(b"x"), None, exits.answer(b"x"))
                await _until(lambda: b"x" in exits.done or exits.here or exits.sent, 30)
                assert not exits.here and not exits.sent, (
                    f"a publish Raft never placed was released as placed: {exits.here}")
                exc, offset = exits.done[b"x"]
                assert isinstance(exc, PlacementRefused) and offset == -1, exits.done
                assert "could not be placed" in str(exc)
                assert not placer.placement.placed("alone")
            finally:
                await placer.close()
        asyncio.run(run())
    finally:
        for v in frozen:
            os.kill(v.proc.pid, signal.SIGCONT)
    # (the proposal may still commit once the voters resume: an empty log placed at n0/0,
    # where the next publish goes; the refused publish was never acked, which is what counts)


def test_placements_in_flight_when_the_raft_leader_dies_are_retried_not_lost(voters) -> None:
    leader = leader_of_group(voters)
    via = next(v for v in voters if v is not leader)  # this router's own voter survives
    devices = [f"inflight{k}" for k in range(30)]

    async def run() -> None:
        exits = Exits()
        placer = _placer(via, exits, timeout=10.0)
        try:
            for d in devices[:10]:  # connected, and proposing
                placer.hold(d, _msg(d.encode()), None, exits.answer(d.encode()))
            await _until(lambda: len(exits.here) == 10)
            for d in devices[10:]:
                placer.hold(d, _msg(d.encode()), None, exits.answer(d.encode()))
            leader.kill()  # kill -9 with these proposals in flight
            await _until(lambda: len(exits.here) + len(exits.done) == len(devices), 30)
            assert not exits.done, f"refused though a new Raft leader came within 10 s: " \
                                   f"{exits.done}"
            assert sorted(d for d, _ in exits.here) == sorted(devices)  # each once, here
            assert placer.stats["retries"] >= 1, "no proposal was in flight at the kill"
        finally:
            await placer.close()
    asyncio.run(run())
    logs = via.snapshot()["logs"]
    assert all(logs[d]["leader"] == "n0/0" for d in devices), logs
