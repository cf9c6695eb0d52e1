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
