"""Review of the per-device high-water-mark acks (broker/devicelogs.py) under faults: the
publisher's connection lost while its publishes are held.

The promise is "a PUBACK/PUBREC means committed, and every stored publish is answered exactly
once". With a device's mark held (the test-only failpoint ``MESHMQTEST_HWM_HOLD_FILE``,
meshmq/hwmhold.py, as a lagging follower would hold it), a QoS 2 publisher that loses its
connection and resumes its session must get its PUBREC once, on the new connection, when the mark
passes (the settle of a closed connection: ``RemotePublishes.settle_resumed_qos2``), and its
resend meanwhile must neither be stored twice nor answered early; another device's acks on the new
connection are untouched meanwhile (and are the sentinel that the resend was read).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)

ENV = "MESHMQTEST_HWM_HOLD_FILE"
RESUME = {R.SESSION_EXPIRY_INTERVAL: 300, R.USER_PROPERTY: [("ack-offsets", "true")]}


def _position(ack: R.Packet) -> dict[str, str]:
    return dict((ack.properties or {}).get(R.USER_PROPERTY, []))


def test_held_qos2_answered_once_on_the_resumed_connection(start_broker, raw,
                                                           tmp_path: Path) -> None:
    hold = tmp_path / "hwm-hold"
    b = start_broker(env={ENV: str(hold)})
    held_id, free_id, cid = unique("held"), unique("free"), unique("hwpub")
    held_topic, free_topic = f"devices/{held_id}/t", f"devices/{free_id}/t"

    sub = raw(b, version=5)
    sub.connect(unique("hwsub"))
    sub.subscribe([(f"devices/{held_id}/#", 1)], packet_id=1)
    pub = raw(b, version=5)
    pub.connect(cid, properties=RESUME)
    ack = pub.publish(held_topic, b"m0", 1, packet_id=1)
    device = _position(ack)["device"]
    sub.ack(sub.expect(R.PUBLISH))

    hold.write_text(device + "\n")
    wait_for(lambda: f"high-water mark of {device!r} held" in b.log_text(), timeout=30,
             message="the failpoint to hold the mark")

    # a QoS 2 publish of the held device, then the connection lost before any PUBREC
    pub.send(R.publish(held_topic, b"q2", qos=2, packet_id=7, version=5))
    pub.send(R.publish(free_topic, b"f1", qos=1, packet_id=8, version=5))
    assert pub.expect(R.PUBACK, timeout=30).packet_id == 8  # sentinel: pid 7 was read
    pub.abort()

    again = raw(b, version=5)
    connack = again.connect(cid, clean=False, properties=RESUME)
    assert connack.session_present, f"the session was not resumed: {connack!r}"
    # the resend of the pending id, then another device's publish as the sentinel that the
    # resend was read: the resend must not be answered while the mark is held
    again.send(R.publish(held_topic, b"q2", qos=2, dup=True, packet_id=7, version=5))
    again.send(R.publish(free_topic, b"f2", qos=1, packet_id=9, version=5))
    first = again.recv(timeout=30)
    assert (first.type, first.packet_id) == (R.PUBACK, 9), (
        f"while {device!r}'s mark is held the only answer on the resumed connection must be "
        f"the other device's PUBACK 9, got {first!r}: the held QoS 2 publish was answered "
        f"before its device's high-water mark passed it")
    again.expect_none(1.0)

    hold.unlink()
    rec = again.expect(R.PUBREC, timeout=30)
    assert rec.packet_id == 7 and not rec.reason_code, (
        f"the held QoS 2 publish must be PUBREC'd (success) on the resumed connection once "
        f"its mark passed, got {rec!r}")
    again.send(R.pubrel(7))
    comp = again.expect(R.PUBCOMP, timeout=30)
    assert comp.packet_id == 7 and not comp.reason_code, comp
    again.expect_none(1.5)  # exactly once: no second PUBREC for the resend

    got = sub.expect(R.PUBLISH, timeout=30)
    assert (got.topic, got.payload) == (held_topic, b"q2"), got
    sub.ack(got)
    sub.expect_none(1.5)  # stored once: the resend of a pending id is not a new message
