"""A Raft election does not disconnect the cluster's publishers (broker/gatehold.py).

3 Raft nodes with a short leader lease (0.1 s: shorter than any Raft election, whose timeout
is at least 0.2 s, so every surviving node's lease surely runs out when the Raft leader's node
dies). MQTT 3.1.1 and MQTT 5 publishers stream QoS 1 to a device whose log a surviving node
leads, through a surviving node, while the node leading Raft is killed (-9):

- every publish is acknowledged (reason 0), none refused, and neither connection is closed:
  the publishes that came while the lease was out were held (``cluster.lease_hold``) and went
  on, in order, once the new Raft leader was heard (``meshmq_publishes_held_total`` counts
  them);
- the log read from a surviving node holds each exactly once, in publish order.

Without the hold (plant ``lease-hold-off`` in ``tests/mutations_appendmove.py``) the 3.1.1
publisher's connection is closed at the first publish after the lease ran out.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("leasehold"), n=3, raft=True,
                      overrides={"cluster": {"leader_lease": 0.1, "node_timeout": 0.5,
                                             "replica_lag_time_max": 1.0,
                                             "append_timeout": 20.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _replay(admin: int, device: str) -> list[bytes]:
    url = f"http://127.0.0.1:{admin}/api/v1/logs/{device}/records?offset=0&max_records=5000"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
        return [rec.payload for rec in decode_fetch_response(r.read())]


def test_killing_the_raft_leader_s_node_refuses_and_disconnects_no_publisher(
        trio: Cluster, raw) -> None:
    raft = trio.raft_leader()
    at = next(i for i in range(3) if i != raft)
    device = unique("hold")
    topic = f"devices/{device}/t"
    old = raw(trio.nodes[at], version=4)
    old.connect(unique("v311"))
    new = raw(trio.nodes[at], version=5)
    new.connect(unique("v5"))
    old.send(R.publish(topic, b"first", qos=1, packet_id=1))
    assert old.expect(R.PUBACK, timeout=30).packet_id == 1  # placed here: a survivor leads
    sent: list[bytes] = [b"first"]
    status = trio.status(raft)
    pids = [trio.nodes[raft].pid, status["metadata"]["pid"]]
    pids += [r["pid"] for r in status["routers"] if r.get("pid")]
    pid = 1
    killed = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # the kill 0.5 s in, publishing on both all along
        if killed is None and time.monotonic() - t0 > 0.5:
            for p in pids:
                os.kill(p, signal.SIGKILL)
            trio.nodes[raft].kill()
            killed = time.monotonic()
        pid += 1
        for client, tag in ((old, b"a"), (new, b"b")):
            payload = b"%s%d" % (tag, pid)
            client.send(R.publish(topic, payload, qos=1, packet_id=pid,
                                  version=client.version))
            sent.append(payload)
        time.sleep(0.02)
    for client in (old, new):
        got = {}
        while len(got) < pid - 1:
            try:
                ack = client.expect(R.PUBACK, timeout=15)
            except AssertionError as exc:
                raise AssertionError(
                    f"v{client.version} publisher: {len(got)} of {pid - 1} acknowledged, "
                    f"then {exc}") from None
            got[ack.packet_id] = ack.reason_code or 0
        refused = {k: v for k, v in got.items() if v}
        assert not refused, f"v{client.version}: refused during the election: {refused}"
    held = trio.nodes[at].metric("meshmq_publishes_held_total", outcome="released")
    print(f"\n[lease hold] {pid - 1} publishes on each of two connections across the Raft "
          f"leader's kill: all acknowledged, {held:.0f} held while the lease was out")
    assert held >= 1, "the lease never ran out: the test did not test the hold"
    wait_for(lambda: len(_replay(trio.nodes[at].admin_port, device)) >= len(sent), 30,
             message="every acknowledged publish readable")
    log = _replay(trio.nodes[at].admin_port, device)
    assert sorted(log) == sorted(sent) and len(set(log)) == len(log), "lost or duplicated"
    for tag in (b"a", b"b"):  # each publisher's order
        mine = [p for p in log if p.startswith(tag)]
        assert mine == [p for p in sent if p.startswith(tag)], f"order of {tag!r}"
