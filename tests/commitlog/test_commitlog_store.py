"""LogStore behaviour on real files: offsets, reads, seeks, rolls, retention, recovery."""

from __future__ import annotations

import os
import shutil

import pytest
from commitlog_testlib import crash_image, fill, payload_for

from commitlog import store as store_mod
from commitlog.inspect import inspect
from commitlog.settings import LogSettings
from commitlog.store import CHECKPOINT_NAME, LogStore, LogStoreError, OffsetOutOfRangeError

KEYS = [f"dev-{i}" for i in range(7)]


def check_all(store: LogStore, keys: list[str], per_key: int, start: int = 0) -> None:
    for k in keys:
        assert store.log_range(k) == (start, per_key)
        recs = list(store.iter_records(k))
        assert [r.offset for r in recs] == list(range(start, per_key))
        assert [r.payload for r in recs] == [payload_for(k, i) for i in range(start, per_key)]
        assert all(r.key == k and r.topic == f"t/{k}" and r.attrs == 1 for r in recs)


def test_dense_offsets_and_read(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, KEYS, 40)
        check_all(st, KEYS, 40)
        assert len(st.segments) > 3  # rolled
        recs = st.read("dev-3", 17, max_records=5)
        assert [r.offset for r in recs] == [17, 18, 19, 20, 21]
        assert st.read("dev-3", 40) == []
        with pytest.raises(OffsetOutOfRangeError):
            st.read("dev-3", 41)
        assert st.read("nobody", 0) == [] and st.log_range("nobody") == (0, 0)
        assert sorted(st.keys()) == KEYS


def test_max_bytes_returns_at_least_one(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, ["a"], 10)
        assert len(st.read("a", 0, 100, max_bytes=1)) == 1
        size = 34 + 1 + 3 + 9  # header + key + topic + payload
        for budget in (size, 2 * size, 2 * size + 5, 4 * size - 1):
            assert len(st.read("a", 0, 100, max_bytes=budget)) == budget // size


def test_not_visible_before_commit(tmp_path):
    with LogStore.open(str(tmp_path)) as st:
        assert st.append("a", 1, "t", 0, None, b"x") == 0
        assert st.log_range("a") == (0, 0) and st.read("a", 0) == []
        token = st.flush()
        assert st.read("a", 0) == []
        with pytest.raises(ValueError):
            st.commit(token)  # not synced yet: commit refuses to publish it
        st.commit(st.sync())
        assert [r.payload for r in st.read("a", 0)] == [b"x"]
        assert st.high_watermark("a") == 1


