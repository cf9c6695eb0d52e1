"""The one cursor engine's remote reads (``broker/cursors.py``): an offset replay and a lagging
session at a router that does not own the device log read it over the mesh with one retry
policy, and a live replay cursor is read back when the owner's link comes back (issue 26).

- The retry path of remote replay was never run by a test: after the rooms split it called
  ``self.self.pump`` (an AttributeError at the first failed remote read). Here both readers
  lose their owner mid-read, their reads fail for as long as it is down (each retried after
  1 s and counted in ``meshmq_log_read_retries_total``), and both get every message, once, in
  order, once it is back.
- The chaos suite lost offset 8 of ``d001`` for the offset-replay subscriber ``replay-d001``: its
  owner stored the record from its own client and was killed before routing it, and when the
  link came back only sessions holding *positions* read back (a replay delivery is not one).
  Here the same fault, made deterministic with a proxy that loses the owner's DELIVERs.
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
from helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(240)

_BURST = 800  # more than one read of the owner's log (500 records for a replay, 256 catch-up)
_RETRIES = "meshmq_log_read_retries_total"


def _kill_node(cluster: Cluster, i: int) -> None:
    """kill -9 of the whole node: its supervisor stopped first (so it restarts nothing), its
    router killed, then the supervisor."""
    node = cluster.nodes[i]
    router = cluster.router_pid(i)
    os.kill(node.pid, signal.SIGSTOP)
    os.kill(router, signal.SIGKILL)
    node.kill()


def _replay_sub(clients: ClientFactory, node, device: str, **extra):
    """A client at ``node`` reading ``device``'s log from its first offset."""
    sub = clients.connected(node, protocol=V5, connect={
        "properties": props(PacketTypes.CONNECT, **extra)} if extra else None)
    codes = sub.subscribe(f"devices/{device}/#", 1, properties=props(
        PacketTypes.SUBSCRIBE, UserProperty=[("offset", "earliest")]))
    assert codes == [1], f"the offset subscription was refused: {codes}"
    return sub


def _collect(client, want: list[str], timeout: float = 90.0) -> list[str]:
    """Every payload the client gets until it holds all of ``want`` (or the deadline)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not set(want) <= set(got) and time.monotonic() < deadline:
        got.extend(m.payload.decode() for m in client.drain())
        time.sleep(0.05)
    return got


@pytest.fixture
def pair(tmp_path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, n=2, overrides={"mqtt": {"max_queued_messages": 20}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_reads_failing_while_the_owner_is_down_are_retried_for_replay_and_catch_up(
        pair: Cluster, clients: ClientFactory) -> None:
    """Node 1 owns two logs of 800 messages. At node 0 an offset replay reads one and a
    persistent session that was offline reads the other (lag mode), both two messages at a
    time. Both clients stop reading, node 1 is killed (-9), they read on: once what was
    fetched is delivered, every read of node 1 fails and is retried a second later (counted)
    for as long as it is down; node 1 comes back, and both readers get every message once, in
    order, from where they were."""
    n0, n1 = pair.nodes
    replayed = pair.device_owned_by(1, unique("rr"))
    lagged = pair.device_owned_by(1, unique("rl"))
    cid = unique("lagging")
    first = clients.connected(n0, cid, protocol=V5, clean=False, connect={
        "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=3600)})
    first.subscribe(f"devices/{lagged}/#", 1)
    pair.wait_routes(0, 1)
    first.disconnect()
    pub = clients.connected(n1, protocol=V5)
    for device in (replayed, lagged):
        for i in range(_BURST - 1):
            pub.publish(f"devices/{device}/t", f"b{i}", 1, wait=False)
        pub.publish(f"devices/{device}/t", f"b{_BURST - 1}", 1)
    want = [f"b{i}" for i in range(_BURST)]

    replay = _replay_sub(clients, n0, replayed, ReceiveMaximum=2)
    lagging = clients.connected(n0, cid, protocol=V5, clean=False, connect={
        "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=3600, ReceiveMaximum=2)})
    got_replay = [m.payload.decode() for m in replay.expect_messages(20, timeout=30)]
    got_lag = [m.payload.decode() for m in lagging.expect_messages(20, timeout=30)]
    replay.stop_loop_only()  # the window fills: no read goes out until they read on
    lagging.stop_loop_only()
    retries = n0.metric(_RETRIES)

    _kill_node(pair, 1)
    replay.mqtt.loop_start()
    lagging.mqtt.loop_start()
    wait_for(lambda: n0.metric(_RETRIES) >= retries + 4, 30,
             message="failed reads of the dead owner's logs retried and counted")
    n1.start(wait=False)
    n1.wait_ready()
    pair.wait_links_up(60)

    got_replay += _collect(replay, want[len(got_replay):])
    got_lag += _collect(lagging, want[len(got_lag):])
    assert got_replay == want, (f"offset replay: {len(got_replay)} messages, first missing "
                                f"{sorted(set(want) - set(got_replay))[:5]}")
    assert got_lag == want, (f"lagging session: {len(got_lag)} messages, first missing "
                             f"{sorted(set(want) - set(got_lag))[:5]}")


def test_a_live_replay_cursor_reads_back_what_a_killed_owner_never_routed(
        pair_via_proxy: tuple[Cluster, TcpProxy], clients: ClientFactory) -> None:
    """Node 0 owns the log; an offset replay at node 1 has read it and follows it live. Node 0
    stores 10 messages from its own client (every PUBACK arrives) while its link to node 1
    loses every byte, and is killed (-9): those DELIVERs die with it. It restarts, the link
    comes back, and the replay subscriber gets the 10 (read back from where its cursor was)
    before the next live message."""
    cluster, proxy = pair_via_proxy
    n0, n1 = cluster.nodes
    device = cluster.device_owned_by(0, unique("back"))
    topic = f"devices/{device}/t"
    pub = clients.connected(n0, protocol=V5)
    for i in range(5):
        pub.publish(topic, f"a{i}", 1)
    sub = _replay_sub(clients, n1, device)
    cluster.wait_routes(1, 1)
    pub.publish(topic, "l0", 1)  # live: the cursor read the log and follows it
    first = [f"a{i}" for i in range(5)] + ["l0"]
    got = _collect(sub, first, 30)
    assert got == first

    proxy.blackhole()
    for i in range(10):
        pub.publish(topic, f"h{i}", 1)  # stored; the DELIVER to node 1 never arrives
    _kill_node(cluster, 0)
    proxy.cut()
    n0.start(wait=False)
    n0.wait_ready()
    proxy.heal()
    cluster.wait_links_up(60)
    again = clients.connected(n0, protocol=V5)
    again.publish(topic, "c0", 1)
    want = [f"h{i}" for i in range(10)] + ["c0"]
    got = _collect(sub, want, 30)
    assert [p for p in got if p in want] == want, (
        f"stored, acknowledged, never delivered to the replay: "
        f"{[p for p in want if p not in got]}; got {got}")
