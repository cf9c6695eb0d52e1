"""A slow or offline subscriber at a router that does not own the device log is a lag, never a
drop (issue 18's promise, across the mesh): its session falls behind onto the owner's log and
reads it back over the link (FETCH/RECORDS), and the positions it holds survive a restart of
its router.

Two nodes, a queue bound of 20 messages so that a burst of hundreds overflows it at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, ClientFactory, PacketTypes, props, unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

_BURST = 600


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("lag"), n=2,
                      overrides={"mqtt": {"max_queued_messages": 20}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _persistent(clients: ClientFactory, node, cid: str, **extra):
    return clients.connected(node, cid, protocol=V5, clean=False, connect={
        "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=3600, **extra)})


def _burst(clients: ClientFactory, node, topic: str) -> None:
    pub = clients.connected(node, protocol=V5)
    for i in range(_BURST - 1):
        pub.publish(topic, f"b{i}", 1, wait=False)
    pub.publish(topic, f"b{_BURST - 1}", 1)


def _queue_drops(node) -> float:
    return node.metric("meshmq_messages_dropped_total", reason="queue_full")


def test_a_stalled_subscriber_at_a_non_owner_reads_the_burst_back_from_the_owner(
        pair: Cluster, clients: ClientFactory) -> None:
    """The subscriber stops reading while 600 messages arrive from the owner: the window and
    the queue fill, its session falls behind, and when it reads again it gets every message
    once, in order, with nothing dropped at its router."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("slow"))
    sub = clients.connected(n0, protocol=V5, connect={
        "properties": props(PacketTypes.CONNECT, ReceiveMaximum=4)})
    sub.subscribe(f"devices/{device}/#", 1)
    pair.wait_routes(0, 1)
    drops = _queue_drops(n0)
    sub.stop_loop_only()  # stops reading: its socket and then the broker's window fill
    _burst(clients, n1, f"devices/{device}/t")
    sub.mqtt.loop_start()
    got = sub.expect_messages(_BURST, timeout=60)
    assert [m.payload.decode() for m in got] == [f"b{i}" for i in range(_BURST)]
    sub.expect_no_message(0.5)
    assert _queue_drops(n0) == drops


def test_an_offline_session_at_a_non_owner_keeps_its_position_across_a_restart(
        pair: Cluster, clients: ClientFactory) -> None:
    """Offline at node 0 while 600 messages of a log node 1 owns arrive: the session holds a
    position in that log, not copies; node 0 restarts (SIGTERM); the client comes back and
    reads all of them from the owner, once and in order."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("off"))
    cid = unique("offline")
    first = _persistent(clients, n0, cid)
    first.subscribe(f"devices/{device}/#", 1)
    pair.wait_routes(0, 1)
    first.disconnect()
    _burst(clients, n1, f"devices/{device}/t")
    n0.stop(timeout=20)
    n0.start(wait=False)
    n0.wait_ready()
    pair.wait_links_up()
    again = _persistent(clients, n0, cid)
    assert again.session_present
    got = again.expect_messages(_BURST, timeout=60)
    assert [m.payload.decode() for m in got] == [f"b{i}" for i in range(_BURST)]
    again.expect_no_message(0.5)
    assert _queue_drops(n0) == 0


def test_messages_in_flight_from_the_owners_log_survive_a_restart_of_a_non_owner(
        pair: Cluster, clients: ClientFactory) -> None:
    """A session at node 0 reading a burst back from node 1's log drops off mid-read with
    messages in its window, unacknowledged; node 0 restarts. Those messages were read over
    the link, so they are kept as copies (node 0 cannot read them back from a log it does not
    have): every message of the burst reaches the client, in order after the resends."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("infl"))
    cid = unique("inflight")
    first = _persistent(clients, n0, cid)
    first.subscribe(f"devices/{device}/#", 1)
    pair.wait_routes(0, 1)
    first.disconnect()
    _burst(clients, n1, f"devices/{device}/t")
    second = _persistent(clients, n0, cid, ReceiveMaximum=10)
    got = [m.payload.decode() for m in second.expect_messages(50, timeout=30)]
    second.abort()  # mid-read: its window holds unacknowledged messages
    # paho acknowledged whatever else reached it before the abort: those are delivered too
    got.extend(m.payload.decode() for m in second.drain())
    n0.stop(timeout=20)
    n0.start(wait=False)
    n0.wait_ready()
    pair.wait_links_up()
    third = _persistent(clients, n0, cid)
    assert third.session_present
    deadline = time.monotonic() + 60
    while len(set(got)) < _BURST and time.monotonic() < deadline:
        got.extend(m.payload.decode() for m in third.drain())
        time.sleep(0.1)
    want = [f"b{i}" for i in range(_BURST)]
    assert sorted(set(got), key=lambda p: int(p[1:])) == want, (
        f"missing {sorted(set(want) - set(got), key=lambda p: int(p[1:]))[:10]}")
    seen: list[str] = []
    for p in got:
        if p not in seen:
            seen.append(p)
    assert seen == want  # first arrivals in log order (a resend may repeat one)


