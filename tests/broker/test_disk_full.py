"""A really full disk (a 2 MiB tmpfs) never acknowledges what it did not store (issue 11, item 1).

The issue's reproduction: on a 2 MiB tmpfs data dir, QoS 1 publishers got PUBACK 0x00 (with an
``offset``) for messages that were never stored, and offsets were handed to two messages. Here a
real broker writes its commit log to a real tmpfs (``mount -t tmpfs -o size=2m``; needs root,
skipped with the reason otherwise), MQTT 5 and 3.1.1 publishers flood QoS 1 until the volume is
full, and after a clean restart:

* every PUBACK 0x00 names (device, offset) and that offset holds exactly the acked payload;
* no refused publish (v5 0x80 with a reason string) is in the log; a 3.1.1 publisher is
  disconnected instead of acknowledged;
* ``/readyz`` answers 503 with a reason while the log cannot write, and 200 again once space
  is freed (a filler file removed), and publishing resumes without a restart.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import pytest
from helpers.broker import wait_for
from helpers.devicelog import BrokerGroup, ConnectionLost, Publisher
from helpers.volume import fill_rest, tmpfs_volume

from commitlog.store import LogStore

PAYLOAD = 700  # bytes: ~2,500 records would fill 2 MiB


@pytest.fixture
def tmpfs(tmp_path: Path):
    yield from tmpfs_volume(tmp_path)


@pytest.fixture
def brokers():
    group = BrokerGroup()
    yield group
    group.stop_all()


def readyz(broker) -> tuple[int, dict]:
    status, body = broker.http_get("/readyz")
    return status, json.loads(body)


def payload(tag: str, i: int) -> bytes:
    head = f"{tag}:{i}:".encode()
    return head + b"x" * (PAYLOAD - len(head))


def test_full_tmpfs_acks_only_what_is_stored(tmpfs: Path, brokers, tmp_path: Path):
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (512 * 1024))  # freed later: space comes back
    (tmpfs / "topfill").touch()  # created now: a full tmpfs refuses even a new name
    logdir = tmpfs / "log"
    broker = brokers.start(tmp_path, commitlog={"dir": str(logdir), "segment_bytes": 1 << 20})
    assert readyz(broker)[0] == 200

    # --- MQTT 5: flood until refusals come back --------------------------------------------
    pub = Publisher(broker.host, broker.port, "pub-v5", version=5, window=32)
    sent_v5 = 0
    deadline = time.monotonic() + 120
    refused_v5 = lambda: [a for a in pub.acks if a.reason_code >= 0x80]  # noqa: E731
    while len(refused_v5()) < 50:
        assert time.monotonic() < deadline, (
            f"no refusals after {sent_v5} publishes: {broker.metrics_text()[-2000:]}")
        while pub.has_room():
            pub.send("devices/v5dev/t", payload("v5", sent_v5))
            sent_v5 += 1
        pub.poll(0.5)
    pub.drain(60)
    refused = refused_v5()
    for a in refused:
        assert a.offset is None, f"a refused publish carries an offset: {a.packet!r}"
        reason = a.packet.properties.get(0x1F, "")
        assert "not stored" in reason, a.packet
    # --- now take the last bytes: the probe cannot succeed, the log stays failing -----------
    fill_rest(tmpfs / "topfill")
    late = pub.send("devices/v5dev/t", payload("v5", sent_v5))
    sent_v5 += 1
    pub.drain(60)
    assert pub.acks[-1].sent is late and pub.acks[-1].reason_code >= 0x80
    status, body = wait_for(lambda: (r := readyz(broker))[0] == 503 and r, timeout=30,
                            message="/readyz to report 503 while the log cannot write")
    assert str(logdir) in body["reason"] and "commit log cannot write" in body["reason"], body
    assert broker.metric("meshmq_log_writable") == 0

    # --- MQTT 3.1.1 while full: disconnected, never acknowledged ----------------------------
    v3 = Publisher(broker.host, broker.port, "pub-v3", version=4, window=8)
    sent_v3: list[bytes] = []
    with pytest.raises(ConnectionLost):
        for i in range(200):
            p = payload("v3", i)
            sent_v3.append(p)
            v3.send("devices/v3dev/t", p)
            v3.poll(0.2)
        v3.drain(30)
    assert not v3.acks, f"a 3.1.1 publisher was acknowledged on a full disk: {v3.acks[:3]}"
    with contextlib.suppress(OSError):
        v3.client.close()

    # --- free space: writes resume by themselves, no restart -------------------------------
    filler.unlink()
    (tmpfs / "topfill").unlink()
    wait_for(lambda: readyz(broker)[0] == 200, timeout=60,
             message="/readyz to come back after space was freed")
    after = pub.publish_all([("devices/v5dev/t", payload("v5", sent_v5 + i)) for i in range(20)],
                            timeout=60)
    sent_v5 += 20
    assert all(a.reason_code == 0 and a.offset is not None for a in after)
    v3b = Publisher(broker.host, broker.port, "pub-v3b", version=4, window=8)
    v3b.publish_all([("devices/v3dev/t", payload("v3b", i)) for i in range(10)], timeout=60)
    v3b.close()
    pub.close()

    dropped = broker.metric("meshmq_messages_dropped_total", reason="not_stored")
    assert dropped >= len(refused_v5()), (dropped, len(refused_v5()))
    assert broker.metric("meshmq_log_write_errors_total") >= 1
    assert broker.stop() == 0
    log_text = broker.log_text()
    assert f"Free disk space under {logdir}" in log_text

    # --- after a restart: every ack is stored at its offset, no refused message is stored --
    copy = tmp_path / "copy"
    shutil.copytree(logdir, copy)
    with LogStore.open(str(copy)) as st:
        v5recs = st.read("v5dev", 0, 100_000, 1 << 30)
        v3recs = st.read("v3dev", 0, 100_000, 1 << 30)
    assert [r.offset for r in v5recs] == list(range(len(v5recs)))
    by_offset = {r.offset: bytes(r.payload) for r in v5recs}
    acked = [a for a in pub.acks if a.reason_code == 0]
    assert len(acked) > 100
    assert len({a.offset for a in acked}) == len(acked), "an offset was acked twice"
    for a in acked:
        assert a.device == "v5dev"
        assert by_offset.get(a.offset) == a.sent.payload, (
            f"acked at offset {a.offset} but the log holds {by_offset.get(a.offset, b'')[:20]!r}")
    stored = set(by_offset.values())
    assert not [a for a in pub.acks if a.reason_code >= 0x80 and a.sent.payload in stored]
    assert len(stored) == len(acked), "the log holds a v5 publish that was not acknowledged"
    v3_stored = [bytes(r.payload) for r in v3recs]
    assert v3_stored[-10:] == [payload("v3b", i) for i in range(10)]
    broker.restart()
    assert readyz(broker)[0] == 200

    # --- a clean stop on a full disk is still clean, and loses nothing ---------------------
    fill_rest(tmpfs / "topfill")
    pub = Publisher(broker.host, broker.port, "pub-v5-end", version=5, window=4)
    for i in range(30):  # the segment's last page may still take a record or two
        pub.wait_window(time.monotonic() + 60)
        pub.send("devices/v5dev/t", payload("end", i))
    pub.drain(60)
    end_acked = [a for a in pub.acks if a.reason_code == 0]
    assert len(end_acked) < 30, "nothing was refused on a full volume"
    pub.close()
    assert broker.stop() == 0, broker.log_tail()
    (tmpfs / "topfill").unlink()
    broker.start()
    status, body = broker.http_get("/api/v1/logs/v5dev")
    assert status == 200 and json.loads(body)["end"] == len(v5recs) + len(end_acked), body
