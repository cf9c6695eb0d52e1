"""Leadership follows the device (issue 24's affinity rule, cluster/affinity.py), on real
3-node Raft clusters (``placement = "raft"``, RF 3, acks=all):

* a device whose log n0 leads publishes at n1 (a follower, in the ISR) for longer than
  ``cluster.leader_affinity_stable``: Raft moves the leadership to n1 at a higher epoch
  (``meshmq_replica_leader_moves_total{reason="affinity"}`` counts it at n1); every publish is
  acknowledged (the move drains first: none refused), every acknowledged message is in the
  log once, in publish order, at contiguous offsets (replayed from offset 0 through node n0,
  which now reads it from n1), and a live subscriber on n2 gets every one in order;
* the same client bouncing between n1 and n0 (the leader) faster than the stable time never
  moves the leadership (each reconnect starts the stable time over);
* once moved, the device going on to n2 for longer than the stable time moves the leadership
  there only after ``cluster.leader_affinity_min_interval`` (6 s) from the first move;
* the devices a router tracks are capped (``leader_affinity_max_devices``): past it the oldest
  entry is dropped, counted and logged;
* ``leader_affinity_stable = 0`` turns the move off.

No timing assertions that load can break: the stable time is 2 s and the tests wait with
deadlines of a minute; "not before the minimum interval" cannot fail by being slow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import Publisher, Subscriber, log_position

pytestmark = pytest.mark.timeout(400)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}
STABLE = 2.0
MIN_INTERVAL = 6.0
# one tracked device per router: each test here forwards one device at a time through a
# router, and the eviction test needs the cap to be reached
AFFINITY = {"append_timeout": 5.0, "leader_affinity_stable": STABLE,
            "leader_affinity_min_interval": MIN_INTERVAL, "leader_affinity_max_devices": 1}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("affinity"), n=3, raft=True,
                      overrides={"cluster": AFFINITY})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _publisher(raw, cluster: Cluster, i: int, client_id: str | None = None) -> R.RawClient:
    pub = raw(cluster.nodes[i], version=5)
    ack = pub.connect(client_id or unique(f"pub{i}"), properties=ACK_OFFSETS)
    assert ack.reason_code == 0, ack
    return pub


def _publish(client: R.RawClient, device: str, payload: bytes, pid: int,
             dup: bool = False) -> R.Packet:
    client.send(R.publish(f"devices/{device}/t", payload, qos=1, packet_id=pid, dup=dup,
                          version=5))
    return client.expect(R.PUBACK, timeout=60)


def _leader(cluster: Cluster, i: int, device: str) -> tuple[str | None, int]:
    owner = cluster.status(i, device)["owner"]
    return owner.get("router"), int(owner.get("epoch", -1))


def _place(raw, cluster: Cluster, device: str) -> int:
    """The device's log placed with n0/0 leading (its first publish at n0); its epoch."""
    pub = _publisher(raw, cluster, 0)
    assert _publish(pub, device, b"m0", 1).reason_code == 0
    pub.close()
    for i in (1, 2):
        wait_for(lambda i=i: _leader(cluster, i, device)[0] == "n0/0", 60,
                 message=f"n{i} knows n0/0 leads {device}")
    wait_for(lambda: len(cluster.status(1, device)["owner"].get("isr") or ()) == 3, 60,
             message=f"every replica of {device} in the ISR")
    return _leader(cluster, 1, device)[1]


def _moves(cluster: Cluster, i: int) -> float:
    return cluster.nodes[i].metric("meshmq_replica_leader_moves_total", reason="affinity")


def test_leadership_moves_to_the_follower_the_device_stays_on_losing_nothing(
        trio: Cluster, raw) -> None:
    device = unique("aff")
    epoch = _place(raw, trio, device)
    moves = _moves(trio, 1)
    live = Subscriber(trio.nodes[2].host, trio.nodes[2].port, unique("live"))
    live.subscribe(f"devices/{device}/#", 1)
    trio.wait_routes(2)
    # a window of publishes in flight (APPENDs on their way to n0 when n1 decides to move)
    pub = Publisher(trio.nodes[1].host, trio.nodes[1].port, unique("pub1"), window=8,
                    timeout=60)
    sent: list[bytes] = [b"m0"]
    moved_at = None
    deadline = time.monotonic() + 60
    while moved_at is None or len(sent) < moved_at + 200:
        assert time.monotonic() < deadline, f"{device}'s leadership never moved to n1/0"
        pub.wait_window(deadline)
        while pub.has_room():  # the window full: 8 in flight whenever n1 decides
            payload = b"m%d" % len(sent)
            pub.send(f"devices/{device}/t", payload)
            sent.append(payload)
        if moved_at is None and len(sent) % 24 == 0 \
                and _leader(trio, 1, device)[0] == "n1/0":
            moved_at = len(sent)
    pub.drain(60)
    leader, new_epoch = _leader(trio, 1, device)
    assert leader == "n1/0" and new_epoch > epoch, (leader, epoch, new_epoch)
    assert _moves(trio, 1) == moves + 1
    # the move drained first: nothing was in flight at the old leader when its epoch ended,
    # so no publish was refused, and the log holds them in publish order
    refused = [(bytes(a.sent.payload), hex(a.reason_code)) for a in pub.acks if a.reason_code]
    assert not refused, f"{len(refused)} publishes refused across the move: {refused[:5]}"
    at = {bytes(a.sent.payload): a.offset for a in pub.acks}
    assert [at[p] for p in sent[1:]] == list(range(1, len(sent))), "acked offsets not in " \
        "publish order"
    pub.close()
    # every acked message in the log once, in order: replayed through n0 (a follower now)
    replay = Subscriber(trio.nodes[0].host, trio.nodes[0].port, unique("replay"))
    replay.subscribe(f"devices/{device}/#", 1, offset="earliest")
    got = replay.collect(len(sent), timeout=60)
    replay.expect_quiet(1.0)
    assert [bytes(m.payload) for m in got] == sent
    assert [log_position(m)[1] for m in got] == list(range(len(sent)))
    replay.close()
    # a live subscriber on the third node: every acked message, first deliveries in order
    live.collect(len(sent) - 1, timeout=60)  # m0 was published before it subscribed
    first: list[bytes] = []
    seen: set[bytes] = set()
    for m in live.messages:
        if bytes(m.payload) not in seen:
            seen.add(bytes(m.payload))
            first.append(bytes(m.payload))
    assert first == sent[1:], (first[:5], first[-5:])
    dups = len(live.messages) - len(first)
    print(f"\n[affinity] moved after {moved_at} publishes; {len(sent)} acked, none refused; "
          f"the live subscriber on n2 got each in order ({dups} duplicates)")
    live.close()


