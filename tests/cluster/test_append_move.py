"""Publishes waiting on a leader that dies go to the new leader (cluster/appendmove.py).

3 Raft nodes, RF 3, ``append_timeout`` 20 s (so a publish left waiting on the dead leader's
link would be refused only after the whole test's patience). A v5 publisher on node P
publishes to a device whose log node V leads (V is not the Raft leader, so the other nodes
keep Raft contact and their write gate stays open):

1. V's processes are frozen (SIGSTOP): publishes h0..h9 are written to the link and sit
   unanswered in V's socket (sent, outcome unknown);
2. V is killed (SIGKILL): publishes h10..h19 wait in the link's queue (never sent);
3. the controller elects another in-sync replica: every one of h0..h19 is acknowledged (reason
   0) well before ``append_timeout``, at offsets rising in publish order; the log read from a
   surviving node holds each of them exactly once, in order, after the first message.

Without the move (plant: ``tests/mutations_appendmove.py``) nothing answers h0..h19 until
the 20 s ``append_timeout``: the test fails with "no PUBACK".
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster

from commitlog.fetch import decode_fetch_response

pytestmark = pytest.mark.timeout(300)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("appendmove"), n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 20.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _replay(admin: int, device: str) -> list[tuple[int, bytes]]:
    url = f"http://127.0.0.1:{admin}/api/v1/logs/{device}/records?offset=0&max_records=1000"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
        return [(rec.offset, rec.payload) for rec in decode_fetch_response(r.read())]


def test_publishes_waiting_on_a_killed_leader_are_acknowledged_by_the_new_one(
        trio: Cluster, raw) -> None:
    raft = trio.raft_leader()
    victim = next(i for i in range(3) if i != raft)
    at = next(i for i in range(3) if i != victim)
    device = unique("mv")
    topic = f"devices/{device}/t"
    first = raw(trio.nodes[victim], version=5)
    first.connect(unique("placer"))
    first.send(R.publish(topic, b"first", qos=1, packet_id=1, version=5))
    assert first.expect(R.PUBACK, timeout=30).reason_code == 0
    wait_for(lambda: (trio.status(at, device).get("owner") or {}).get("router")
             == f"n{victim}/0", 30, message=f"n{at} knows n{victim}/0 leads {device}")
    pub = raw(trio.nodes[at], version=5)
    pub.connect(unique("pub"), properties=ACK_OFFSETS)
    pub.send(R.publish(topic, b"before", qos=1, packet_id=1, version=5))
    assert pub.expect(R.PUBACK, timeout=30).reason_code == 0  # forwarded to the leader
    pids = trio.node_pids(victim)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    for k in range(10):  # sent into the frozen leader's socket: outcome unknown
        pub.send(R.publish(topic, b"h%d" % k, qos=1, packet_id=10 + k, version=5))
    time.sleep(0.3)
    for p in pids:
        os.kill(p, signal.SIGKILL)
    trio.nodes[victim].kill()
    killed = time.monotonic()
    for k in range(10, 20):  # the link is down: they wait in its queue, never sent
        pub.send(R.publish(topic, b"h%d" % k, qos=1, packet_id=10 + k, version=5))
    acks = {}
    while len(acks) < 20:
        ack = pub.expect(R.PUBACK, timeout=15)  # well before append_timeout (20 s)
        acks[ack.packet_id] = ack
    took = time.monotonic() - killed
    refused = {pid: a.reason_code for pid, a in acks.items() if a.reason_code != 0}
    assert not refused, f"refused instead of moved to the new leader: {refused}"
    offsets = [int(dict(acks[10 + k].properties[R.USER_PROPERTY])["offset"]) for k in range(20)]
    assert offsets == sorted(offsets) and len(set(offsets)) == 20, offsets
    print(f"\n[appendmove] 20 waiting publishes acknowledged by the new leader {took:.2f} s "
          "after the kill")
    rows = _replay(trio.nodes[at].admin_port, device)
    payloads = [p for _, p in rows]
    want = [b"first", b"before"] + [b"h%d" % k for k in range(20)]
    assert payloads == want, f"the log after the move: {payloads}"
    assert [o for o, _ in rows] == list(range(len(want)))
    assert json.dumps(trio.status(at, device)["owner"]["router"]) != f'"n{victim}/0"'
