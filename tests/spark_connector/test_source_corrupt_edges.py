"""A record lost to corruption at the very start or the very end of a device's log is data loss
to the Spark source too (review of issue 28, item 7).

The merged test flips offset 150 of 300, where records on both sides tell the source what is
missing. At the edges there is nothing on one side: offset 0 lost means the first record served
is 1 (a gap before any record); the last offset lost means the section ends with no record
after the gap, only its ``next_offset`` (and, read alone, no record at all). Kafka's meaning of
failOnDataLoss either way: true fails naming the device and range, false skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.devicelog import log_dir
from helpers.spark import admin, device_messages, publish, unique_device

from commitlog.record import HEADER, HEADER_SIZE

N = 40


def flip_payload(seg: Path, device: str, offset: int) -> None:
    data = bytearray(seg.read_bytes())
    p = 0
    while p + HEADER_SIZE <= len(data):
        length, _c, _m, _f, _a, off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
        if data[p + HEADER_SIZE : p + HEADER_SIZE + kl] == device.encode() and off == offset:
            data[p + 4 + length - 1] ^= 0x01
            seg.write_bytes(bytes(data))
            return
        p += 4 + length
    raise AssertionError(f"no record {device}@{offset} in {seg}")


@pytest.mark.parametrize("lost", [0, N - 1], ids=["first", "last"])
def test_corrupt_first_or_last_record_fails_or_is_skipped(spark: Any, new_broker: Any,
                                                          lost: int) -> None:
    broker = new_broker()
    dev = unique_device("e")
    publish(broker, device_messages(dev, 0, N))
    assert broker.stop() == 0
    (seg,) = sorted(log_dir(broker).glob("*.log"))
    flip_payload(seg, dev, lost)
    broker.start()

    def read(**options: str) -> list[Any]:
        reader = spark.read.format("meshmq").option("servers", admin(broker)) \
            .option("devices", dev)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load().collect()

    with pytest.raises(Exception) as info:
        read()
    msg = str(info.value)
    assert dev in msg and f"[{lost}, {lost + 1})" in msg and "failOnDataLoss" in msg, msg[:3000]

    rows = read(failOnDataLoss="false")
    assert sorted(r["offset"] for r in rows) == [o for o in range(N) if o != lost]
