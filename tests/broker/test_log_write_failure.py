"""A log write or fsync that fails is never acknowledged: v5 gets 0x80, 3.1.1 a closed socket.

The broker's store sits on the lazy FUSE layer (tests/helpers/lazyfs.py), which can make every
``fsync`` fail with EIO or every ``write`` with ENOSPC: the fault is injected at the OS seam,
under a real broker process, not by patching our classes. While the fault lasts:

* a v5 QoS 1 PUBLISH gets PUBACK 0x80 (Unspecified error) with a reason string, a QoS 2 one
  PUBREC 0x80 (MQTT 5 has negative acks; Mosquitto and EMQX answer 0x80 the same way when
  persistence fails), and the connection stays up;
* a 3.1.1 QoS 1 PUBLISH closes the connection without a PUBACK (3.1.1 has no negative ack:
  the client re-sends after reconnecting);
* no subscriber receives any of them and the log does not hold them.

After ``heal`` (and, for the fsync fault, a restart) the next publish is acknowledged at the
next offset and the log holds exactly the acknowledged messages.

The write fault reproduces issue 11 item 1 (a failed write's batch was acknowledged, because
DeviceLogs registered its durability callback after the committer's failed flush had rolled
back); it failed before that fix.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.devicelog import BrokerGroup, fetch_all
from helpers.lazyfs import LazyFS

pytestmark = pytest.mark.timeout(120)
# v5 acks name device/offset only when asked (CONNECT user property, mqtt.ack_offsets).
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


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


def _puback(c: R.RawClient, payload: bytes, pid: int, qos: int = 1) -> R.Packet:
    c.send(R.publish("devices/wf/t", payload, qos=qos, packet_id=pid, version=c.version))
    return c.expect(R.PUBACK if qos == 1 else R.PUBREC, timeout=30)


def _refused_while_failing(broker, fs, raw, op: str, err: str) -> tuple[R.RawClient, R.RawClient]:
    """Subscriber and v5 publisher; one good publish, then the fault and three refusals."""
    sub = raw(broker, version=5)
    sub.connect(f"wf-sub-{op}")
    assert sub.subscribe("devices/wf/#", 1).reason_codes == [1]
    pub = raw(broker, version=5)
    pub.connect(f"wf-pub5-{op}", properties=ACK_OFFSETS)
    assert _puback(pub, b"ok0", 1).reason_code == 0
    before = broker.metric("meshmq_messages_dropped_total", reason="not_stored")

    fs.fail(op, err)
    refused = _puback(pub, b"bad1", 2)
    assert refused.reason_code == 0x80, f"a publish whose {op} failed was acknowledged: " \
                                        f"{refused!r}"
    assert refused.properties.get(R.REASON_STRING), f"no reason string: {refused!r}"
    rec = _puback(pub, b"bad2", 3, qos=2)
    assert rec.reason_code == 0x80, rec
    old = raw(broker, version=4)
    old.connect(f"wf-pub4-{op}")
    old.send(R.publish("devices/wf/t", b"bad3", qos=1, packet_id=1))
    got = old.wait_closed(timeout=30)
    assert not [p for p in got if p.type == R.PUBACK], f"3.1.1 got an ack: {got}"
    assert broker.metric("meshmq_messages_dropped_total", reason="not_stored") >= before + 3
    delivered = sub.expect(R.PUBLISH, timeout=30)
    assert delivered.payload == b"ok0", delivered
    sub.ack(delivered)
    return sub, pub


def test_failed_fsync_is_refused_and_a_restart_recovers(lazy_broker, raw):
    """fsync answers EIO: every publish it covered is refused. After the disk heals and the
    broker restarts, the log holds exactly the acknowledged message and goes on from offset 1.
    (Without a restart the store stays failed after its rollback's own fsync failed: like
    PostgreSQL after an fsync error, data the kernel may have dropped is not trusted.)"""
    broker, fs = lazy_broker
    sub, pub = _refused_while_failing(broker, fs, raw, "fsync", "EIO")
    sub.expect_none(0.5)  # nothing refused was routed
    fs.heal()
    broker.stop()
    broker.start()
    assert [bytes(r.payload) for r in fetch_all(broker, "wf")] == [b"ok0"]
    pub = raw(broker, version=5)
    pub.connect("wf-pub5-after", properties=ACK_OFFSETS)
    ok = _puback(pub, b"ok4", 1)
    assert ok.reason_code == 0 and ("offset", "1") in ok.properties.get(R.USER_PROPERTY, []), ok
    assert [bytes(r.payload) for r in fetch_all(broker, "wf")] == [b"ok0", b"ok4"]


def test_failed_write_is_refused_and_writes_resume(lazy_broker, raw):
    """write answers ENOSPC (a full disk): every publish of the batch is refused, and once
    space returns the same connection publishes again, acknowledged at the next offset."""
    broker, fs = lazy_broker
    sub, pub = _refused_while_failing(broker, fs, raw, "write", "ENOSPC")
    fs.heal()
    # Writes resume once the store's probe (backoff 0.1-5 s) finds the volume writable again;
    # until then a publish is refused, never acknowledged. Hang deadline, not a speed bound.
    deadline = time.monotonic() + 60
    pid = 4
    while True:
        ok = _puback(pub, b"ok4", pid)
        if ok.reason_code == 0 or time.monotonic() > deadline:
            break
        assert ok.reason_code == 0x80, ok
        pid += 1
        time.sleep(0.2)
    assert ok.reason_code == 0 and ("offset", "1") in ok.properties.get(R.USER_PROPERTY, []), ok
    msg = sub.expect(R.PUBLISH, timeout=30)
    assert msg.payload == b"ok4", f"a refused publish was delivered: {msg!r}"
    assert [bytes(r.payload) for r in fetch_all(broker, "wf")] == [b"ok0", b"ok4"]