def test_a_replay_resolved_after_its_client_left_reads_when_the_client_is_back(
        pair: Cluster, clients: ClientFactory) -> None:
    """A persistent session asks node 0 to replay a log node 1 owns while node 1 is frozen,
    and leaves before the SUBACK. Node 1 thaws and answers: the subscription stays with the
    session, and when the client comes back it gets the history, then live messages."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("late"))
    topic = f"devices/{device}/t"
    pub = clients.connected(n1, protocol=V5)
    for i in range(5):
        pub.publish(topic, f"h{i}", 1)
    cid = unique("leaver")
    owner = pair.router_pid(1)
    first = _persistent(clients, n0, cid)
    os.kill(owner, signal.SIGSTOP)
    try:
        first.mqtt.subscribe(f"devices/{device}/#", 1, properties=props(
            PacketTypes.SUBSCRIBE, UserProperty=[("offset", "earliest")]))
        time.sleep(0.5)
        first.disconnect()
    finally:
        os.kill(owner, signal.SIGCONT)
    time.sleep(1.0)  # node 1 answers the RESOLVE
    again = _persistent(clients, n0, cid)
    assert again.session_present
    got = again.expect_messages(5, timeout=15)
    assert [m.payload.decode() for m in got] == [f"h{i}" for i in range(5)]
    pub.publish(topic, "live", 1)
    assert again.expect_message(timeout=10).payload == b"live"


def test_catch_up_from_an_owner_killed_mid_read_resumes_after_its_restart(
        pair: Cluster, clients: ClientFactory) -> None:
    """A session at node 0 reads 600 messages back from node 1's log; node 1's router is
    killed (-9) mid-read and its supervisor restarts it: the reads fail while it is gone and
    resume where they were, every message once and in order."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("kill"))
    cid = unique("killed")
    first = _persistent(clients, n0, cid)
    first.subscribe(f"devices/{device}/#", 1)
    pair.wait_routes(0, 1)
    first.disconnect()
    _burst(clients, n1, f"devices/{device}/t")
    again = _persistent(clients, n0, cid, ReceiveMaximum=2)
    got = [m.payload.decode() for m in again.expect_messages(100, timeout=30)]
    old = pair.router_pid(1)
    os.kill(old, signal.SIGKILL)

    pair.wait_router_restarted(1, old, timeout=30)
    pair.wait_links_up()
    got.extend(m.payload.decode() for m in again.expect_messages(_BURST - len(got), timeout=60))
    assert got == [f"b{i}" for i in range(_BURST)]
    again.expect_no_message(0.5)


def test_a_client_waiting_on_a_frozen_owner_keeps_its_keepalive(
        pair: Cluster, clients: ClientFactory) -> None:
    """A client with a 1 s keepalive asks node 0 for a replay of a log node 1 owns while node
    1 is frozen for 2.2 s (more than 1.5 keepalives, less than the test cluster's 3 s
    link_timeout), then subscribes to something else. Its SUBACK waits for the owner; its
    other packets do not (its PINGREQs are answered, its second SUBSCRIBE too), so neither
    side drops the connection, and the replay delivers once the owner answers."""
    n0, n1 = pair.nodes
    device = pair.device_owned_by(1, unique("ka"))
    pub = clients.connected(n1, protocol=V5)
    pub.publish(f"devices/{device}/t", "h0", 1)
    sub = clients.connected(n0, protocol=V5, connect={"keepalive": 1})
    owner = pair.router_pid(1)
    os.kill(owner, signal.SIGSTOP)
    try:
        _, mid = sub.mqtt.subscribe(f"devices/{device}/#", 1, properties=props(
            PacketTypes.SUBSCRIBE, UserProperty=[("offset", "earliest")]))
        _, mid2 = sub.mqtt.subscribe(f"u/{unique('ka')}", 1)
        wait_for(lambda: mid2 in sub.subacks, 2, message="the second SUBACK, not held")
        time.sleep(2.2)
    finally:
        os.kill(owner, signal.SIGCONT)
    wait_for(lambda: mid in sub.subacks, 10, message="the SUBACK once node 1 thawed")
    assert [int(getattr(c, "value", c)) for c in sub.subacks[mid]] == [1]
    assert sub.is_connected()
    assert sub.expect_message(timeout=10).payload == b"h0"
