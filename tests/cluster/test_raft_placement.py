"""Device logs placed by Raft (``cluster.placement = "raft"``, issue 24 step 2), on real nodes.

* A new device's log is led by the router its publisher is connected to (affinity), recorded in
  Raft with RF-1 followers on other nodes before the first PUBACK; every node's admin API and
  ``meshmq cluster status --device`` name that leader.
* A publisher of the same device on another node is forwarded to that leader: one log, offsets
  continue; two routers placing the same new devices at once make one log each (the
  compare-and-set's loser forwards to the winner), and a publish forwarded to a leader that
  has not heard of its placement yet waits for it there instead of being fenced.
* With the Raft majority frozen (two of three voters SIGSTOPped), a new device's publish is
  refused with a reason (v5 0x80 and a reason string; 3.1.1: the connection closes), never
  acked, while known devices keep working; once the voters resume it is placed.
* Placements survive a full restart of every node.
* Adding a node moves nothing: a 2-node cluster restarted with a third node keeps every log on
  its router and offsets continue (the static hash would move about a third of them).
* Logs on disk from static placement are registered where they are when the cluster switches
  to Raft placement; a log on a router's disk that Raft places on another router is reported
  (ERROR naming both, a metric) and not served there as leader.

Every device below is chosen so that the static hash places it on *another* router than the
one Raft must name: a placement that fell back to the hash is caught, never passed by luck.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all

from cluster.metaclient import MetadataClient, MetadataUnavailable
from cluster.placement import Placement
from meshmq.clustercli import render_status
from meshmq.metadata_proc import metadata_socket

pytestmark = pytest.mark.timeout(300)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


def _device(prefix: str, not_on: str, nodes: int = 3, also_not_on: str | None = None) -> str:
    """A new device name whose static hash leader (over ``nodes`` one-router nodes) is neither
    ``not_on`` nor ``also_not_on``."""
    hashed = Placement([f"n{i}/0" for i in range(nodes)])
    base = unique(prefix)
    for k in range(10_000):
        device = f"{base}x{k}"
        if hashed.leader_of(device).router not in (not_on, also_not_on):
            return device
    raise AssertionError("no device found")


def _offset(ack: R.Packet) -> int:
    props = dict(ack.properties.get(R.USER_PROPERTY, []))
    return int(props["offset"])


def _publish(client: R.RawClient, device: str, payload: bytes, pid: int) -> R.Packet:
    client.send(R.publish(f"devices/{device}/t", payload, qos=1, packet_id=pid,
                          version=client.version))
    return client.expect(R.PUBACK, timeout=60)


def _leader(cluster: Cluster, i: int, device: str) -> str | None:
    return cluster.status(i, device)["owner"]["router"]


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # failover out of the way (a lease and node timeout far longer than any test here): these
    # tests freeze voters to test placement; the controller moving logs off a frozen node and
    # the minority side refusing publishes are tests/cluster/test_failover.py's
    cluster = Cluster(tmp_path_factory.mktemp("raftplace"), n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 3.0, "leader_lease": 60.0,
                                             "node_timeout": 61.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _publisher(raw, cluster: Cluster, i: int) -> R.RawClient:
    pub = raw(cluster.nodes[i], version=5)
    pub.connect(unique(f"pub{i}"), properties=ACK_OFFSETS)
    return pub


def test_a_new_device_is_led_by_the_router_its_publisher_is_connected_to(
        trio: Cluster, raw) -> None:
    device = _device("aff", not_on="n1/0")
    before = io.StringIO()
    render_status(trio.status(0, device), before)  # Raft has no log for it: no hashed answer
    assert f"leader of device '{device}': none" in before.getvalue(), before.getvalue()
    pub = _publisher(raw, trio, 1)
    ack = _publish(pub, device, b"first", 1)
    assert ack.reason_code == 0, ack
    assert _offset(ack) == 0
    for i in range(3):  # every node's admin answers from Raft, and the same
        wait_for(lambda i=i: _leader(trio, i, device) == "n1/0", 30,
                 message=f"n{i} names n1/0 as the leader of {device}")
    owner = trio.status(2, device)["owner"]
    assert owner["epoch"] == 0
    assert owner["isr"][0] == "n1/0" and sorted(owner["isr"]) == ["n0/0", "n1/0", "n2/0"]
    out = io.StringIO()
    render_status(trio.status(0, device), out)
    assert f"leader of device '{device}': n1/0" in out.getvalue(), out.getvalue()
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[1], device)] == [b"first"]
    assert trio.nodes[1].metric("meshmq_placement_logs_placed_total", where="here") >= 1


def test_a_publisher_on_another_node_is_forwarded_to_the_leader(trio: Cluster, raw) -> None:
    device = _device("fwd", not_on="n0/0")
    first = _publisher(raw, trio, 0)
    assert _offset(_publish(first, device, b"a", 1)) == 0
    other = _publisher(raw, trio, 2)
    ack = _publish(other, device, b"b", 1)
    assert ack.reason_code == 0, ack
    assert _offset(ack) == 1  # one log: the offsets continue at the leader
    assert _offset(_publish(first, device, b"c", 2)) == 2
    assert _leader(trio, 2, device) == "n0/0"
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[0], device)] == [b"a", b"b", b"c"]
    # the fetch API at another node relays to the leader: the same log, not an empty one
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[2], device)] == [b"a", b"b", b"c"]


def test_two_routers_placing_the_same_new_devices_at_once_make_one_log_each(
        trio: Cluster, raw) -> None:
    devices = [_device(f"race{k}", not_on="") for k in range(40)]
    pubs = [_publisher(raw, trio, 0), _publisher(raw, trio, 2)]
    for pid, device in enumerate(devices, 1):  # both first publishes in flight together
        for pub, payload in zip(pubs, (b"from-n0", b"from-n2"), strict=True):
            pub.send(R.publish(f"devices/{device}/t", payload, qos=1, packet_id=pid,
                               version=5))
    acks = [{}, {}]
    for pub, got in zip(pubs, acks, strict=True):
        while len(got) < len(devices):
            ack = pub.expect(R.PUBACK, timeout=60)
            got[ack.packet_id] = ack
    for pid, device in enumerate(devices, 1):
        codes = [acks[i][pid].reason_code for i in range(2)]
        assert codes == [0, 0], f"{device}: {[acks[i][pid] for i in range(2)]}"
        offsets = sorted(_offset(acks[i][pid]) for i in range(2))
        assert offsets == [0, 1], f"{device}: two logs, or a lost append: offsets {offsets}"
        leader = _leader(trio, 1, device)
        assert leader in ("n0/0", "n2/0"), f"{device} placed at {leader}"
        node = trio.nodes[int(leader[1])]
        assert sorted(bytes(r.payload) for r in fetch_all(node, device)) == [b"from-n0",
                                                                             b"from-n2"]


def test_an_append_reaching_a_leader_before_its_placement_waits_for_it(
        trio: Cluster, raw) -> None:
    """n2 leads a log it has not heard of yet (its voter frozen; the other two commit): a
    publish at n0 is forwarded there and must wait for n2 to hear, not be fenced."""
    device = _device("late", not_on="n2/0")
    voter = trio.status(2)["metadata"]["pid"]
    os.kill(voter, signal.SIGSTOP)
    resume = threading.Timer(1.0, os.kill, (voter, signal.SIGCONT))
    try:
        sock = metadata_socket(trio.nodes[0].config["node"]["data_dir"])

        async def place() -> list:
            # n2's voter may have been the Raft leader: retried (the same compare-and-set)
            # while n0 and n1 elect another
            deadline = time.monotonic() + 30
            while True:
                client = MetadataClient(sock)
                await client.connect()
                try:
                    return list(await asyncio.wait_for(client.propose(
                        ["create_log", device, "n2/0", ["n2/0", "n0/0", "n1/0"]]), 30))
                except MetadataUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
                finally:
                    await client.close()
        applied, rec = asyncio.run(place())
        assert rec["leader"] == "n2/0", rec
        wait_for(lambda: _leader(trio, 0, device) == "n2/0", 30, message="n0 heard of it")
        pub = _publisher(raw, trio, 0)
        resume.start()
        ack = _publish(pub, device, b"late", 1)
    finally:
        resume.cancel()
        os.kill(voter, signal.SIGCONT)
    assert ack.reason_code == 0, f"refused at the leader that had not heard yet: {ack!r}"
    assert _offset(ack) == 0
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[2], device)] == [b"late"]


def test_a_replay_subscription_before_the_first_publish_gets_it_once(
        trio: Cluster, raw) -> None:
    device = _device("early", not_on="n1/0", also_not_on="n2/0")  # hashed to n0/0
    sub = raw(trio.nodes[2], version=5)
    sub.connect(unique("early-sub"))
    ack = sub.subscribe(f"devices/{device}/#", qos=1,
                        properties={R.USER_PROPERTY: [("offset", "earliest")]})
    assert ack.reason_codes == [1], f"an offset subscription of a log not placed yet: {ack!r}"
    trio.wait_routes(2)
    assert _publish(_publisher(raw, trio, 1), device, b"e0", 1).reason_code == 0
    got = sub.expect(R.PUBLISH, timeout=30)
    assert got.payload == b"e0"
    with pytest.raises(TimeoutError):  # once: not again from the replay cursor
        extra = sub.recv(timeout=3)
        if extra.type == R.PUBLISH:
            raise AssertionError(f"delivered twice: {extra!r}")
        raise TimeoutError


def test_without_a_raft_majority_a_new_device_is_refused_and_known_ones_work(
        trio: Cluster, raw) -> None:
    known = _device("known", not_on="n1/0")
    pub = _publisher(raw, trio, 0)
    assert _publish(_publisher(raw, trio, 1), known, b"k0", 1).reason_code == 0
    wait_for(lambda: _leader(trio, 0, known) == "n1/0", 30, message="n0 learned the placement")
    # connected before the freeze: a CONNECT itself needs a Raft commit (the session
    # registry's claim, cluster/sessionreg.py) and is refused without a majority
    old = raw(trio.nodes[0], version=4)
    old.connect(unique("v311"))
    voters = [trio.status(i)["metadata"]["pid"] for i in (1, 2)]
    for pid in voters:
        os.kill(pid, signal.SIGSTOP)
    try:
        new = _device("nomaj", not_on="n0/0")
        ack = _publish(pub, new, b"n0", 1)
        assert ack.reason_code == 0x80, f"a publish Raft could not place was answered {ack!r}"
        why = ack.properties.get(R.REASON_STRING, "")
        assert "placed" in why, f"the refusal does not say why: {ack!r}"
        # a 3.1.1 publisher has no negative PUBACK: its connection closes, nothing acked
        old.send(R.publish(f"devices/{new}/t", b"n1", qos=1, packet_id=1))
        with pytest.raises(ConnectionError):
            got = old.recv(timeout=60)
            raise AssertionError(f"a 3.1.1 publish Raft could not place got {got!r}")
        # a known device needs no Raft: forwarded to its leader and acked
        ack = _publish(pub, known, b"k1", 2)
        assert ack.reason_code == 0, ack
        assert _offset(ack) == 1
    finally:
        for pid in voters:
            os.kill(pid, signal.SIGCONT)
    # the majority back: the same device is placed (here, its publisher's router) and stored
    pid = 3
    for _ in range(20):  # each refusal takes up to cluster.append_timeout (3 s)
        ack = _publish(pub, new, b"n2", pid)
        if ack.reason_code == 0:
            break
        assert ack.reason_code == 0x80, ack
        pid += 1
    assert ack.reason_code == 0, f"still refused after the voters resumed: {ack!r}"
    wait_for(lambda: _leader(trio, 0, new) == "n0/0", 30, message="n0 names n0/0")
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[0], new)] == [b"n2"]


def test_placements_survive_a_full_restart(trio: Cluster, raw) -> None:
    device = _device("restart", not_on="n2/0")
    assert _offset(_publish(_publisher(raw, trio, 2), device, b"r0", 1)) == 0
    for node in trio.nodes:
        node.stop(timeout=20)
    trio.start()
    ack = _publish(_publisher(raw, trio, 0), device, b"r1", 1)
    assert ack.reason_code == 0, ack
    assert _offset(ack) == 1
    # node 0's admin answers from its voter, which learns the log when Raft replays it
    wait_for(lambda: _leader(trio, 0, device) == "n2/0", 30, message="n0 names n2/0")
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[2], device)] == [b"r0", b"r1"]


def test_adding_a_node_moves_no_log(tmp_path: Path, raw) -> None:
    two = Cluster(tmp_path, n=2, raft=True)
    placed: dict[str, str] = {}
    try:
        two.start()
        pubs = [_publisher(raw, two, i) for i in range(2)]
        for k in range(8):
            i = k % 2
            device = _device(f"grow{k}", not_on=f"n{i}/0", nodes=2)
            assert _offset(_publish(pubs[i], device, b"g0", 1)) == 0
            placed[device] = f"n{i}/0"
    finally:
        two.stop()
    hashed = Placement(["n0/0", "n1/0", "n2/0"])
    assert any(hashed.leader_of(d).router != r for d, r in placed.items())  # the hash moves some
    three = Cluster(tmp_path, n=3, raft=True)  # the same n0, n1 data dirs, and a new n2
    try:
        three.start()
        pub = _publisher(raw, three, 2)
        for pid, (device, router) in enumerate(placed.items(), 1):
            ack = _publish(pub, device, b"g1", pid)
            assert ack.reason_code == 0, ack
            assert _offset(ack) == 1, f"{device}'s log did not continue at {router}"
            wait_for(lambda d=device, r=router: _leader(three, 2, d) == r, 30,
                     message=f"n2 names {router} as the leader of {device}")
    finally:
        three.stop()


def test_logs_from_static_placement_are_registered_where_they_are(tmp_path: Path,
                                                                   raw) -> None:
    static = Cluster(tmp_path, n=2)
    hashed = Placement(["n0/0", "n1/0"])
    device = _device("reg", not_on="n0/0", nodes=2)
    assert hashed.leader_of(device).router == "n1/0"
    try:
        static.start()
        assert _offset(_publish(_publisher(raw, static, 0), device, b"s0", 1)) == 0
    finally:
        static.stop()
    raft = Cluster(tmp_path, n=2, raft=True)
    try:
        raft.start()
        # published at n0: without the registration n0 would place a new log of its own
        ack = _publish(_publisher(raw, raft, 0), device, b"s1", 1)
        assert ack.reason_code == 0, ack
        assert _offset(ack) == 1
        wait_for(lambda: _leader(raft, 0, device) == "n1/0", 30, message="n0 names n1/0")
    finally:
        raft.stop()


def test_a_log_on_disk_that_raft_places_elsewhere_is_reported_not_served(
        tmp_path: Path, raw) -> None:
    device = _device("dup", not_on="n0/0", nodes=2)
    # one replica: n0 must not hold a follower's copy of n1's log (replication, issue 24)
    first = Cluster(tmp_path, n=2, raft=True, overrides={"cluster": {"replication_factor": 1}})
    try:
        first.start()
        assert _offset(_publish(_publisher(raw, first, 1), device, b"a", 1)) == 0  # led by n1
    finally:
        first.stop()
    alone = Cluster(tmp_path, n=1)  # n0 alone, static placement: a second log on n0's disk
    try:
        alone.start()
        pub = _publisher(raw, alone, 0)
        assert [_offset(_publish(pub, device, p, i)) for i, p in enumerate((b"x", b"y"), 1)] \
            == [0, 1]
    finally:
        alone.stop()
    again = Cluster(tmp_path, n=2, raft=True)
    try:
        again.start()
        n0 = again.nodes[0]
        wait_for(lambda: n0.metric("meshmq_placement_conflicts_total") >= 1, 30,
                 message="n0 reports the log Raft places on n1/0")
        assert "Raft places it on router n1/0" in n0.log_text()
        ack = _publish(_publisher(raw, again, 0), device, b"c", 1)
        assert ack.reason_code == 0, ack
        assert _offset(ack) == 1, "n0 served its own copy of the log as leader"
        assert [bytes(r.payload) for r in fetch_all(again.nodes[1], device)] == [b"a", b"c"]
    finally:
        again.stop()


def test_with_two_routers_per_node_the_leader_is_the_publishers_router(tmp_path: Path,
                                                                       raw) -> None:
    pair = Cluster(tmp_path, n=2, routers=2, raft=True)
    try:
        pair.start()
        device = _device("two", not_on="")
        pub = _publisher(raw, pair, 1)  # lands on n1/0 or n1/1 (SO_REUSEPORT)
        assert _offset(_publish(pub, device, b"t0", 1)) == 0
        wait_for(lambda: (_leader(pair, 0, device) or "").startswith("n1/"), 30,
                 message="a router of n1 leads it")
        leader = _leader(pair, 0, device)
        owner = pair.status(0, device)["owner"]
        # RF 3 capped by 2 nodes: the leader and the same router index on the other node
        assert owner["isr"] == [leader, "n0/" + leader.rpartition("/")[2]], owner
        other = _publisher(raw, pair, 0)
        ack = _publish(other, device, b"t1", 1)
        assert ack.reason_code == 0, ack
        assert _offset(ack) == 1
    finally:
        pair.stop()
