"""Replay under a small window, and retention deleting records under a running replay.

* A v5 subscriber with Receive Maximum 1 replays a whole history. (It used to stall after two
  records: the router resumed a replay only while ``len(queue) < window // 2``, which is never
  true for a window of 1. Found by the retention test below; fixed in ``_window_freed``.)
* Retention deletes records under a running replay: the cursor skips to the new start, says
  so, and goes on to live delivery without a duplicate or a step back.

A v5 subscriber replays ``devices/rt/#`` from ``earliest`` with Receive Maximum 1 and stops
acknowledging, so its cursor stalls near offset 0. A publisher then writes far more than
``retention_bytes_per_device``; the store's start offset moves past the cursor. When the
subscriber acknowledges again, the broker must skip to the start (Kafka's consumer does the
same with ``auto.offset.reset=earliest`` after retention overtook it), count exactly the
skipped offsets in ``meshmq_messages_dropped_total{reason="expired"}``, log a warning, and
deliver everything from the start to the live end in strictly increasing offsets.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.devicelog import BrokerGroup, Publisher, log_list, log_position

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def brokers():
    group = BrokerGroup()
    yield group
    group.stop_all()


def test_replay_with_receive_maximum_1_reads_the_whole_history(brokers, tmp_path: Path):
    broker = brokers.start(tmp_path)
    pub = Publisher(broker.host, broker.port, "rm1-pub", window=16)
    pub.publish_all([("devices/rm1/t", b"%04d" % i) for i in range(30)])
    sub = R.RawClient(broker.host, broker.port, version=5, timeout=15)
    try:
        sub.connect("rm1-sub", properties={R.RECEIVE_MAXIMUM: 1})
        ack = sub.subscribe("devices/rm1/#", 1,
                            properties={R.USER_PROPERTY: [("offset", "earliest")]})
        assert ack.reason_codes == [1], ack
        got: list[int] = []
        while len(got) < 30:
            try:
                pkt = sub.expect(R.PUBLISH)
            except AssertionError as exc:
                raise AssertionError(f"replay stalled after offsets {got}: {exc}") from None
            sub.ack(pkt)
            got.append(log_position(pkt)[1])
        assert got == list(range(30)), got
    finally:
        sub.close()
        pub.close()


def test_retention_overtaking_a_replay_skips_ahead_and_counts_it(brokers, tmp_path: Path):
    broker = brokers.start(tmp_path, commitlog={
        "segment_bytes": 4096, "index_interval_bytes": 256, "retention_bytes_per_device": 6000,
        "checkpoint_interval_s": 0.2, "tail_cache_bytes_per_device": 0,
    })
    pub = Publisher(broker.host, broker.port, "rt-pub", window=16)
    pub.publish_all([("devices/rt/t", b"%04d" % i + b"p" * 196) for i in range(20)])

    sub = R.RawClient(broker.host, broker.port, version=5, timeout=15)
    try:
        sub.connect("rt-sub", properties={R.RECEIVE_MAXIMUM: 1})
        ack = sub.subscribe("devices/rt/#", 1,
                            properties={R.USER_PROPERTY: [("offset", "earliest")]})
        assert ack.reason_codes == [1], ack
        first = sub.expect(R.PUBLISH)  # offset 0; not acknowledged: the replay stalls
        offsets = [log_position(first)[1]]
        assert offsets == [0], first
        expired_before = broker.metric("meshmq_messages_dropped_total", reason="expired")
        log_mark = broker.log_size()

        pub.publish_all([("devices/rt/t", b"%04d" % i + b"p" * 196) for i in range(20, 200)])
        start = wait_for(lambda: log_list(broker)["rt"][0] > 10, timeout=30,
                         message="retention to move the start of devices/rt past offset 10")
        assert start
        end = log_list(broker)["rt"][1]

        sub.ack(first)
        while offsets[-1] != end - 1:
            try:
                pkt = sub.expect(R.PUBLISH)
            except AssertionError as exc:
                raise AssertionError(f"replay stopped after offsets {offsets} (log {start=} "
                                     f"{end=}): {exc}\n{broker.log_since(log_mark)[-3000:]}"
                                     ) from None
            sub.ack(pkt)
            offsets.append(log_position(pkt)[1])
            assert pkt.payload[:4] == b"%04d" % offsets[-1], pkt
        assert offsets == sorted(set(offsets)), f"a duplicate or a step back: {offsets}"
        skipped = (end - len(offsets))
        assert skipped > 0, f"retention never overtook the replay: {offsets}"
        # every offset not delivered was counted as expired, exactly
        wait_for(lambda: broker.metric("meshmq_messages_dropped_total", reason="expired")
                 - expired_before == skipped, timeout=10,
                 message=f"dropped_total{{reason=expired}} to grow by {skipped}")
        assert "replay cursor fell behind retention" in broker.log_since(log_mark)
        # and the subscription is live now: the next publish arrives at the next offset
        pub.publish_all([("devices/rt/t", b"%04d" % end + b"live")])
        pkt = sub.expect(R.PUBLISH)
        assert log_position(pkt)[1] == end and pkt.payload.endswith(b"live"), pkt
    finally:
        sub.close()
        pub.close()