def test_seek_by_time(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        for i in range(200):
            st.append("k", 1000 + 10 * i, "t", 0, None, b"p" * 30)
            st.append("other", 5, "t", 0, None, b"q" * 30)
            if i % 20 == 0:
                st.flush_sync_commit()
        st.flush_sync_commit()
        assert st.offset_for_timestamp("k", 0) == 0
        assert st.offset_for_timestamp("k", 1000) == 0
        assert st.offset_for_timestamp("k", 1001) == 1
        assert st.offset_for_timestamp("k", 1000 + 10 * 123) == 123
        assert st.offset_for_timestamp("k", 1000 + 10 * 123 - 3) == 123
        assert st.offset_for_timestamp("k", 10**12) == 200
        assert st.offset_for_timestamp("nobody", 5) == 0


def test_seek_by_time_non_monotonic(tmp_path, small_settings):
    ts = [50, 10, 70, 20, 90, 30, 95, 40] * 20
    with LogStore.open(str(tmp_path), small_settings) as st:
        for t in ts:
            st.append("k", t, "t", 0, None, b"z" * 40)
        st.flush_sync_commit()
        for target in (0, 11, 55, 71, 91, 95, 96):
            expect = next((i for i, t in enumerate(ts) if t >= target), len(ts))
            assert st.offset_for_timestamp("k", target) == expect


def test_reopen_keeps_everything(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, KEYS, 30)
    with LogStore.open(str(tmp_path), small_settings) as st:
        assert st.stats.index_rebuilds == 0
        check_all(st, KEYS, 30)
        fill_more = st.append("dev-0", 5, "t/dev-0", 1, None, payload_for("dev-0", 30))
        assert fill_more == 30
    with LogStore.open(str(tmp_path), small_settings) as st:
        assert st.log_range("dev-0") == (0, 31)


def test_second_open_is_refused(tmp_path):
    with LogStore.open(str(tmp_path)):
        with pytest.raises(LogStoreError):
            LogStore.open(str(tmp_path))


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_index_rebuild_without_checkpoint(tmp_path, small_settings, damage):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, KEYS, 30)
    ck = tmp_path / CHECKPOINT_NAME
    if damage == "delete":
        ck.unlink()
    else:
        data = bytearray(ck.read_bytes())
        data[len(data) // 2] ^= 0xFF
        ck.write_bytes(bytes(data))
    with LogStore.open(str(tmp_path), small_settings) as st:
        assert st.stats.index_rebuilds == 1
        check_all(st, KEYS, 30)
        assert st.offset_for_timestamp("dev-2", 1_000_000 + 7 * 10 + 2) == 10


def test_tail_recovered_after_checkpoint(tmp_path, small_settings):
    """Records written after the last checkpoint are found by the tail scan."""
    src = tmp_path / "live"
    st = LogStore.open(str(src), small_settings)
    fill(st, KEYS, 10)
    st.checkpoint()
    for k in KEYS:
        for i in range(10, 25):
            st.append(k, 5, f"t/{k}", 1, None, payload_for(k, i))
    st.flush_sync_commit()
    img = crash_image(src, tmp_path / "img")
    st.close()
    with LogStore.open(str(img), small_settings) as st2:
        assert st2.stats.index_rebuilds == 0 and st2.stats.recovery_truncations == 0
        check_all(st2, KEYS, 25)


def _last_record_start(path) -> int:
    rep = inspect(str(path))
    seg = rep.segments[-1]
    # walk the records of the last segment to find the start of the last one
    from commitlog.record import HEADER
    data = open(seg.path, "rb").read()
    p = last = 0
    while p < len(data):
        last = p
        p += 4 + HEADER.unpack_from(data, p)[0]
    return last


def test_flipped_bytes_in_last_record_truncates_only_it(tmp_path, small_settings):
    src = tmp_path / "live"
    with LogStore.open(str(src), small_settings) as st:
        fill(st, KEYS, 5)
        st.append("victim", 9, "t", 0, None, b"last one")
        st.flush_sync_commit()
    seg = sorted(src.glob("*.log"))[-1]
    start = _last_record_start(src)
    for i, pos in enumerate((start + 5, start + 20, os.path.getsize(seg) - 1)):
        img = tmp_path / f"img{i}"
        shutil.copytree(src, img)
        (img / CHECKPOINT_NAME).unlink()  # else the checkpoint would cover the record
        f = img / seg.name
        data = bytearray(f.read_bytes())
        data[pos] ^= 0x01
        f.write_bytes(bytes(data))
        assert not inspect(str(img)).ok
        with LogStore.open(str(img), small_settings) as st:
            assert st.stats.recovery_truncations == 1
            check_all(st, KEYS, 5)
            assert st.log_range("victim") == (0, 0)
        assert inspect(str(img)).ok


def test_cut_at_every_byte_of_last_record(tmp_path, small_settings):
    src = tmp_path / "live"
    st = LogStore.open(str(src), small_settings)
    fill(st, KEYS, 4)
    st.checkpoint()  # the torn record lies after the checkpoint, as after a real crash
    st.append("dev-1", 7, "t/dev-1", 1, [("h", b"v")], payload_for("dev-1", 4))
    st.flush_sync_commit()
    img0 = crash_image(src, tmp_path / "img0")
    st.close()
    seg = sorted(img0.glob("*.log"))[-1]
    full = seg.read_bytes()
    start = _last_record_start(img0)
    assert len(full) > start
    for cut in range(start, len(full)):
        img = tmp_path / "cut"
        if img.exists():
            shutil.rmtree(img)
        shutil.copytree(img0, img)
        with open(img / seg.name, "r+b") as f:
            f.truncate(cut)
        with LogStore.open(str(img), small_settings) as st2:
            assert st2.stats.recovery_truncations == (0 if cut == start else 1)
            check_all(st2, KEYS, 4)
            # the log is writable after the cut and the next offset is the lost one
            assert st2.append("dev-1", 8, "t", 0, None, b"again") == 4
        with LogStore.open(str(img), small_settings) as st3:
            assert st3.read("dev-1", 4)[0].payload == b"again"
    # uncut: nothing lost
    with LogStore.open(str(img0), small_settings) as st4:
        assert st4.log_range("dev-1") == (0, 5)


def test_retention_by_age_deletes_whole_segments(tmp_path, small_settings):
    s = LogSettings(segment_bytes=4096, index_interval_bytes=256, retention_ms=1000,
                    tail_cache_bytes_per_device=0)
    with LogStore.open(str(tmp_path), s) as st:
        for i in range(300):  # ts in µs: first 150 old, last 150 new
            ts = 0 if i < 150 else 10_000_000
            for k in ("a", "b"):
                st.append(k, ts, "t", 0, None, b"x" * 40)
            st.flush_sync_commit()
        segs_before = len(st.segments)
        paths_before = [seg.path for seg in st.segments]
        deleted = st.apply_retention(now_us=10_500_000)
        assert deleted > 0 and len(st.segments) == segs_before - deleted
        assert st.stats.retention_segments_deleted == deleted
        start, end = st.log_range("a")
        assert 0 < start <= 150 and end == 300
        recs = list(st.iter_records("a"))
        assert recs[0].offset == start and len(recs) == 300 - start
        with pytest.raises(OffsetOutOfRangeError):
            st.read("a", 0)
        assert [os.path.exists(p) for p in paths_before] == (
            [False] * deleted + [True] * (segs_before - deleted))
    with LogStore.open(str(tmp_path), s) as st:
        assert st.log_range("a") == (start, 300)
    (tmp_path / CHECKPOINT_NAME).unlink()
    with LogStore.open(str(tmp_path), s) as st:  # rebuild from the remaining segments
        assert st.log_range("a") == (start, 300)
        assert len(list(st.iter_records("b"))) == 300 - st.log_range("b")[0]


def test_retention_by_bytes_per_device(tmp_path):
    s = LogSettings(segment_bytes=8192, index_interval_bytes=512, retention_ms=0,
                    retention_bytes_per_device=4000, tail_cache_bytes_per_device=2000)
    with LogStore.open(str(tmp_path), s) as st:
        for i in range(400):
            st.append("chatty", i, "t", 0, None, b"c" * 90)
            if i % 20 == 0:
                st.append("quiet", i, "t", 0, None, b"q" * 90)
            st.flush_sync_commit()
        segs = len(st.segments)
        st.apply_retention(now_us=10**9)
        start, end = st.log_range("chatty")
        assert end == 400 and start > 300
        kept = sum(len(r.payload) + 40 for r in st.iter_records("chatty"))
        assert 4000 - 600 <= kept <= 4000 + 512 + 200
        assert st.log_range("quiet") == (0, 20)  # within its budget: untouched...
        assert len(st.segments) == segs  # ...so it pins the old segments


def test_retention_frees_segments_when_all_devices_moved(tmp_path):
    s = LogSettings(segment_bytes=4096, index_interval_bytes=256, retention_ms=0,
                    retention_bytes_per_device=1500, tail_cache_bytes_per_device=0)
    with LogStore.open(str(tmp_path), s) as st:
        for i in range(300):
            st.append("a", i, "t", 0, None, b"a" * 60)
            st.append("b", i, "t", 0, None, b"b" * 60)
            st.flush_sync_commit()
        before = len(st.segments)
        deleted = st.apply_retention(now_us=10**9)
        assert deleted > 0 and len(st.segments) == before - deleted
        for k in ("a", "b"):
            start, end = st.log_range(k)
            assert [r.offset for r in st.iter_records(k)] == list(range(start, end))


def test_truncate_key_then_reappend(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, ["a", "b"], 30)
        st.truncate("a", 12)
        assert st.log_range("a") == (0, 12)
        for i in range(12, 20):
            assert st.append("a", 1, "t/a", 1, None, b"new%d" % i) == i
        st.flush_sync_commit()
        recs = list(st.iter_records("a"))
        assert [r.offset for r in recs] == list(range(20))
        assert recs[11].payload == payload_for("a", 11) and recs[12].payload == b"new12"
    for drop_ckpt in (False, True):
        if drop_ckpt:
            (tmp_path / CHECKPOINT_NAME).unlink()
        with LogStore.open(str(tmp_path), small_settings) as st:
            recs = list(st.iter_records("a"))
            assert [r.offset for r in recs] == list(range(20))
            assert recs[12].payload == b"new12" and recs[19].payload == b"new19"
            check_all(st, ["b"], 30)


def test_tail_cache_keeps_the_newest_records_within_its_cap(tmp_path):
    """The per-device trim after each commit (C trim_count or the Python loop) charges every
    record what _cache_size says, keeps the newest ones, and stays at or under the cap."""
    cap = 1500
    s = LogSettings(tail_cache_bytes_per_device=cap)
    with LogStore.open(str(tmp_path), s) as st:
        for batch in range(12):
            for i in range(batch * 7, batch * 7 + 7):
                headers = [("h", b"v" * (i % 5))] if i % 3 == 0 else None
                st.append("dev", i, f"t/{i % 4}", 1, headers, b"x" * (i * 13 % 90))
            st.flush_sync_commit()
            dev = st._devices["dev"]
            klen = len(dev.kb)
            charged = [store_mod._cache_size(r, klen) for r in dev.cache]
            assert dev.cache_bytes == sum(charged) <= cap
            # nothing kept that fit: one record more would have gone over the cap
            assert dev.cache_start == 0 or dev.cache_bytes + store_mod._cache_size(
                st.read("dev", dev.cache_start - 1, 1)[0], klen) > cap
            assert [r.offset for r in dev.cache] == list(range(dev.cache_start, dev.durable_end))
            assert st._cache_total == dev.cache_bytes


def test_tail_cache_hits_and_eviction(tmp_path):
    s = LogSettings(tail_cache_bytes_per_device=2000, tail_cache_bytes_total=3000)
    with LogStore.open(str(tmp_path), s) as st:
        fill(st, ["a"], 100)
        hits, misses = st.stats.tail_cache_hits, st.stats.tail_cache_misses
        st.read("a", 99)
        assert st.stats.tail_cache_hits == hits + 1
        st.read("a", 0)
        assert st.stats.tail_cache_misses == misses + 1
        # a read spanning disk and cache returns a contiguous run
        assert [r.offset for r in st.read("a", 50, 50)] == list(range(50, 100))
        # many devices: the global cap evicts least recently used caches
        fill(st, [f"d{i}" for i in range(20)], 5)
        assert st.stats.tail_cache_evictions > 0
        assert 0 < st.stats.tail_cache_bytes <= 3000
        check_all_keys = [f"d{i}" for i in range(20)]
        for k in check_all_keys:
            assert [r.payload for r in st.read(k, 0)] == [payload_for(k, i) for i in range(5)]


def _fds_into(directory) -> int:
    """This process's open file descriptors on files under ``directory``: the store's own, not
    the ones other code in the test process (a SparkSession's py4j sockets, a paho thread left
    by an earlier test of the worker) opens or closes meanwhile."""
    prefix = os.path.realpath(directory) + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                count += 1
        except OSError:  # closed since the listing (or the listing's own fd)
            continue
    return count


def test_many_devices_within_open_files_limit(tmp_path):
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # 20,000 devices: 20 times the usual 1,024 open-files limit (what an fd per device log
    # would run into), over 16 KiB segments: more segments than the read fd cache, so reads
    # across all of them must evict (100,000 devices over 1 MiB segments took 17.7 s here and
    # stayed under the cache: an eviction that never happens passed)
    n = 20_000
    s = LogSettings(segment_bytes=1 << 14, tail_cache_bytes_per_device=0)  # reads: from disk
    st = LogStore.open(str(tmp_path), s)
    for rnd in range(3):
        for i in range(n):
            st.append(f"device-{i:06d}", rnd, "telemetry", 1, None, b"%d" % i)
            if i % 1000 == 999:  # a batch each: 60 segments rolled past 16 KiB
                st.flush_sync_commit()
    assert len(st.segments) > 2 + s.read_fd_cache  # more than the fds it may keep open
    held = _fds_into(tmp_path)
    assert st.open_fd_count <= 2 + s.read_fd_cache and held <= 2 + s.read_fd_cache
    for i in range(0, n, 997):
        assert [r.offset for r in st.read(f"device-{i:06d}", 0)] == [0, 1, 2]
    held = _fds_into(tmp_path)
    assert held <= 2 + s.read_fd_cache < min(soft, 1024)
    st.close()
    assert _fds_into(tmp_path) == 0
    with LogStore.open(str(tmp_path), s) as st:
        assert len(st.keys()) == n
        assert st.log_range("device-014321") == (0, 3)
        assert st.read("device-019999", 2)[0].payload == b"19999"


def test_inspect_reports_keys_and_corruption(tmp_path, small_settings):
    with LogStore.open(str(tmp_path), small_settings) as st:
        fill(st, ["a", "b"], 60)
    rep = inspect(str(tmp_path))
    assert rep.ok and rep.total_records == 120 and len(rep.segments) >= 2
    assert rep.keys["a"].first_offset == 0 and rep.keys["a"].last_offset == 59
    seg = sorted(tmp_path.glob("*.log"))[1]
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF
    seg.write_bytes(bytes(data))
    rep = inspect(str(tmp_path))
    assert not rep.ok
    # not the last segment: a corrupt range with intact records after it (recovery will
    # quarantine it), not a torn tail
    bad = [s for s in rep.segments if s.corrupt_at is not None or s.ranges]
    assert len(bad) == 1
    assert (bad[0].ranges[0][0] if bad[0].ranges else bad[0].corrupt_at) <= 100
    assert "CORRUPT" in rep.format()


def _expect_raw(st, key, offset, max_records, max_bytes):
    """What read_raw must return: the encoding of read()'s records (the bytes flush wrote),
    as many as fit in max_bytes (exact sizes; the first one always)."""
    from commitlog.record import encode_batch

    recs = st.read(key, offset, max_records, 1 << 40)
    out, n = b"", 0
    for r in recs:
        enc = encode_batch([r])
        if n and len(out) + len(enc) > max_bytes:
            break
        out += enc
        n += 1
    return out, n, (recs[n - 1].offset + 1 if n else offset)


@pytest.mark.parametrize("cache", [0, 3000])
def test_read_raw_is_read_in_stored_bytes(tmp_path, cache):
    """read_raw (the fetch API's path: stored bytes, not decoded) gives exactly the encoding
    of read(): across segments, from any offset (the jump from the index entry may cross a
    segment), at the tail cache's boundary, under byte caps; and after a key truncation
    (markers: the read() fallback) still the live records only."""
    import random

    s = LogSettings(segment_bytes=8192, index_interval_bytes=300, retention_ms=0,
                    tail_cache_bytes_per_device=cache)
    st = LogStore.open(str(tmp_path / "log"), s)
    fill(st, ["a", "bb", "c"], 400, batch=37)
    assert len(st.segments) > 5
    rnd = random.Random(7)

    def check(n_reads):
        for _ in range(n_reads):
            key = rnd.choice(["a", "bb", "c"])
            start, end = st.log_range(key)
            off = rnd.randrange(start, end + 1)
            mr = rnd.choice([1, 2, 17, 400, 10_000])
            mb = rnd.choice([1, 100, 1000, 5000, 1 << 20])
            chunks, n, nxt = st.read_raw(key, off, mr, mb)
            assert (b"".join(chunks), n, nxt) == _expect_raw(st, key, off, mr, mb), (
                key, off, mr, mb)

    check(400)
    assert st.stats.disk_reads > 0
    st.truncate("bb", 250)
    for i in range(250, 300):
        st.append("bb", 5, "t/bb", 0, None, payload_for("bb", 1000 + i))
    st.flush_sync_commit()
    check(200)
    assert st.read_raw("bb", 240, 20)[1] == 20
    with pytest.raises(OffsetOutOfRangeError):
        st.read_raw("bb", 301)
    assert st.read_raw("nobody", 0) == ([], 0, 0)
    st.close()
