"""Mid-segment corruption keeps every intact record after it (issue 11, item 5).

The issue's reproduction: 8 devices, many records, one flipped bit in a record written after the
last checkpoint; recovery used to cut the segment there (half the acked records gone, the bytes
not kept, the warning calling it a torn write). Real files, real bit flips, c and py paths.
"""

from __future__ import annotations

import os

from commitlog_testlib import payload_for

from commitlog.settings import LogSettings
from commitlog.store import LogStore

DEVICES = [f"dev{i}" for i in range(8)]
PER_DEVICE = 400


def build(path: str) -> tuple[int, list[tuple[str, int, int, int]]]:
    """Fill 8 devices, checkpoint halfway; return (checkpoint position, records after it as
    (key, offset, store position, length))."""
    with LogStore.open(path, LogSettings(tail_cache_bytes_per_device=0)) as st:
        for i in range(PER_DEVICE):
            for k in DEVICES:
                st.append(k, 1_000 + i, f"devices/{k}/t", 1, None, payload_for(k, i))
            if i % 10 == 9:
                st.flush_sync_commit()
            if i == PER_DEVICE // 2:
                st.flush_sync_commit()
                st.checkpoint()
                ckpt = st.committed_position
        st.flush_sync_commit()
        recs = []
        for k in DEVICES:
            dev = st._devices[k]
            for v in dev.apos or ():
                recs.append((k, -1, st.segments[-1].base + (v >> 32), v & 0xFFFFFFFF))
        # the files as a crash leaves them: no close (no final checkpoint)
        st._closed = True
        st._release_fds()
    return ckpt, sorted(recs, key=lambda r: r[2])


