"""One flipped bit mid-segment no longer deletes the acked records after it (issue 11, item 5).

The issue's reproduction on a real broker: 8 devices publish QoS 1 (MQTT 5, every PUBACK names
its offset), the broker is killed with SIGKILL (so no checkpoint covers the tail), one bit is
flipped in the payload of a record in the middle of the segment and one in the last record of
a device (followed by other devices' records, so not a torn tail), and the broker restarts:

* every other acknowledged record is still there at its offset (fetch API and replay);
* the two corrupt records are in quarantine/, reported at ERROR with device, offsets and byte
  counts, counted by ``meshmq_log_corrupt_records_total`` / ``..._bytes_total``;
* readers skip the lost offsets (a replay from earliest, the fetch API paging to the end);
  that device's next publish gets a new offset, never the lost one;
* ``meshmq log inspect`` reports the quarantined ranges and exits 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.broker import REPO_ROOT
from helpers.devicelog import BrokerGroup, Publisher, Subscriber, fetch_all, log_dir, offsets_of

from commitlog.record import HEADER, HEADER_SIZE

DEVICES = [f"d{i}" for i in range(8)]
PER_DEVICE = 150


@pytest.fixture
def brokers():
    group = BrokerGroup()
    yield group
    group.stop_all()


def records_of(seg: Path) -> list[tuple[str, int, int, int]]:
    """(key, offset, position, length) of every record in a segment file."""
    data = seg.read_bytes()
    out, p = [], 0
    while p + HEADER_SIZE <= len(data):
        length, _c, _m, _f, _a, off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
        out.append((data[p + HEADER_SIZE : p + HEADER_SIZE + kl].decode(), off, p, 4 + length))
        p += 4 + length
    return out


def flip(seg: Path, pos: int) -> None:
    with open(seg, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x04]))


def test_bit_flip_mid_segment_keeps_every_later_record(brokers, tmp_path: Path):
    broker = brokers.start(tmp_path, commitlog={"checkpoint_interval_s": 3600})
    pub = Publisher(broker.host, broker.port, "pub", version=5, window=32)
    items = [(f"devices/{d}/t", f"{d}:{i}".encode() * 8)
             for i in range(PER_DEVICE) for d in DEVICES]
    acks = pub.publish_all(items, timeout=120)
    pub.close()
    acked = {(a.device, a.offset): a.sent.payload for a in acks}
    assert len(acked) == len(items)
    broker.kill()  # no final checkpoint: recovery scans the whole tail

    (seg,) = sorted(log_dir(broker).glob("*.log"))
    recs = records_of(seg)
    mid_key, mid_off, mid_pos, mid_len = recs[len(recs) // 2]
    # a device whose last record is followed by other devices' records (so not a torn tail)
    tail_dev = next(d for d in DEVICES if d != recs[-1][0])
    last_rec = max((r for r in recs if r[0] == tail_dev), key=lambda r: r[1])
    assert last_rec != recs[-1] and last_rec[:2] != (mid_key, mid_off)
    flip(seg, mid_pos + mid_len - 5)
    flip(seg, last_rec[2] + last_rec[3] - 5)
    lost = {(mid_key, mid_off), (tail_dev, last_rec[1])}

    broker.start()
    assert broker.metric("meshmq_log_corrupt_records_total") == 2
    assert broker.metric("meshmq_log_corrupt_bytes_total") == mid_len + last_rec[3]
    assert broker.metric("meshmq_log_recovery_truncations_total") == 0
    text = broker.log_text()
    for key, off in lost:
        assert any("ERROR" in line and "quarantined" in line and key in line and str(off) in line
                   for line in text.splitlines()), f"no ERROR line for {key}@{off}"
    qfiles = sorted((log_dir(broker) / "quarantine").glob("*.bad"))
    assert len(qfiles) == 2

    for d in DEVICES:
        got = fetch_all(broker, d)
        want = [(d, o) for o in range(PER_DEVICE) if (d, o) not in lost]
        assert [(r.key, r.offset) for r in got] == want, d
        assert all(bytes(r.payload) == acked[(d, r.offset)] for r in got)
    # replay from earliest skips the gap in the middle and the one at a device's end
    for d in {mid_key, tail_dev}:
        sub = Subscriber(broker.host, broker.port, f"sub-{d}")
        sub.subscribe(f"devices/{d}/#", 1, offset="earliest")
        n = PER_DEVICE - sum(1 for k, _ in lost if k == d)
        msgs = sub.collect(n, timeout=30)
        assert offsets_of(msgs, d) == [o for o in range(PER_DEVICE) if (d, o) not in lost]
        sub.close()
    # the lost last offset is never handed to a new message
    pub = Publisher(broker.host, broker.port, "pub2", version=5)
    (ack,) = pub.publish_all([(f"devices/{tail_dev}/t", b"new")])
    assert ack.offset == PER_DEVICE
    pub.close()
    assert broker.stop() == 0

    res = subprocess.run([sys.executable, "-m", "meshmq", "log", "inspect", str(log_dir(broker))],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("quarantined (skipped by recovery)") == 2, res.stdout
    assert "offsets lost to quarantined corruption" in res.stdout
