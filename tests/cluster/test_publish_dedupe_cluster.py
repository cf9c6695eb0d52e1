"""Publisher dedupe across the mesh (issue 24, broker/pubdedupe.py), on real nodes with
``cluster.placement = "raft"``.

A device's log is led by n1 (its first publisher connected there). A client on n0 publishes
to it: n0 forwards the APPEND, n1 stores it; the client never reads its PUBACK (PUBREC), and
n0 is killed with kill -9, so the client's session dies with it. The client reconnects to n2
with clean_start = false (a session n2 has never seen) and resends with DUP=1: n2 forwards the
APPEND with the client's identity, and n1 finds the first copy in its log and answers with its
offset instead of storing it again. The log at its leader holds each message once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all

pytestmark = pytest.mark.timeout(300)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


@pytest.fixture
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("dedupe"), n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 5.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _kill9(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _payloads(cluster: Cluster, device: str) -> list[bytes]:
    return [bytes(r.payload) for r in fetch_all(cluster.nodes[1], device)]


def test_a_resend_at_another_node_after_the_publishers_node_died_is_stored_once(
        trio: Cluster, raw) -> None:
    device = unique("dedupe")
    topic = f"devices/{device}/t"
    owner = raw(trio.nodes[1], version=5)
    owner.connect(unique("lead"), properties=ACK_OFFSETS)
    owner.publish(topic, b"first", 1, packet_id=1)  # placed at n1: its publisher is there
    wait_for(lambda: trio.status(0, device)["owner"]["router"] == "n1/0", 30,
             message=f"n0 names n1/0 as the leader of {device}")

    cid = unique("mover")
    pub = raw(trio.nodes[0], version=4)
    pub.connect(cid, clean=False)
    pub.send(R.publish(topic, b"m1", qos=1, packet_id=5))
    pub.send(R.publish(topic, b"q2", qos=2, packet_id=6))
    wait_for(lambda: _payloads(trio, device) == [b"first", b"m1", b"q2"], 60,
             message="both stored at the leader")
    pub.abort()  # neither PUBACK nor PUBREC read
    # the whole node at once: its supervisor and its router, by PID (a router merely orphaned
    # drains, and would hand the session over with its QoS 2 state)
    router = trio.router_pid(0)
    trio.nodes[0].kill()
    _kill9(router)

    again = raw(trio.nodes[2], version=4)
    again.connect(cid, clean=False)
    again.send(R.publish(topic, b"m1", qos=1, dup=True, packet_id=5))
    ack = again.expect(R.PUBACK, timeout=60)
    assert ack.packet_id == 5 and ack.reason_code in (None, 0), ack
    again.send(R.publish(topic, b"q2", qos=2, dup=True, packet_id=6))
    rec = again.expect(R.PUBREC, timeout=60)
    assert rec.packet_id == 6 and rec.reason_code in (None, 0), rec
    again.send(R.pubrel(6))
    assert again.expect(R.PUBCOMP, timeout=60).packet_id == 6
    # a new message afterwards is stored: the sentinel that nothing is still on its way
    again.publish(topic, b"after", 1, packet_id=7)
    assert _payloads(trio, device) == [b"first", b"m1", b"q2", b"after"]
    # the QoS 1 resend is found by the dedupe; the QoS 2 one by it too, or (when the session
    # registry saved its receive state before the kill: cluster/sessionreg.py) by the resumed
    # session's QoS 2 state, which answers a resent PUBLISH without storing it [MQTT-4.3.3-10]
    assert trio.nodes[1].metric("meshmq_publish_dedupe_total", result="hit") in (1, 2)
