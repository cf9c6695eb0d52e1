"""Replication primitives of the commit log (issue 14): two ends per device log, leader
epochs, follower append, the replica read path, truncation through a crash at every byte,
per-device commit waiters. Real stores on tmp_path, both implementations (conftest)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from commitlog_testlib import crash_image, fill, payload_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog import record
from commitlog.epochs import StaleEpochError
from commitlog.groupcommit import GroupCommitter
from commitlog.inspect import inspect
from commitlog.settings import LogSettings
from commitlog.store import LogStore, LogStoreError, LogTruncatedError, OffsetOutOfRangeError

SMALL = LogSettings(segment_bytes=4096, index_interval_bytes=256,
                    tail_cache_bytes_per_device=0, retention_ms=0)


def append_n(st_: LogStore, key: str, n: int, ts0: int = 1_000_000) -> None:
    """Append ``n`` records to ``key`` (leader path) and commit them."""
    for _ in range(n):
        off = st_.log_end(key)
        st_.append(key, ts0 + off, f"t/{key}", 1, [("h", b"v")] if off % 7 == 0 else None,
                   payload_for(key, off))
    st_.flush_sync_commit()


def replicate(leader: LogStore, follower: LogStore, key: str, max_records: int = 1000,
              restart=None, start_at: int = 0) -> LogStore:
    """Feed ``follower`` the leader's replica stream of ``key`` until it reaches the log end
    (a follower without the key starts at ``start_at``)."""
    for _ in range(100_000):
        off = follower.durable_end(key) if key in follower else start_at
        data, _nxt = leader.read_replica(key, off, max_records,
                                         last_epoch=follower.latest_epoch(key))
        if not data:
            return follower
        follower.append_follower(key, data, leader.latest_epoch(key))
        follower.flush_sync_commit()
        # A follower's high-water mark: the leader's, capped by its own log end (Kafka).
        follower.set_high_watermark(key, min(leader.high_watermark(key),
                                             follower.durable_end(key)))
        if restart is not None:
            follower = restart(follower)
    raise AssertionError("the follower never caught up")


def full_stream(st_: LogStore, key: str) -> bytes:
    """Every record and epoch start of ``key`` from its start, as replicas receive them."""
    data, _ = st_.read_replica(key, st_.log_range(key)[0], 1 << 30, 1 << 40)
    return data


def test_two_ends_readers_stop_at_high_watermark(tmp_path: Path):
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    append_n(st_, "d", 40)
    st_.set_high_watermark("d", 25)
    assert st_.log_range("d") == (0, 25) and st_.high_watermark("d") == 25
    assert st_.durable_end("d") == 40
    assert [r.offset for r in st_.read("d", 0, 1000)] == list(range(25))
    assert [r.offset for r in st_.iter_records("d")] == list(range(25))
    assert st_.read("d", 25) == []
    with pytest.raises(OffsetOutOfRangeError):
        st_.read("d", 26)
    assert st_.offset_for_timestamp("d", 1_000_000 + 30) == 25
    # The follower path serves up to the log end.
    data, nxt = st_.read_replica("d", 20)
    assert nxt == 40 and [r.offset for r in record.decode_batch(data)] == list(range(20, 40))
    # New appends stay invisible until the high-water mark moves.
    append_n(st_, "d", 5)
    assert st_.log_range("d") == (0, 25)
    with pytest.raises(ValueError):
        st_.set_high_watermark("d", 46)
    st_.set_high_watermark("d", 30)
    st_.close()
    st2 = LogStore.open(str(tmp_path / "a"), SMALL)  # checkpoint v3 keeps both ends
    assert st2.log_range("d") == (0, 30) and st2.durable_end("d") == 45
    st2.set_high_watermark("d", None)  # back to the single-node rule
    assert st2.log_range("d") == (0, 45)
    st2.close()


def test_high_watermark_after_crash_never_exposes_uncommitted(tmp_path: Path):
    """A replicated log (it has epochs) recovered without a checkpointed high-water mark
    shows nothing above what a checkpoint recorded; a torn tail lowers it to the log end."""
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    st_.start_epoch("d", 1)
    append_n(st_, "d", 30)
    st_.set_high_watermark("d", 10)
    st_.checkpoint()
    st_.set_high_watermark("d", 20)
    append_n(st_, "d", 5)
    img = crash_image(tmp_path / "a", tmp_path / "crash")
    st_.close()
    st2 = LogStore.open(str(img), SMALL)
    assert st2.log_range("d") == (0, 10) and st2.durable_end("d") == 35
    st2.close()
    (img / "index.ckpt").unlink()  # no checkpoint at all: rebuilt, nothing known committed
    st3 = LogStore.open(str(img), SMALL)
    assert st3.log_range("d") == (0, 0) and st3.durable_end("d") == 35
    assert st3.epochs("d") == [(1, 0)]
    st3.close()


def test_epochs_lookup_survive_crash_and_show_in_inspect(tmp_path: Path):
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    assert st_.end_offset_for_epoch("d", 0) == (-1, -1)
    assert st_.start_epoch("d", 1)
    append_n(st_, "d", 10)
    assert not st_.start_epoch("d", 1)  # already the epoch here: nothing written
    st_.start_epoch("d", 2)
    append_n(st_, "d", 5)
    st_.start_epoch("d", 4)
    append_n(st_, "d", 3)
    with pytest.raises(StaleEpochError):
        st_.start_epoch("d", 3)
    assert st_.epochs("d") == [(1, 0), (2, 10), (4, 15)]
    assert st_.end_offset_for_epoch("d", 1) == (1, 10)
    assert st_.end_offset_for_epoch("d", 3) == (2, 15)  # KIP-279: largest epoch <= 3
    assert st_.end_offset_for_epoch("d", 9) == (4, 18)
    assert [r.offset for r in st_.iter_records("d")] == list(range(18))  # epochs invisible
    img = crash_image(tmp_path / "a", tmp_path / "crash")  # no checkpoint written yet
    st_.checkpoint()
    st_.start_epoch("d", 5)  # after the checkpoint: replayed from the log
    st_.flush_sync_commit()
    img2 = crash_image(tmp_path / "a", tmp_path / "crash2")
    st_.close()
    for path, want, visible in ((img, [(1, 0), (2, 10), (4, 15)], 0),
                                (img2, [(1, 0), (2, 10), (4, 15), (5, 18)], 18),
                                (tmp_path / "a", [(1, 0), (2, 10), (4, 15), (5, 18)], 18)):
        st2 = LogStore.open(str(path), SMALL)
        assert st2.epochs("d") == want, path
        # Without a checkpoint nothing is known committed (the hw is re-learned).
        assert [r.offset for r in st2.iter_records("d")] == list(range(visible))
        data, _ = st2.read_replica("d", 0, 100)
        assert [r.offset for r in record.decode_batch(data)] == list(range(18))
        st2.close()
    rep = inspect(str(tmp_path / "a"))
    assert rep.ok and rep.keys["d"].epochs == [(1, 0), (2, 10), (4, 15), (5, 18)]
    assert "epochs 1@0 2@10 4@15 5@18" in rep.format()


def test_follower_append_verifies_before_changing_anything(tmp_path: Path):
    leader = LogStore.open(str(tmp_path / "l"), SMALL)
    leader.start_epoch("d", 3)
    append_n(leader, "d", 10)
    f = LogStore.open(str(tmp_path / "f"), SMALL)
    head, nxt = leader.read_replica("d", 0, 5)
    assert nxt == 5
    f.append_follower("d", head, 3)
    f.flush_sync_commit()
    data, _ = leader.read_replica("d", 5)
    recs = list(record.decode_batch(data))
    assert len(recs) == 5
    # A gap (starts at 6, not at the log end 5), a bit flip, another key's record: each
    # refused, nothing appended.
    bad_gap, _ = leader.read_replica("d", 6)
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x40
    other = record.encode_batch([recs[0]._replace(key="e")])
    for bad, exc in ((bad_gap, ValueError), (bytes(flipped), record.CorruptRecordError),
                     (other, ValueError)):
        with pytest.raises(exc):
            f.append_follower("d", bad)
        assert f.log_end("d") == 5 and f.pending() == 0
    f.append_follower("d", data, 3)
    f.flush_sync_commit()
    with pytest.raises(StaleEpochError):
        f.append_follower("d", b"", 2)
    assert full_stream(f, "d") == full_stream(leader, "d")
    assert f.epochs("d") == [(3, 0)]
    # Leader appends pending on the follower's log: a log takes one kind per batch.
    f.append("d", 1, "t", 0, None, b"x")
    with pytest.raises(LogStoreError):
        f.append_follower("d", leader.read_replica("d", 10)[0])
    f.close()
    leader.close()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 40)),
    st.tuples(st.just("epoch"), st.integers(1, 3)),
    st.tuples(st.just("restart_leader"), st.booleans()),
), min_size=1, max_size=6),
    chunk=st.integers(3, 40), restarts=st.integers(0, 2), crash=st.booleans(),
    start_frac=st.sampled_from([0.0, 0.0, 0.3, 0.77, 1.0]))
def test_follower_equals_leader_through_restarts(tmp_path_factory, impl, ops, chunk,
                                                 restarts, crash, start_frac):
    """Hypothesis: a follower fed the leader's replica stream from any start offset (any
    chunk size, restarting with a close or a crash image between chunks) ends
    byte-identical to the leader from there: records, offsets, epochs."""
    base = tmp_path_factory.mktemp("rep")
    leader = LogStore.open(str(base / "l"), SMALL)
    epoch = 0
    n_restart = [0]

    def restart(f: LogStore) -> LogStore:
        if n_restart[0] >= restarts:
            return f
        n_restart[0] += 1
        path = base / "f"
        if crash:  # what a crash leaves: everything committed is there, no close
            img = base / f"f-crash{n_restart[0]}"
            crash_image(path, img)
            f.close()
            shutil.rmtree(path)
            img.rename(path)
        else:
            f.close()
        return LogStore.open(str(path), SMALL)

    for op, arg in ops:
        if op == "append":
            append_n(leader, "d", arg)
            append_n(leader, "other", 1)
        elif op == "epoch":
            epoch += arg
            leader.start_epoch("d", epoch)
            leader.flush_sync_commit()
        else:
            leader.close()
            if arg:
                leader = LogStore.open(str(base / "l"), SMALL)
            else:
                img = crash_image(base / "l", base / f"l-crash{len(ops)}")
                shutil.rmtree(base / "l")
                img.rename(base / "l")
                leader = LogStore.open(str(base / "l"), SMALL)
    # The leader commits everything it has (a single-replica ISR), even after a crash
    # that lost its checkpointed high-water mark.
    leader.set_high_watermark("d", leader.durable_end("d"))
    start_at = int(start_frac * leader.durable_end("d"))
    follower = LogStore.open(str(base / "f"), SMALL)
    follower = replicate(leader, follower, "d", chunk, restart, start_at)
    if "d" not in follower:  # started at the leader's end with nothing to send
        assert start_at == leader.durable_end("d")
        follower.close()
        leader.close()
        return
    follower.set_high_watermark("d", leader.high_watermark("d"))
    follower.close()
    follower = LogStore.open(str(base / "f"), SMALL)
    assert follower.durable_end("d") == leader.durable_end("d")
    assert follower.log_range("d")[0] == start_at
    assert follower.epochs("d") == [e for e in leader.epochs("d") if e[1] >= start_at]
    assert full_stream(follower, "d") == leader.read_replica("d", start_at, 1 << 30, 1 << 40)[0]
    assert list(follower.iter_records("d")) == list(leader.iter_records("d", start_at))
    follower.close()
    leader.close()


def test_epoch_divergence_and_truncation_crash_at_every_byte(tmp_path: Path):
    """A leads epochs 1-2; B copies part of it, becomes leader at epoch 3 and writes more
    while A (cut off) wrote a diverged tail in epoch 2. A, restarted, asks B where epoch 2
    ended, truncates there and catches up identical. A crash at every byte of the
    truncation's write recovers to before or after it, never a mix."""
    a = LogStore.open(str(tmp_path / "a"), SMALL)
    b = LogStore.open(str(tmp_path / "b"), SMALL)
    a.start_epoch("d", 1)
    append_n(a, "d", 20)
    a.start_epoch("d", 2)
    append_n(a, "d", 10)
    replicate(a, b, "d", 7)
    a.set_high_watermark("d", 30)
    b.set_high_watermark("d", 30)
    append_n(a, "d", 8)  # A's diverged tail, never replicated (above the hw)
    b.start_epoch("d", 3)
    append_n(b, "d", 12)
    a.close()
    a = LogStore.open(str(tmp_path / "a"), SMALL)  # A comes back as a follower
    assert a.latest_epoch("d") == 2 and a.durable_end("d") == 38
    ep, end = b.end_offset_for_epoch("d", a.latest_epoch("d"))
    assert (ep, end) == (2, 30)
    before = (a.durable_end("d"), a.epochs("d"), full_stream(a, "d"))
    seg = Path(a.segments[-1].path)
    size0 = seg.stat().st_size
    a.truncate("d", min(end, a.durable_end("d")))
    a.flush_sync_commit()
    after = (a.durable_end("d"), a.epochs("d"), full_stream(a, "d"))
    assert after[0] == 30 and after[2] == before[2][: len(after[2])]
    size1 = seg.stat().st_size
    assert size1 > size0
    for cut in range(size0, size1 + 1):
        img = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "a", img)
        with open(img / seg.name, "r+b") as fh:
            fh.truncate(cut)
        c = LogStore.open(str(img), SMALL)
        state = (c.durable_end("d"), c.epochs("d"), full_stream(c, "d"))
        assert state in (before, after), cut
        assert state == (after if cut == size1 else before), cut
        c.close()
        shutil.rmtree(img)
    replicate(b, a, "d", 5)
    assert full_stream(a, "d") == full_stream(b, "d")
    assert a.epochs("d") == b.epochs("d") == [(1, 0), (2, 20), (3, 30)]
    a.close()
    a = LogStore.open(str(tmp_path / "a"), SMALL)
    assert full_stream(a, "d") == full_stream(b, "d")
    a.close()
    b.close()


