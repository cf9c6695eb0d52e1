"""A 3.1.1 QoS 2 publish the commit log could not store closes the connection (3.1.1 has no
negative PUBREC) and must be resendable after the client reconnects with its session (review
of issue 28's refusal paths).

The broker's store sits on the lazy FUSE layer (tests/helpers/lazyfs.py) failing every
``write`` with ENOSPC: the group commit fails and the router refuses the batch. Before the fix
``Router._not_stored`` dropped the session's pending packet id only on its v5 branch: the 3.1.1
client's resend of that packet id [MQTT-4.4.0-1] was taken for a duplicate of a publish still
being stored and swallowed, for good: never stored, never answered.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.devicelog import BrokerGroup, fetch_all
from helpers.lazyfs import LazyFS

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def lazy_broker(fuse_tools, tmp_path: Path):
    fs = LazyFS(tmp_path / "disk", tmp_path / "data").mount()
    group = BrokerGroup()
    try:
        broker = group.start(tmp_path, node={"data_dir": str(tmp_path / "data")})
        yield broker, fs
    finally:
        try:
            fs.heal()
        except AssertionError:
            pass
        group.stop_all()
        fs.unmount()


def test_a_311_qos2_publish_refused_by_the_log_can_be_resent(lazy_broker, raw) -> None:
    broker, fs = lazy_broker
    pub = raw(broker, version=4)
    pub.connect("q2v4-local", clean=False)
    pub.send(R.publish("devices/q2l/t", b"ok", qos=1, packet_id=1))
    assert pub.expect(R.PUBACK, timeout=30).packet_id == 1
    fs.fail("write", "ENOSPC")
    pub.send(R.publish("devices/q2l/t", b"q2", qos=2, packet_id=7))
    got = pub.wait_closed(timeout=30)
    assert not [p for p in got if p.type == R.PUBREC], f"a refused publish was acked: {got}"
    fs.heal()
    # the store probes the volume again (backoff up to 5 s): a v5 probe until it stores
    probe = raw(broker, version=5)
    probe.connect("q2v4-probe")
    deadline = time.monotonic() + 60
    pid = 1
    while True:
        probe.send(R.publish("devices/q2l-probe/t", b"p", qos=1, packet_id=pid, version=5))
        if probe.expect(R.PUBACK, timeout=30).reason_code == 0:
            break
        assert time.monotonic() < deadline, "the store never took writes again"
        pid += 1
        time.sleep(0.2)
    again = raw(broker, version=4)
    assert again.connect("q2v4-local", clean=False).session_present
    again.send(R.publish("devices/q2l/t", b"q2", qos=2, dup=True, packet_id=7))
    rec = again.expect(R.PUBREC, timeout=30)
    assert rec.packet_id == 7, rec
    again.send(R.pubrel(7))
    assert again.expect(R.PUBCOMP, timeout=30).packet_id == 7
    assert [bytes(r.payload) for r in fetch_all(broker, "q2l")] == [b"ok", b"q2"]


@pytest.fixture
def slow_disk_broker(fuse_tools, tmp_path: Path):
    # 0.5 s per fsync: the connection is closed microseconds after its PUBLISH, far inside
    # one fsync (2 s took 18 s here, most of it fsyncs at start and stop)
    fs = LazyFS(tmp_path / "disk", tmp_path / "data", fsync_delay_s=0.5).mount()
    group = BrokerGroup()
    try:
        yield group.start(tmp_path, node={"data_dir": str(tmp_path / "data")})
    finally:
        group.stop_all()
        fs.unmount()


def test_a_qos2_publish_stored_after_its_connection_closed_is_answered_on_resume(
        slow_disk_broker, raw) -> None:
    """Every fsync takes 2 s: a v5 QoS 2 publish's connection dies before its batch is durable,
    the client resumes its session and resends the PUBLISH. The message is stored (once): the
    resend must get its PUBREC. Before the fix the durable batch answered only the closed
    connection, the session kept the id pending, and the resend was swallowed for good."""
    broker = slow_disk_broker
    first = raw(broker, version=5)
    first.connect("q2slow", clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 300})
    first.send(R.publish("devices/q2slow/t", b"q2", qos=2, packet_id=7, version=5))
    first.abort()
    again = raw(broker, version=5)
    ack = again.connect("q2slow", clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 300})
    assert ack.session_present, ack
    again.send(R.publish("devices/q2slow/t", b"q2", qos=2, dup=True, packet_id=7, version=5))
    rec = again.expect(R.PUBREC, timeout=60)
    assert (rec.packet_id, rec.reason_code) == (7, 0), rec
    again.send(R.pubrel(7))
    # a second PUBREC for packet 7 (the resumed session's answer and the resend's) is allowed
    # by MQTT; what must come is the PUBCOMP
    assert again.expect(R.PUBCOMP, timeout=60, skip=(R.PUBREC,)).packet_id == 7
    assert [bytes(r.payload) for r in fetch_all(broker, "q2slow")] == [b"q2"]
