"""Device position index: one device's history is read without touching other devices'
records, across sealed segments (``.pidx`` files) and the active one (in memory /
checkpoint), with the files present, missing, damaged, and after torn tails/rollbacks."""

from __future__ import annotations

import errno
import os
import shutil

import pytest
from commitlog_testlib import crash_image, fill, payload_for

from commitlog.record import encoded_size
from commitlog.settings import LogSettings
from commitlog.store import CHECKPOINT_NAME, PIDX_SUFFIX, LogStore

KEYS = [f"dev-{i}" for i in range(9)]


def check_all(store: LogStore, keys: list[str], per_key: int) -> None:
    for k in keys:
        assert store.log_range(k) == (0, per_key)
        recs = list(store.iter_records(k))
        assert [r.offset for r in recs] == list(range(per_key))
        assert [r.payload for r in recs] == [payload_for(k, i) for i in range(per_key)]
        assert all(r.key == k and r.topic == f"t/{k}" for r in recs)
        # reads starting in the middle (index entry + jump) and short ones
        for off in (0, per_key // 3, per_key - 1):
            got = store.read(k, off, 7)
            assert [r.offset for r in got] == list(range(off, min(per_key, off + 7)))


def pidx_files(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(PIDX_SUFFIX))


def test_pidx_written_for_sealed_segments_only(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, KEYS, 40)
        segs = st.segments
        assert len(segs) > 3
        check_all(st, KEYS, 40)
    names = pidx_files(tmp_path)
    assert names == sorted(os.path.basename(s.path)[:-4] + PIDX_SUFFIX for s in segs[:-1])


@pytest.mark.parametrize("damage", ["none", "delete_pidx", "corrupt_pidx", "no_checkpoint",
                                    "everything"])
def test_reads_after_reopen(tmp_path, small_settings, damage, caplog):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, KEYS, 40)
    names = pidx_files(tmp_path)
    if damage in ("delete_pidx", "everything"):
        for n in names:
            os.unlink(tmp_path / n)
    if damage == "corrupt_pidx":
        for n in names:
            data = bytearray((tmp_path / n).read_bytes())
            data[len(data) // 2] ^= 0x10
            (tmp_path / n).write_bytes(bytes(data))
    if damage in ("no_checkpoint", "everything"):
        (tmp_path / CHECKPOINT_NAME).unlink()
    with caplog.at_level("WARNING", logger="meshmq.commitlog"):
        with LogStore.open(str(tmp_path), small_settings) as st:
            check_all(st, KEYS, 40)
    if damage == "corrupt_pidx":
        assert any("position index" in r.getMessage() for r in caplog.records)
    assert pidx_files(tmp_path) == names  # rebuilt where missing or bad


def test_read_touches_only_the_devices_records(tmp_path, monkeypatch):
    s = LogSettings(segment_bytes=64 * 1024, tail_cache_bytes_per_device=0, retention_ms=0)
    keys = [f"d{i:03d}" for i in range(200)]
    with LogStore.open(str(tmp_path), s) as st:
        fill(st, keys, 30, batch=400)
    with LogStore.open(str(tmp_path), s) as st:
        assert len(st.segments) > 3
        st.read("d000", 0, 1)  # load what the first read loads (index files)
        for seg in st.segments[:-1]:
            st._sealed_positions(seg)
        read_bytes = []
        real = os.pread

        def counting(fd, n, off):
            read_bytes.append(n)
            return real(fd, n, off)

        monkeypatch.setattr(os, "pread", counting)
        recs = st.read("d117", 0, 1000, 1 << 30)
        assert [r.payload for r in recs] == [payload_for("d117", i) for i in range(30)]
        assert sum(read_bytes) == sum(encoded_size(r) for r in recs)


def test_batch_groups_records_by_device(tmp_path):
    """One flush of interleaved appends puts each device's records next to each other,
    so a device's share of a batch is one contiguous range (one pread)."""
    s = LogSettings(tail_cache_bytes_per_device=0)
    with LogStore.open(str(tmp_path), s) as st:
        for i in range(30):
            for k in ("a", "b", "c"):
                st.append(k, i, "t", 0, None, b"%s%d" % (k.encode(), i))
        st.flush_sync_commit()
        for k in ("a", "b", "c"):
            ap = st._devices[k].apos
            starts = [v >> 32 for v in ap]
            ends = [(v >> 32) + (v & 0xFFFFFFFF) for v in ap]
            assert starts[1:] == ends[:-1]
            assert [r.payload for r in st.read(k, 0, 100)] == [
                b"%s%d" % (k.encode(), i) for i in range(30)]


def test_torn_tail_inside_a_multi_device_batch(tmp_path, small_settings):
    src = tmp_path / "live"
    st = LogStore.open(str(src), small_settings)
    fill(st, KEYS[:3], 6)
    st.checkpoint()
    for k in KEYS[:3]:  # one batch, three devices, two records each
        for i in (6, 7):
            st.append(k, 9, f"t/{k}", 1, None, payload_for(k, i))
    st.flush_sync_commit()
    img0 = crash_image(src, tmp_path / "img0")
    st.close()
    seg = sorted(img0.glob("*.log"))[-1]
    full = seg.read_bytes()
    batch_bytes = sum(len(payload_for(k, i)) + 34 + len(k) + 2 + len(k)
                      for k in KEYS[:3] for i in (6, 7))
    start = len(full) - batch_bytes
    for cut in range(start, len(full) + 1, 3):
        img = tmp_path / "cut"
        if img.exists():
            shutil.rmtree(img)
        shutil.copytree(img0, img)
        with open(img / seg.name, "r+b") as f:
            f.truncate(cut)
        with LogStore.open(str(img), small_settings) as st2:
            ends = {k: st2.log_range(k)[1] for k in KEYS[:3]}
            # grouped by device: a cut keeps a prefix of (a6 a7 b6 b7 c6 c7)
            kept = sum(e - 6 for e in ends.values())
            order = [e - 6 for e in ends.values()]
            assert order == sorted(order, reverse=True) and kept <= 6
            for k in KEYS[:3]:
                recs = list(st2.iter_records(k))
                assert [r.payload for r in recs] == [payload_for(k, i) for i in range(ends[k])]
                assert st2.append(k, 10, f"t/{k}", 1, None, b"again") == ends[k]
            st2.flush_sync_commit()
            for k in KEYS[:3]:
                assert st2.read(k, ends[k])[0].payload == b"again"
        with LogStore.open(str(img), small_settings) as st3:
            for k in KEYS[:3]:
                assert st3.read(k, ends[k])[0].payload == b"again"
                assert st3.read(k, 0, 1)[0].payload == payload_for(k, 0)


def test_checkpoint_taken_between_roll_and_commit(tmp_path, small_settings):
    """Checkpoint position inside a just-sealed segment: positions before it are rebuilt
    by a header walk at recovery."""
    src = tmp_path / "live"
    st = LogStore.open(str(src), small_settings)
    fill(st, KEYS[:3], 10)
    nseg = len(st.segments)
    i = 10
    while len(st.segments) == nseg:  # flush (no commit) until a batch rolls the segment
        for k in KEYS[:3]:
            st.append(k, 5, f"t/{k}", 1, None, payload_for(k, i))
        i += 1
        st.flush()
    st.write_checkpoint(st.snapshot_checkpoint())  # committed position is in the old one
    st.commit(st.sync())
    img = crash_image(src, tmp_path / "img")
    st.close()
    for f in img.glob("*" + PIDX_SUFFIX):
        f.unlink()
    with LogStore.open(str(img), small_settings) as st2:
        assert st2.stats.index_rebuilds == 0
        check_all(st2, KEYS[:3], i)


class FailingWriteStore(LogStore):
    fail_next_write = False

    def _write_all(self, buf: bytearray) -> None:
        if self.fail_next_write:
            self.fail_next_write = False
            super()._write_all(buf[: len(buf) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._write_all(buf)


def test_rollback_of_a_rolling_batch_reactivates_positions(tmp_path, small_settings):
    st = FailingWriteStore.open(str(tmp_path), small_settings)
    fill(st, KEYS[:3], 10)
    nseg = len(st.segments)
    st.fail_next_write = True
    for k in KEYS[:3]:
        for j in range(40):  # large enough to roll
            st.append(k, 5, f"t/{k}", 1, None, b"lost%d" % j)
    with pytest.raises(OSError):
        st.flush()
    assert len(st.segments) == nseg + 1
    st.rollback()
    assert len(st.segments) == nseg
    check_all(st, KEYS[:3], 10)
    for k in KEYS[:3]:
        st.append(k, 5, f"t/{k}", 1, None, payload_for(k, 10))
    st.flush_sync_commit()
    check_all(st, KEYS[:3], 11)
    st.close()
    with LogStore.open(str(tmp_path), small_settings) as st2:
        check_all(st2, KEYS[:3], 11)