def flip(path: str, pos: int) -> None:
    seg = os.path.join(path, "00000000000000000000.log")
    with open(seg, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


def test_bit_flip_mid_segment_quarantines_one_record_and_keeps_the_rest(tmp_path, caplog):
    path = str(tmp_path / "log")
    ckpt, recs = build(path)
    after = [r for r in recs if r[2] > ckpt]
    victim = after[len(after) // 2]
    key, _, vpos, vlen = victim
    flip(path, vpos + vlen - 3)  # a payload byte: the header still names the device
    seg_size = os.path.getsize(os.path.join(path, "00000000000000000000.log"))
    with caplog.at_level("ERROR", logger="meshmq.commitlog"), LogStore.open(path) as st:
        assert st.stats.recovery_truncations == 0
        assert st.stats.corrupt_records == 1 and st.stats.corrupt_bytes == vlen
        assert os.path.getsize(os.path.join(path, "00000000000000000000.log")) == seg_size
        lost = None
        for k in DEVICES:
            assert st.log_range(k) == (0, PER_DEVICE), k
            got = st.read(k, 0, 100_000, 1 << 30)
            offs = [r.offset for r in got]
            if k == key:
                assert len(got) == PER_DEVICE - 1
                (lost,) = sorted(set(range(PER_DEVICE)) - set(offs))
                assert st._devices[k].gaps == [(lost, lost + 1)]
                # a read starting in the gap skips it
                assert st.read(k, lost, 1)[0].offset == lost + 1
            else:
                assert offs == list(range(PER_DEVICE))
            for r in got:
                assert r.payload == payload_for(k, r.offset)
        # appends continue after the end: no offset is handed out twice
        assert st.append(key, 1, "t", 1, None, b"new") == PER_DEVICE
        st.flush_sync_commit()
    qdir = os.path.join(path, "quarantine")
    files = [f for f in os.listdir(qdir) if f.endswith(".bad")]
    assert len(files) == 1 and files[0].startswith(f"{key}-") and files[0].endswith(f"-{vlen}.bad")
    assert os.path.getsize(os.path.join(qdir, files[0])) == vlen
    msgs = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("quarantined" in m and key in m and f"{vlen} corrupt bytes" in m
               and str(lost) in m for m in msgs), msgs
    # the gap survives a restart from a checkpoint past it (no rescan of the bad bytes)
    with LogStore.open(path) as st:
        assert len(st.read(key, 0, 100_000, 1 << 30)) == PER_DEVICE
        assert st.read(key, lost, 1)[0].offset == lost + 1


def test_torn_tail_is_still_truncated(tmp_path):
    path = str(tmp_path / "log")
    _, recs = build(path)
    key, _, pos, length = recs[-1]
    seg = os.path.join(path, "00000000000000000000.log")
    os.truncate(seg, pos + length // 2)
    with LogStore.open(path) as st:
        assert st.stats.recovery_truncations == 1 and st.stats.corrupt_records == 0
        assert os.path.getsize(seg) == pos
        assert st.log_range(key) == (0, PER_DEVICE - 1)
    assert not os.path.exists(os.path.join(path, "quarantine"))


def test_damaged_length_in_a_sealed_segment_keeps_later_segments(tmp_path, small_settings):
    """A flipped bit in a record's length field (the walk cannot step over it) in a sealed
    segment, no checkpoint (full rescan): the scan resynchronises on the next valid record,
    every later segment is kept, and `log inspect` shows the range as quarantined."""
    from commitlog.inspect import inspect
    from commitlog.record import HEADER

    path = tmp_path / "log"
    with LogStore.open(str(path), small_settings) as st:
        for i in range(60):
            for k in DEVICES[:4]:
                st.append(k, 1_000 + i, f"devices/{k}/t", 1, None, payload_for(k, i))
            st.flush_sync_commit()
    (path / "index.ckpt").unlink()
    segs = sorted(path.glob("*.log"))
    assert len(segs) >= 4
    victim = segs[1]
    data = bytearray(victim.read_bytes())
    p = 0
    for _ in range(5):  # the 6th record of the segment
        p += 4 + HEADER.unpack_from(data, p)[0]
    data[p + 1] ^= 0x40  # length field: now points far past the record
    victim.write_bytes(bytes(data))
    assert not inspect(str(path)).ok
    with LogStore.open(str(path), small_settings) as st:
        assert st.stats.recovery_truncations == 0 and st.stats.corrupt_records == 1
        assert len(st.segments) == len(segs)
        lost = 0
        for k in DEVICES[:4]:
            assert st.log_range(k) == (0, 60)
            got = st.read(k, 0, 1000, 1 << 30)
            lost += 60 - len(got)
            assert all(r.payload == payload_for(k, r.offset) for r in got)
        assert lost == 1
    rep = inspect(str(path))
    assert rep.ok, rep.format()
    assert len(rep.quarantine_files) == 1 and sum(len(v) for v in rep.gaps.values()) == 1
    text = rep.format()
    assert "quarantined (skipped by recovery)" in text and "offsets lost" in text


def test_gap_is_skipped_when_the_position_index_is_rebuilt(tmp_path, small_settings):
    """A sealed segment's .pidx rebuilt by a header-only walk lists the quarantined record
    again (its header is intact): readers must still skip it, not raise a CRC error."""
    from commitlog.record import HEADER

    path = tmp_path / "log"
    with LogStore.open(str(path), small_settings) as st:
        for i in range(60):
            for k in DEVICES[:4]:
                st.append(k, 1_000 + i, f"devices/{k}/t", 1, None, payload_for(k, i))
            st.flush_sync_commit()
    (path / "index.ckpt").unlink()
    victim = sorted(path.glob("*.log"))[1]
    data = bytearray(victim.read_bytes())
    p = 4 + HEADER.unpack_from(data, 0)[0]  # the 2nd record of the segment
    length = HEADER.unpack_from(data, p)[0]
    data[p + 4 + length - 2] ^= 0x01  # its payload
    victim.write_bytes(bytes(data))
    with LogStore.open(str(path), small_settings) as st:
        assert st.stats.corrupt_records == 1
    for f in path.glob("*.pidx"):
        f.unlink()
    with LogStore.open(str(path), small_settings) as st:
        total = 0
        for k in DEVICES[:4]:
            got = st.read(k, 0, 1000, 1 << 30)
            total += len(got)
            assert all(r.payload == payload_for(k, r.offset) for r in got)
        assert total == 4 * 60 - 1