def test_truncate_above_and_below_high_watermark(tmp_path: Path):
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    append_n(st_, "d", 30)
    st_.set_high_watermark("d", 20)
    st_.truncate("d", 25)  # above the hw: a diverged, never-visible tail
    assert st_.log_range("d") == (0, 20) and st_.durable_end("d") == 25
    st_.truncate("d", 15)  # below it: the hw follows
    assert st_.log_range("d") == (0, 15) and st_.durable_end("d") == 15
    st_.flush_sync_commit()
    st_.close()
    st2 = LogStore.open(str(tmp_path / "a"), SMALL)
    assert st2.log_range("d") == (0, 15)
    assert [r.payload for r in st2.iter_records("d")] == [payload_for("d", i)
                                                           for i in range(15)]
    st2.close()


def test_compiled_reads_survive_many_truncations(tmp_path: Path, impl, monkeypatch):
    """After 100 truncations reads give the same records, and with the compiled path the
    C reader still serves the records written after the last truncation (it used to be
    off for the device until retention dropped every marker)."""
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    for i in range(100):
        append_n(st_, "d", 12)
        fill(st_, [f"x{i}"], 2)
        st_.truncate("d", st_.durable_end("d") - 3)
        st_.flush_sync_commit()
    end = st_.durable_end("d")
    append_n(st_, "d", 200)
    st_.close()
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    served = [0]
    real = record.c_read_run
    if real is not None:
        def counting(data, p, kb, key, want, upto, used, max_bytes, out):
            n = len(out)
            res = real(data, p, kb, key, want, upto, used, max_bytes, out)
            served[0] += len(out) - n
            return res
        monkeypatch.setattr(record, "c_read_run", counting)
    recs = list(st_.iter_records("d"))
    assert [r.offset for r in recs] == list(range(end + 200))
    assert [r.payload for r in recs[end:]] == [payload_for("d", o) for o in range(end, end + 200)]
    served[0] = 0
    tail = st_.read("d", end, 1000, 1 << 30)
    assert len(tail) == 200
    if impl == "c":
        assert served[0] == 200
    st_.close()


