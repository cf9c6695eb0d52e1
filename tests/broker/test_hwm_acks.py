"""Publisher acks and routing follow the device's high-water mark, not the local fsync (issue 26,
"Ack when the high-water mark passes"; the promise replication builds on, issue 24).

On one node the high-water mark *is* the durable end, so a broker that acked and routed at its
fsync would pass every other single-node test. The test-only failpoint
``MESHMQTEST_HWM_HOLD_FILE`` (meshmq/hwmhold.py) holds one device's mark back in a real
``meshmq serve`` while its records keep becoming durable, as a lagging follower would: nothing of
that device may be acknowledged (PUBACK, PUBREC) or delivered until the mark moves, and then
both happen, in log order, with the right offsets. Another device is untouched meanwhile; its
ack, from a later write, is also the sentinel that the held device's records are durable (group
commits become durable in write order), so the test waits for a condition, not for time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)

ENV = "MESHMQTEST_HWM_HOLD_FILE"
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


def _position(ack: R.Packet) -> dict[str, str]:
    return dict((ack.properties or {}).get(R.USER_PROPERTY, []))


def test_ack_and_delivery_wait_for_the_high_watermark(start_broker, raw, tmp_path: Path) -> None:
    hold = tmp_path / "hwm-hold"
    b = start_broker(env={ENV: str(hold)})
    held_id, free_id = unique("held"), unique("free")
    held_topic, free_topic = f"devices/{held_id}/t", f"devices/{free_id}/t"

    sub = raw(b, version=5)
    sub.connect(unique("hwsub"))
    sub.subscribe([(f"devices/{held_id}/#", 1), (f"devices/{free_id}/#", 1)], packet_id=1)
    pub = raw(b, version=5)
    pub.connect(unique("hwpub"), properties=ACK_OFFSETS)

    # the device's log exists (the failpoint holds only an existing log), its first record seen
    ack = pub.publish(held_topic, b"m0", 1, packet_id=1)
    device = _position(ack)["device"]
    got = sub.expect(R.PUBLISH)
    sub.ack(got)
    assert got.payload == b"m0", got

    hold.write_text(device + "\n")
    wait_for(lambda: f"high-water mark of {device!r} held" in b.log_text(), timeout=30,
             message="the failpoint to hold the mark")

    pub.send(R.publish(held_topic, b"m1", qos=1, packet_id=2, version=5))
    pub.send(R.publish(held_topic, b"m2", qos=2, packet_id=3, version=5))
    pub.send(R.publish(free_topic, b"f1", qos=1, packet_id=4, version=5))
    first = pub.recv(timeout=30)
    assert (first.type, first.packet_id) == (R.PUBACK, 4), (
        f"while {device!r}'s high-water mark is held, the first ack must be the other "
        f"device's (pid 4), got {first!r}: a publish was acknowledged before the high-water "
        f"mark passed it")
    pub.expect_none(1.0)  # nothing more: pid 2 and 3 are durable (sentinel above), not committed
    got = sub.expect(R.PUBLISH, timeout=30)
    assert got.topic == free_topic, (
        f"a record above the high-water mark of {device!r} was delivered: {got!r}")
    sub.ack(got)
    sub.expect_none(1.0)
    status, body = b.http_get(f"/api/v1/logs/{device}")
    assert status == 200 and json.loads(body)["high_watermark"] == 1, (status, body)

    hold.unlink()
    ack = pub.expect(R.PUBACK, timeout=30)
    assert ack.packet_id == 2 and not ack.reason_code, ack
    assert _position(ack) == {"device": device, "offset": "1"}, ack
    rec = pub.expect(R.PUBREC, timeout=30)
    assert rec.packet_id == 3 and not rec.reason_code, rec
    assert _position(rec) == {"device": device, "offset": "2"}, rec
    pub.send(R.pubrel(3))
    assert pub.expect(R.PUBCOMP, timeout=30).packet_id == 3
    for payload in (b"m1", b"m2"):
        got = sub.expect(R.PUBLISH, timeout=30)
        assert (got.topic, got.payload) == (held_topic, payload), got
        sub.ack(got)
