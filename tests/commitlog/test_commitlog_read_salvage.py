"""A reader that meets a corrupt record recovery never scanned (issue 28, item 7).

A clean close writes a checkpoint covering everything, so opening the store scans nothing;
then one field of one record is damaged on disk. Every read path (``read``, ``read_raw``,
``iter_records``) must return every other record, skip the damaged one as a gap (kept in
gaps.json, counted once, never renumbered) and never raise, whichever field was hit (length,
CRC, magic, offset, key, payload), in a sealed segment or the active one, with or without the
sealed segments' ``.pidx`` files (a rebuilt index), and with the active segment read by the
header-walk fallback. c and py paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from commitlog_testlib import payload_for

from commitlog.fetch import decode_batch
from commitlog.record import HEADER, HEADER_SIZE
from commitlog.settings import LogSettings
from commitlog.store import LogStore

DEVICES = [f"dev{i}" for i in range(4)]
N = 60
# field -> (byte within the record, xor mask)
FIELDS = {
    "length": (1, 0x40),  # far past the segment: the framing fails
    "length_small": (0, 0x08),  # a plausible length: the CRC fails
    "crc": (5, 0x10),
    "magic": (8, 0x10),
    "offset": (12, 0x10),
    "key": (HEADER_SIZE + 3, 0x10),
    "payload": (-2, 0x01),
}


def build(path: Path, settings: LogSettings) -> None:
    with LogStore.open(str(path), settings) as st:
        for i in range(N):
            for k in DEVICES:
                st.append(k, 1_000 + i, f"devices/{k}/t", 1, None, payload_for(k, i))
            st.flush_sync_commit()
    # closed cleanly: the checkpoint covers the whole log, opening scans nothing


def damage(seg: Path, key: str, nth: int, field: str) -> int:
    """Damage ``field`` of the ``nth`` record of ``key`` in ``seg``; return its offset."""
    data = bytearray(seg.read_bytes())
    p, seen = 0, 0
    while p + HEADER_SIZE <= len(data):
        length, _c, _m, _f, _a, off, _ts, kl, _tl, _hc = HEADER.unpack_from(data, p)
        if data[p + HEADER_SIZE : p + HEADER_SIZE + kl] == key.encode():
            if seen == nth:
                at, mask = FIELDS[field]
                data[p + at if at >= 0 else p + 4 + length + at] ^= mask
                seg.write_bytes(bytes(data))
                return off
            seen += 1
        p += 4 + length
    raise AssertionError(f"no {nth}th record of {key} in {seg}")


@pytest.mark.parametrize("pidx", ["pidx", "no_pidx", "scan"])
@pytest.mark.parametrize("where", ["sealed", "active"])
@pytest.mark.parametrize("field", list(FIELDS))
def test_every_read_path_skips_a_damaged_record_found_after_a_clean_close(
        tmp_path: Path, small_settings: LogSettings, field: str, where: str, pidx: str):
    path = tmp_path / "log"
    build(path, small_settings)
    segs = sorted(path.glob("*.log"))
    assert len(segs) >= 4
    lost = damage(segs[1] if where == "sealed" else segs[-1], DEVICES[0], 2, field)
    if pidx != "pidx":
        for f in path.glob("*.pidx"):
            f.unlink()
    want = {k: [o for o in range(N) if (k, o) != (DEVICES[0], lost)] for k in DEVICES}

    with LogStore.open(str(path), small_settings) as st:
        assert st.stats.corrupt_records == 0  # nothing scanned at open
        if pidx == "scan":
            st._apos_ok = False  # the active segment read by the header-walk fallback
        for k in DEVICES:
            got = st.read(k, 0, 1000, 1 << 30)
            assert [r.offset for r in got] == want[k], k
            assert all(r.payload == payload_for(k, r.offset) for r in got)
        assert st.stats.corrupt_records == 1
        assert st.lost_ranges(DEVICES[0], 0, N) == [(lost, lost + 1)]
        assert st.log_range(DEVICES[0]) == (0, N)  # nothing renumbered
        for k in DEVICES:
            chunks, count, nxt = st.read_raw(k, 0, 1000, 1 << 30)
            recs = decode_batch(b"".join(chunks))
            assert [r.offset for r in recs] == want[k] and count == len(recs), k
            assert [r.offset for r in st.iter_records(k)] == want[k], k
            # reading from the lost offset itself goes on past it
            if k == DEVICES[0]:
                after = st.read(k, lost, 1000, 1 << 30)
                assert [r.offset for r in after] == [o for o in want[k] if o > lost]
        assert st.stats.corrupt_records == 1
        assert st.append(DEVICES[0], 9_999, "devices/dev0/t", 1, None, b"new") == N
        st.flush_sync_commit()
    want[DEVICES[0]].append(N)

    with LogStore.open(str(path), small_settings) as st:  # the gap is remembered
        for k in DEVICES:
            got = st.read(k, 0, 1000, 1 << 30)
            assert [r.offset for r in got] == want[k], k
        assert st.stats.corrupt_records == 0  # the same bytes again: not new corruption


def test_each_reader_reports_only_its_own_loss(tmp_path: Path, small_settings: LogSettings):
    """Two damaged records of two devices in one segment, dev1's first: the walk a read of
    dev0 makes crosses dev1's damage too, but reports and counts only dev0's loss; dev1's
    own reader reports dev1's."""
    path = tmp_path / "log"
    build(path, small_settings)
    seg = sorted(path.glob("*.log"))[1]
    lost1 = damage(seg, DEVICES[1], 1, "payload")
    lost0 = damage(seg, DEVICES[0], 2, "length")
    with LogStore.open(str(path), small_settings) as st:
        got = st.read(DEVICES[0], 0, 1000, 1 << 30)
        assert [r.offset for r in got] == [o for o in range(N) if o != lost0]
        assert st.stats.corrupt_records == 1
        assert st.lost_ranges(DEVICES[0], 0, N) == [(lost0, lost0 + 1)]
        assert st.lost_ranges(DEVICES[1], 0, N) == []
        dev1_bytes = st.stats.corrupt_bytes
        got = st.read(DEVICES[1], 0, 1000, 1 << 30)
        assert [r.offset for r in got] == [o for o in range(N) if o != lost1]
        assert st.stats.corrupt_records == 2
        assert st.lost_ranges(DEVICES[1], 0, N) == [(lost1, lost1 + 1)]
        assert st.stats.corrupt_bytes > dev1_bytes
    names = sorted(p.name.split("-")[0] for p in (path / "quarantine").glob("*.bad"))
    assert names == ["dev0", "dev1"]