def test_commit_waiters(tmp_path: Path):
    st_ = LogStore.open(str(tmp_path / "a"), SMALL)
    got: list[tuple[str, object]] = []
    st_.when_high_watermark("d", 0, lambda e: got.append(("now", e)))
    assert got == [("now", None)]
    st_.when_high_watermark("d", 2, lambda e: got.append(("d2", e)))
    st_.when_high_watermark("d", 5, lambda e: got.append(("d5", e)))
    h = st_.when_high_watermark("e", 1, lambda e: got.append(("e1", e)))
    st_.append("d", 1, "t", 0, None, b"a")
    st_.append("d", 1, "t", 0, None, b"b")
    st_.flush()
    assert got == [("now", None)]  # written, not durable: nobody woken
    st_.commit(st_.sync())
    assert got[1] == ("d2", None) and len(got) == 2
    assert st_.cancel_high_watermark_wait(h) and not st_.cancel_high_watermark_wait(h)
    # Replicated: durable is not enough, the high-water mark must pass.
    st_.set_high_watermark("d", 2)
    append_n(st_, "d", 4)
    assert len(got) == 2
    st_.when_high_watermark("d", 6, lambda e: got.append(("d6", e)))
    st_.set_high_watermark("d", 5)
    assert got[2] == ("d5", None) and len(got) == 3
    st_.truncate("d", 5)  # the record the d6 waiter needs is gone
    assert got[3][0] == "d6" and isinstance(got[3][1], LogTruncatedError)
    assert st_.high_watermark_waiters == 0
    st_.close()


def test_group_committer_follower_append(tmp_path: Path):
    """Follower appends ride the group committer like leader appends: one batch, one fsync,
    ``when_durable`` and the per-device waiter fire, the bytes match after a reopen."""
    leader = LogStore.open(str(tmp_path / "l"), SMALL)
    leader.start_epoch("d", 1)
    append_n(leader, "d", 50)

    async def main() -> None:
        f = LogStore.open(str(tmp_path / "f"), SMALL)
        gc = GroupCommitter(f)
        got: list[object] = []
        f.when_high_watermark("d", 50, got.append)
        data, _ = leader.read_replica("d", 0, 100)
        assert gc.append_follower("d", data, 1) == 50
        assert gc.append_follower("e", leader.read_replica("e", 0)[0]) == 0  # nothing: no-op
        await asyncio.wait_for(gc.wait_durable(), 60)  # hang deadline, not a timing bound
        assert got == [None] and f.high_watermark("d") == 50
        await gc.close()

    asyncio.run(main())
    f = LogStore.open(str(tmp_path / "f"), SMALL)
    assert full_stream(f, "d") == full_stream(leader, "d") and f.epochs("d") == [(1, 0)]
    f.close()
    leader.close()
