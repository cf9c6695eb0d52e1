"""A retained-state record lost to corruption at a restart is counted where the operator looks
for it (review of issue 28, item 7).

``meshmq_persistence_restored{kind="corrupt_records"}`` and the "restored ... retained
messages" line say how many state records could not be read back at start. Since readers
salvage a corrupt record themselves (commitlog/salvage.py), the state log's replay no longer
saw an exception for it and both said 0 while a retained message was gone (the commit log's
own ERROR line and ``meshmq_log_corrupt_records_total`` did say it). The replay now counts
the offsets the store reports lost in the range it read.

Real broker, raw MQTT 5: five retained messages on an unlogged topic, SIGTERM (the checkpoint
covers them: nothing is scanned at start), one payload byte of the third ``#retained`` record
flipped, start again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc
from helpers.clients import unique
from helpers.devicelog import log_dir

from commitlog.record import HEADER, HEADER_SIZE

pytestmark = pytest.mark.timeout(90)


def flip_nth_retained(seg: Path, nth: int) -> None:
    data = bytearray(seg.read_bytes())
    p, seen = 0, 0
    while p + HEADER_SIZE <= len(data):
        length, _c, _m, _f, _a, _off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
        if data[p + HEADER_SIZE : p + HEADER_SIZE + kl] == b"#retained":
            if seen == nth:
                data[p + 4 + length - 1] ^= 0x01
                seg.write_bytes(bytes(data))
                return
            seen += 1
        p += 4 + length
    raise AssertionError(f"no #retained record {nth} in {seg}")


def test_lost_retained_record_is_counted_at_restart(tmp_path: Path):
    broker = BrokerProc(tmp_path / "b", ws=False).start()
    base = unique("rc")
    try:
        c = R.RawClient(broker.host, broker.port, version=5)
        c.connect(unique("rcpub"))
        for i in range(5):
            c.send(R.publish(f"u/{base}/{i}", f"v{i}".encode(), qos=1, packet_id=i + 1,
                             retain=True, version=5))
            c.expect(R.PUBACK)
        c.close()
        assert broker.stop() == 0
        (seg,) = sorted(log_dir(broker).glob("*.log"))
        flip_nth_retained(seg, 2)
        broker.start()
        assert broker.metric("meshmq_persistence_restored", kind="retained") == 4
        assert broker.metric("meshmq_persistence_restored", kind="corrupt_records") == 1
        restored = [ln for ln in broker.log_text().splitlines()
                    if "retained messages" in ln and "restored" in ln][-1]
        assert "corrupt_records=1" in restored, restored
    finally:
        broker.stop()