def test_a_device_bouncing_between_nodes_does_not_move_leadership(trio: Cluster,
                                                                     raw) -> None:
    device = unique("flap")
    epoch = _place(raw, trio, device)
    moves = _moves(trio, 1)
    client_id = unique("flapper")
    k = 0
    until = time.monotonic() + 4 * STABLE
    while time.monotonic() < until:
        for node in (1, 0):  # a connection never lasts the stable time
            pub = _publisher(raw, trio, node, client_id)
            phase = time.monotonic() + STABLE / 2
            while time.monotonic() < phase:
                k += 1
                assert _publish(pub, device, b"f%d" % k, k % 60000 + 1).reason_code == 0
                time.sleep(0.05)
            pub.send(R.disconnect())
            pub.close()
    time.sleep(0.5)
    assert _leader(trio, 1, device) == ("n0/0", epoch)
    assert _leader(trio, 0, device) == ("n0/0", epoch)
    assert _moves(trio, 1) == moves


def _stream(pub: Publisher, device: str, sent: list[bytes], until) -> None:
    """Keep the publisher's window full until ``until()`` is true (checked every 24)."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the condition never came"
        pub.wait_window(deadline)
        while pub.has_room():
            payload = b"m%d" % len(sent)
            pub.send(f"devices/{device}/t", payload)
            sent.append(payload)
        if len(sent) % 24 == 0 and until():
            return


def test_a_log_moves_again_only_after_the_minimum_interval(trio: Cluster, raw) -> None:
    device = unique("twice")
    _place(raw, trio, device)
    sent: list[bytes] = [b"m0"]
    pub = Publisher(trio.nodes[1].host, trio.nodes[1].port, unique("pub1"), window=8,
                    timeout=60)
    _stream(pub, device, sent, lambda: _leader(trio, 1, device)[0] == "n1/0")
    moved = time.monotonic()  # n2 learned the move no later than this
    pub.drain(60)
    pub.close()
    # the device goes on to n2 (also an ISR member) for longer than the stable time: no move
    # back before the minimum interval from the first one, then it moves
    pub2 = Publisher(trio.nodes[2].host, trio.nodes[2].port, unique("pub2"), window=8,
                     timeout=60)
    early: list[tuple[float, str | None]] = []

    def at_n2() -> bool:
        leader = _leader(trio, 2, device)[0]
        if leader == "n2/0" and time.monotonic() - moved < MIN_INTERVAL - 0.5:
            early.append((time.monotonic() - moved, leader))
        return leader == "n2/0"
    _stream(pub2, device, sent, at_n2)
    print(f"\n[affinity] moved n0 -> n1, then n1 -> n2 {time.monotonic() - moved:.1f} s later "
          f"(minimum interval {MIN_INTERVAL} s)")
    assert not early, f"moved again {early[0][0]:.1f} s after the first move (minimum " \
        f"interval {MIN_INTERVAL} s)"
    pub2.drain(60)
    refused = [hex(a.reason_code) for a in pub.acks + pub2.acks if a.reason_code]
    assert not refused, refused
    at = {bytes(a.sent.payload): a.offset for a in pub.acks + pub2.acks}
    assert [at[p] for p in sent[1:]] == list(range(1, len(sent)))
    pub2.close()


def test_tracked_devices_are_capped(trio: Cluster, raw) -> None:
    first, second = unique("capa"), unique("capb")
    _place(raw, trio, first)
    _place(raw, trio, second)
    evicted = trio.nodes[1].metric("meshmq_leader_affinity_events_total", event="evicted")
    pub = _publisher(raw, trio, 1)
    for k, device in enumerate((first, second, first, second)):
        assert _publish(pub, device, b"c%d" % k, k + 1).reason_code == 0
    # the cap is 1: each device's first publish here dropped the other's entry
    assert trio.nodes[1].metric("meshmq_leader_affinity_devices") == 1
    assert trio.nodes[1].metric("meshmq_leader_affinity_events_total",
                                event="evicted") >= evicted + 3
    pub.close()


def test_stable_time_zero_turns_the_move_off(tmp_path: Path, raw) -> None:
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={"cluster": {
        "append_timeout": 5.0, "leader_affinity_stable": 0, "leader_affinity_min_interval": 0}})
    try:
        cluster.start()
        device = unique("off")
        epoch = _place(raw, cluster, device)
        pub = _publisher(raw, cluster, 1)
        for k in range(1, 41):
            assert _publish(pub, device, b"o%d" % k, k).reason_code == 0
            time.sleep(0.05)
        time.sleep(0.5)
        assert _leader(cluster, 1, device) == ("n0/0", epoch)
        assert _moves(cluster, 1) == 0
    finally:
        cluster.stop()
