"""Review 10: the durable QoS 1 path of issue 25 (a batch's PUBACKs to one publisher written as
one run, broker/pubacks.py; the fsync on the committer's own worker thread,
commitlog/syncworker.py) attacked with an fsync that fails in the middle of a pipelined burst.

The store sits on the lazy FUSE layer (tests/helpers/lazyfs.py) with slow fsyncs, so a burst of
QoS 1 publishes spans many group commits; the fault (EIO from every fsync) is switched on a
third of the way through the burst's writes. What must hold, for a v5 publisher without ack offsets
(the PUBACK-run path) and for a 3.1.1 one:

* every PUBLISH (v5) is answered exactly once; the successes in publish order, none after a
  refusal;
* a success (v5 reason 0, any 3.1.1 PUBACK) only for a message the log holds after the disk
  heals and the broker restarts: no acknowledged message is lost;
* v5: what is not stored gets 0x80, never silence, the connection stays up; 3.1.1 (no negative
  ack): the connection closes, and the acks before the close are all successes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.clients import V5
from helpers.devicelog import BrokerGroup, fetch_all
from helpers.lazyfs import LazyFS

pytestmark = pytest.mark.timeout(180)
N = 1500  # publishes in the burst: many fsyncs of 20 ms each
CHUNKS = 30
FAIL_AT = 10


@pytest.fixture
def slow_disk_broker(fuse_tools, tmp_path: Path):
    fs = LazyFS(tmp_path / "disk", tmp_path / "data", fsync_delay_s=0.02).mount()
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


def _burst(c: R.RawClient, device: str, fs: LazyFS) -> list[bytes]:
    """N publishes in CHUNKS writes a few ms apart (many group commits); the fsync fault
    switched on after FAIL_AT of them, so it lands in the middle of the stream."""
    payloads = [f"{device}-{i}".encode() for i in range(N)]
    size = N // CHUNKS
    for k in range(CHUNKS):
        if k == FAIL_AT:
            fs.fail("fsync", "EIO")
        chunk = payloads[k * size:(k + 1) * size]
        try:
            c.send(b"".join(R.publish(f"devices/{device}/t", p, qos=1,
                                      packet_id=k * size + i + 1, version=c.version)
                            for i, p in enumerate(chunk)))
        except OSError:  # 3.1.1: closed at the first refusal
            break
        time.sleep(0.01)
    return payloads


@pytest.mark.parametrize("version", [5, 4])
def test_fsync_failing_mid_burst_acks_only_what_is_stored(slow_disk_broker, raw,
                                                          version: int) -> None:
    broker, fs = slow_disk_broker
    device = f"rv10v{version}"
    pub = raw(broker, version=version)
    pub.connect(f"rv10-pub-{version}")
    payloads = _burst(pub, device, fs)
    acks: list[R.Packet] = []
    closed = False
    if version == 5:
        while len(acks) < N:
            acks.append(pub.expect(R.PUBACK, timeout=60))
    else:
        # 3.1.1: the refused publish closes the connection; the acks before it came first
        got = pub.wait_closed(timeout=60)
        closed = True
        acks += [p for p in got if p.type == R.PUBACK]
    pids = [a.packet_id for a in acks]
    assert sorted(pids) == list(range(1, len(acks) + 1)), "a publish answered twice or never"
    good = [a.packet_id for a in acks if version == 4 or a.reason_code == 0]
    assert good == list(range(1, len(good) + 1)), \
        "successes out of publish order, or a success after a refusal"
    # (Not asserted: the order of v5 refusals. Publishes refused at once because the log is
    # already failing are answered before earlier ones still waiting for the running fsync,
    # which it refuses when it ends: seen here as 1-350 ok, 451-650 refused, then 351-450
    # refused. test_review4_hwm_faults requires that a refusal not wait behind a held
    # publish of the same device; [MQTT-4.6.0-2] asks for PUBACKs in PUBLISH order. A
    # decision for the lead: review10's report.)
    ok = [payloads[a.packet_id - 1] for a in acks
          if version == 4 or a.reason_code == 0]
    if version == 5:
        codes = {a.reason_code for a in acks}
        assert codes <= {0, 0x80}, codes
        assert 0x80 in codes, "the fault missed the burst: nothing was refused"
    else:
        assert closed and len(acks) < N, "the fault missed the burst: everything was acked"
    assert ok, "not even the first ack was a success"

    fs.heal()
    broker.stop()
    broker.start()
    stored = [bytes(r.payload) for r in fetch_all(broker, device)]
    missing = [p for p in ok if p not in set(stored)]
    assert not missing, f"{len(missing)} acknowledged publishes lost, first {missing[:3]}"
    # the log is in publish order and holds nothing that was not published
    assert stored == payloads[:len(stored)], "the log is not a prefix of the publishes"

    # and the broker takes publishes again after the restart
    again = raw(broker, version=version)
    again.connect(f"rv10-again-{version}")
    deadline = time.monotonic() + 60
    again.send(R.publish(f"devices/{device}/t", b"after", qos=1, packet_id=7,
                         version=version))
    ack = again.expect(R.PUBACK, timeout=max(1.0, deadline - time.monotonic()))
    assert ack.packet_id == 7 and (version == 4 or ack.reason_code == 0), ack


@pytest.mark.parametrize("topics", [1, 2], ids=["run", "two-topics"])
def test_a_publisher_gone_with_acks_pending_loses_nothing_stored(slow_disk_broker, raw,
                                                                  clients, topics) -> None:
    """A v5 publisher pipelines 1,000 QoS 1 publishes over slow fsyncs and drops its socket at
    once, its acks still pending (the PUBACK runs have no one to go to). What was stored is
    still routed: the subscriber gets exactly the log's records, in order; the broker serves
    the next publisher. ``run``: one topic, settled as runs (broker/loggedrun.py);
    ``two-topics``: the device's two topics alternate, settled message by message."""
    broker, _fs = slow_disk_broker
    device = f"rv10gone{topics}"
    sub = clients.connected(broker, protocol=V5, clean=True)
    sub.subscribe(f"devices/{device}/#", 1)
    pub = raw(broker, version=5)
    pub.connect("rv10-gone")
    names = [f"devices/{device}/t", f"devices/{device}/u"][:topics]
    pub.send(b"".join(R.publish(names[i % topics], f"{i:04d}".encode(), qos=1,
                                packet_id=i + 1, version=5) for i in range(1000)))
    pub.close()
    nxt = raw(broker, version=5)
    nxt.connect("rv10-next")
    nxt.send(R.publish(f"devices/{device}/t", b"next", qos=1, packet_id=1, version=5))
    assert nxt.expect(R.PUBACK, timeout=60).reason_code == 0
    got: list[bytes] = []
    while not got or got[-1] != b"next":
        got += [m.payload for m in sub.expect_messages(1, timeout=60)]
    stored = [bytes(r.payload) for r in fetch_all(broker, device)]
    assert got == stored, "what the log holds and what the subscriber got differ"
    assert stored[:-1] == [f"{i:04d}".encode() for i in range(len(stored) - 1)]
