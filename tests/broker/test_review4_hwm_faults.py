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

import time
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.volume import fill_rest, tmpfs_volume

from broker.ingest import HELD_LIMIT

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
    assert _position(rec) == {"device": device, "offset": "1"}, (
        f"the resumed connection asked for ack-offsets: its PUBREC must say where the publish "
        f"is stored, got {rec!r}")
    again.send(R.pubrel(7))
    comp = again.expect(R.PUBCOMP, timeout=30)
    assert comp.packet_id == 7 and not comp.reason_code, comp
    again.expect_none(1.5)  # exactly once: no second PUBREC for the resend

    got = sub.expect(R.PUBLISH, timeout=30)
    assert (got.topic, got.payload) == (held_topic, b"q2"), got
    sub.ack(got)
    sub.expect_none(1.5)  # stored once: the resend of a pending id is not a new message


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A 2 MiB tmpfs for the commit log (root only; skipped with the reason otherwise)."""
    yield from tmpfs_volume(tmp_path)


def test_a_full_disk_while_a_device_is_held_refuses_the_new_and_keeps_the_held(
        start_broker, raw, tmp_path: Path, tmpfs: Path) -> None:
    """The disk fills while a device's mark is held over a durable record: the publishes that
    hit the full disk are refused (v5 0x80, no offset taken), and the rollback of their failed
    write must not touch the held, durable record: it is acknowledged with its offset and
    delivered once the mark passes, and the refused ones never are."""
    hold = tmp_path / "hwm-hold"
    (tmpfs / "topfill").touch()  # created now: a full tmpfs refuses even a new name
    b = start_broker(env={ENV: str(hold)},
                     commitlog={"dir": str(tmpfs / "log"), "segment_bytes": 1 << 20})
    held_id, free_id = unique("held"), unique("free")
    held_topic, free_topic = f"devices/{held_id}/t", f"devices/{free_id}/t"
    sub = raw(b, version=5)
    sub.connect(unique("hwsub"))
    sub.subscribe([(f"devices/{held_id}/#", 1), (f"devices/{free_id}/#", 1)], packet_id=1)
    pub = raw(b, version=5)
    pub.connect(unique("hwpub"), properties=RESUME)
    device = _position(pub.publish(held_topic, b"m0", 1, packet_id=1))["device"]
    sub.ack(sub.expect(R.PUBLISH))
    hold.write_text(device + "\n")
    wait_for(lambda: f"high-water mark of {device!r} held" in b.log_text(), timeout=30,
             message="the failpoint to hold the mark")

    pub.send(R.publish(held_topic, b"m1", qos=1, packet_id=2, version=5))
    pub.send(R.publish(free_topic, b"f1", qos=1, packet_id=3, version=5))
    first = pub.expect(R.PUBACK, timeout=30)  # sentinel: m1 is durable (an earlier write)
    assert first.packet_id == 3 and not first.reason_code, first
    sub.ack(sub.expect(R.PUBLISH, timeout=30))  # f1

    fill_rest(tmpfs / "topfill")
    # larger than the page slack at the segment's end: this write needs new blocks (ENOSPC)
    big = b"x" * 16384
    pub.send(R.publish(held_topic, b"m2" + big, qos=1, packet_id=4, version=5))
    pub.send(R.publish(free_topic, b"f2" + big, qos=1, packet_id=5, version=5))
    refused = [pub.expect(R.PUBACK, timeout=30) for _ in range(2)]
    assert sorted(a.packet_id for a in refused) == [4, 5], (
        f"on a full disk, with {device!r} held, the only answers must be the refusals of "
        f"pids 4 and 5, got {refused!r}: the held publish (pid 2) was answered early")
    for ack in refused:
        assert ack.reason_code == 0x80 and "device" not in _position(ack), ack
    pub.expect_none(1.0)
    sub.expect_none(0.5)

    (tmpfs / "topfill").unlink()
    wait_for(lambda: b.http_get("/readyz")[0] == 200, timeout=60,
             message="/readyz to come back after space was freed")
    hold.unlink()
    ack = pub.expect(R.PUBACK, timeout=30)
    assert ack.packet_id == 2 and not ack.reason_code, (
        f"the held, durable publish must be acknowledged once its mark passes, even after a "
        f"failed write rolled the log back meanwhile; got {ack!r}")
    assert _position(ack) == {"device": device, "offset": "1"}, ack
    got = sub.expect(R.PUBLISH, timeout=30)
    assert (got.topic, got.payload) == (held_topic, b"m1"), got
    sub.ack(got)
    sub.expect_none(1.0)  # the refused m2 and f2 are never delivered
    after = pub.publish(held_topic, b"m3", 1, packet_id=6)
    assert _position(after) == {"device": device, "offset": "2"}, (
        f"the refused m2 took an offset: {after!r}")


def test_one_held_device_past_the_held_limit_does_not_pause_other_devices_publishers(
        start_broker, raw, tmp_path: Path) -> None:
    """A device whose mark is held (a lagging follower) may hold ``HELD_LIMIT`` publishes on
    its own: the publisher flooding it is paused (memory stays bounded), and another device's
    publisher must go on being read and acknowledged (devices settle independently). Before
    review4 every publisher was paused until that one device's mark moved."""
    hold = tmp_path / "hwm-hold"
    b = start_broker(env={ENV: str(hold)})
    held_id, free_id = unique("held"), unique("free")
    flood = raw(b, version=5)
    flood.connect(unique("flood"), properties=RESUME)
    device = _position(flood.publish(f"devices/{held_id}/t", b"m0", 1, packet_id=1))["device"]
    hold.write_text(device + "\n")
    wait_for(lambda: f"high-water mark of {device!r} held" in b.log_text(), timeout=30,
             message="the failpoint to hold the mark")
    one = R.publish(f"devices/{held_id}/t", b"x", qos=0, version=5)
    count = HELD_LIMIT + 2000
    for _ in range(count // 1000):
        flood.send(one * 1000)
    wait_for(lambda: b.metric("meshmq_messages_received_total") > HELD_LIMIT, timeout=60,
             message=f"the broker to hold more than {HELD_LIMIT} publishes of {device!r}")

    other = raw(b, version=5)
    other.connect(unique("other"))
    for pid in range(1, 129):  # twice PAUSE_MIN_UNSETTLED
        other.send(R.publish(f"devices/{free_id}/t", b"f", qos=1, packet_id=pid, version=5))
        ack = other.expect(R.PUBACK, timeout=30)
        assert (ack.packet_id, ack.reason_code) == (pid, 0), ack
    # ...while the flooding publisher itself is paused: memory stays bounded. 50,000 more are
    # sent (into the socket buffers); the broker reads at most one more read's worth of them
    flood.sock.settimeout(2.0)
    for _ in range(50):
        if not flood.try_send(one * 1000):
            break
    time.sleep(2.0)
    received = b.metric("meshmq_messages_received_total")
    assert received < HELD_LIMIT + 20_000, (
        f"{received:.0f} publishes read while {device!r} holds more than {HELD_LIMIT}: the "
        f"publisher flooding the held device was not paused (memory unbounded)")
    hold.unlink()  # the flood settles (its publisher resumes), then the test ends
    ack = flood.publish(f"devices/{held_id}/t", b"last", 1, packet_id=2)
    assert not ack.reason_code, ack
