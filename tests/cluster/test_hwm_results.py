"""Across the mesh, the owner answers an APPEND (RESULTS) and routes the record only when its
device's high-water mark passes it, not when its fsync ran (issue 26, "Ack when the high-water
mark passes"): the publisher's PUBACK at another router waits for that answer, so it too means
committed at the log's leader, which is what replication (issue 24) needs of the seam.

Two nodes; the device log lives on node 1, the publisher and the subscriber are on node 0. The
test-only failpoint ``MESHMQTEST_HWM_HOLD_FILE`` (meshmq/hwmhold.py) holds the device's mark on
node 1 while its records become durable there. A second device on node 1 is the sentinel: its
APPEND goes after the held one on the same link, so its PUBACK means node 1 has made the held
record durable too (writes commit in order) without acknowledging it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

ENV = "MESHMQTEST_HWM_HOLD_FILE"
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


@pytest.fixture
def held_mesh(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    hold = tmp_path / "hwm-hold"
    cluster = Cluster(tmp_path, n=2)
    for node in cluster.nodes:
        node.extra_env[ENV] = str(hold)
    try:
        cluster.start()
        yield cluster, hold
    finally:
        cluster.stop()


def test_owner_answers_and_routes_an_append_only_past_the_high_watermark(
        held_mesh: tuple[Cluster, Path], raw) -> None:
    mesh, hold = held_mesh
    n0, n1 = mesh.nodes
    device = mesh.device_owned_by(1, unique("held"))
    other = mesh.device_owned_by(1, unique("free"))
    topic, other_topic = f"devices/{device}/t", f"devices/{other}/t"

    sub = raw(n0, version=5)
    sub.connect(unique("hrsub"))
    sub.subscribe([(f"devices/{device}/#", 1), (f"devices/{other}/#", 1)], packet_id=1)
    mesh.wait_routes(0, count=2)  # node 1 routes to the subscriber here
    pub = raw(n0, version=5)
    pub.connect(unique("hrpub"), properties=ACK_OFFSETS)
    ack = pub.publish(topic, b"m0", 1, packet_id=1)  # the log exists at its owner
    assert ack.reason_code == 0, ack
    got = sub.expect(R.PUBLISH, timeout=30)
    sub.ack(got)

    hold.write_text(device + "\n")
    wait_for(lambda: f"high-water mark of {device!r} held" in n1.log_text(), timeout=30,
             message="the failpoint to hold the mark on the owner")

    pub.send(R.publish(topic, b"m1", qos=1, packet_id=2, version=5))
    pub.send(R.publish(other_topic, b"f1", qos=1, packet_id=3, version=5))
    first = pub.recv(timeout=30)
    assert (first.type, first.packet_id) == (R.PUBACK, 3), (
        f"while the owner holds {device!r}'s high-water mark the first ack must be the other "
        f"device's (pid 3), got {first!r}: the owner answered an APPEND before its high-water "
        f"mark passed it")
    pub.expect_none(1.0)
    got = sub.expect(R.PUBLISH, timeout=30)
    assert got.topic == other_topic, (
        f"a record above the owner's high-water mark of {device!r} was routed: {got!r}")
    sub.ack(got)
    sub.expect_none(1.0)

    hold.unlink()
    ack = pub.expect(R.PUBACK, timeout=30)
    assert ack.packet_id == 2 and not ack.reason_code, ack
    assert dict(ack.properties[R.USER_PROPERTY]) == {"device": device, "offset": "1"}, ack
    got = sub.expect(R.PUBLISH, timeout=30)
    assert (got.topic, got.payload) == (topic, b"m1"), got
