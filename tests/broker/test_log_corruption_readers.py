"""A corrupt record found by a reader, not by recovery, never makes a device unreadable
(issue 28, item 7).

After a clean shutdown (SIGTERM) the checkpoint covers the whole log, so start-up scans nothing
and a byte flipped on disk afterwards is met by the first reader instead. Reproduced on a real
broker: 300 QoS 1 records of one device (after 40 of another, so the flipped record sits among
intact ones or, for the tail case, is the last record of the segment), SIGTERM, one byte
flipped in a record's payload, in its length field, or in the segment's very last record;
start again and read by every path:

* ``GET /records`` pages through the 299 intact records, the lost offset named in
  ``X-Meshmq-Lost-Offsets``; ``POST /api/v1/fetch`` serves them too (the section's offsets and
  ``next_offset`` show the gap);
* ``meshmq log tail`` prints the 299 and exits 0, naming the lost offset on stderr;
* an MQTT replay from ``earliest`` delivers the 299 on a connection that stays open, the lost
  one counted in ``meshmq_messages_dropped_total{reason="corrupt"}``;
* the reader's discovery is handled as recovery's: an ERROR line naming the device and offset,
  ``meshmq_log_corrupt_records_total``, the bad bytes in quarantine/; the next publish gets
  offset 300 (offsets are never reused) and a restart keeps the gap.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers.broker import REPO_ROOT
from helpers.devicelog import (
    BrokerGroup,
    Publisher,
    Subscriber,
    fetch_all,
    fetch_records,
    log_dir,
    offsets_of,
)

from commitlog.fetch import decode_multi_fetch, decode_multi_records
from commitlog.record import HEADER, HEADER_SIZE

DEVICE = "d0"
N = 300


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


def flip(seg: Path, pos: int, mask: int = 0x04) -> None:
    with open(seg, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


def fetch_many(broker, device: str, offset: int) -> tuple[int, bytes]:
    body = json.dumps({"devices": [{"device": device, "offset": offset}],
                       "max_records_per_device": 1000}).encode()
    req = urllib.request.Request(f"http://{broker.host}:{broker.admin_port}/api/v1/fetch",
                                 data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("where", ["payload", "length", "tail"])
def test_flipped_byte_after_clean_shutdown_is_skipped_by_every_reader(brokers, tmp_path: Path,
                                                                      where: str):
    broker = brokers.start(tmp_path)
    pub = Publisher(broker.host, broker.port, "pub", version=5, window=32)
    items = [("devices/other/t", f"o:{i}".encode() * 4) for i in range(40)]
    items += [(f"devices/{DEVICE}/t", f"{DEVICE}:{i}".encode() * 8) for i in range(N)]
    acks = pub.publish_all(items, timeout=120)
    pub.close()
    acked = {a.offset: a.sent.payload for a in acks if a.device == DEVICE}
    assert sorted(acked) == list(range(N))
    assert broker.stop() == 0  # clean: the final checkpoint covers everything

    (seg,) = sorted(log_dir(broker).glob("*.log"))
    recs = records_of(seg)
    lost = N - 1 if where == "tail" else N // 2
    (key, off, pos, length) = next(r for r in recs if r[0] == DEVICE and r[1] == lost)
    if where == "length":
        flip(seg, pos + 1)  # the length field (not covered by the CRC): framing breaks
    else:
        flip(seg, pos + length - 5)  # a payload byte: the CRC catches it
    if where == "tail":
        assert recs[-1][:2] == (DEVICE, N - 1)
    want = [o for o in range(N) if o != lost]

    broker.start()
    # GET /records, paging with X-Meshmq-Next-Offset
    got = fetch_all(broker, DEVICE)
    assert [r.offset for r in got] == want
    assert all(bytes(r.payload) == acked[r.offset] for r in got)
    resp, page = fetch_records(broker, DEVICE, offset=lost - 2 if lost else 0, max_records=10)
    assert resp.headers.get("x-meshmq-lost-offsets") == f"{lost}-{lost + 1}", resp.headers
    # POST /api/v1/fetch (the Spark source's request)
    status, body = fetch_many(broker, DEVICE, 0)
    assert status == 200, body[:300]
    (sec,) = decode_multi_fetch(body)
    assert [r.offset for r in decode_multi_records(body)[DEVICE]] == want
    assert sec.next_offset == N
    # meshmq log tail
    res = subprocess.run([sys.executable, "-m", "meshmq", "log", "tail", DEVICE, "--admin",
                          f"{broker.host}:{broker.admin_port}", "--format", "json"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    assert res.returncode == 0, res.stdout[-500:] + res.stderr
    assert [json.loads(line)["offset"] for line in res.stdout.splitlines()] == want
    assert f"offsets {lost}..{lost} of '{DEVICE}' were lost to a corrupt record" in res.stderr
    # MQTT replay from earliest
    sub = Subscriber(broker.host, broker.port, "replayer")
    sub.subscribe(f"devices/{DEVICE}/#", 1, offset="earliest")
    msgs = sub.collect(N - 1, timeout=60)
    assert offsets_of(msgs, DEVICE) == want
    sub.expect_quiet(0.5)  # still connected, nothing more
    sub.close()
    assert broker.metric("meshmq_messages_dropped_total", reason="corrupt") >= 1

    # handled as recovery handles it
    assert broker.metric("meshmq_log_corrupt_records_total") == 1
    assert any("ERROR" in line and "quarantined" in line and f"'{DEVICE}'" in line
               and f"[{lost}, {lost + 1})" in line for line in broker.log_text().splitlines()), \
        broker.log_tail()
    assert list((log_dir(broker) / "quarantine").glob("*.bad"))
    pub = Publisher(broker.host, broker.port, "pub2", version=5)
    (ack,) = pub.publish_all([(f"devices/{DEVICE}/t", b"new")])
    assert ack.offset == N
    pub.close()

    broker.restart()  # the gap is remembered (gaps.json): readers still skip it, and meeting
    got = fetch_all(broker, DEVICE)  # the same bad bytes again is no new corruption
    assert [r.offset for r in got] == [*want, N]
    assert broker.metric("meshmq_log_corrupt_records_total") == 0


def test_offline_persistent_session_catches_up_around_a_corrupt_record(brokers,
                                                                        tmp_path: Path):
    """The catch-up path and the restored session's positions: a persistent QoS 1 session,
    offline while 300 records arrive (far more than its queue holds, so it lags on log
    positions), the broker stopped cleanly, offset 150 damaged, started again: the session
    reconnects and receives the other 299, in order, on a connection that stays open; the
    skipped offset is counted as dropped, reason ``corrupt``."""
    broker = brokers.start(tmp_path, mqtt={"max_queued_messages": 20})
    sub = Subscriber(broker.host, broker.port, "keeper", session_expiry=3600)
    sub.subscribe(f"devices/{DEVICE}/#", 1)
    sub.close()
    pub = Publisher(broker.host, broker.port, "pub", version=5, window=32)
    acks = pub.publish_all([(f"devices/{DEVICE}/t", f"{DEVICE}:{i}:".encode() * 8)
                            for i in range(N)], timeout=120)
    pub.close()
    assert sorted(a.offset for a in acks) == list(range(N))
    assert broker.stop() == 0

    (seg,) = sorted(log_dir(broker).glob("*.log"))
    lost = N // 2
    (_k, _o, pos, length) = next(r for r in records_of(seg) if r[:2] == (DEVICE, lost))
    flip(seg, pos + length - 5)
    broker.start()
    sub = Subscriber(broker.host, broker.port, "keeper", session_expiry=3600)
    assert sub.session_present
    msgs = sub.collect(N - 1, timeout=60)
    got = [int(m.payload.split(b":")[1]) for m in msgs]
    assert got == [o for o in range(N) if o != lost]
    sub.expect_quiet(0.5)
    sub.close()
    assert broker.metric("meshmq_log_corrupt_records_total") == 1
    assert broker.metric("meshmq_messages_dropped_total", reason="corrupt") == 1
