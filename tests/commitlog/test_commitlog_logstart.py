"""``LogStore.reset_start``: a follower whose fetch offset fell below its leader's log start
(retention or ``advance_start`` moved it) restarts its log empty at that start (Kafka's
``truncateFullyAndStartAt``, KIP-107), durable through a restart and a crash at any byte of
its marker; and the epoch table seen from a log start (Kafka's ``truncateFromStart``), so the
restarted follower's epochs agree with its leader's. Real stores on tmp_path, both
implementations (conftest)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from commitlog_testlib import payload_for

from commitlog.settings import LogSettings
from commitlog.store import CHECKPOINT_NAME, LogStore, LogStoreError, OffsetOutOfRangeError

SMALL = LogSettings(segment_bytes=4096, index_interval_bytes=256,
                    tail_cache_bytes_per_device=0, retention_ms=0)


def append_n(st_: LogStore, key: str, n: int, ts0: int = 1_000_000) -> None:
    for _ in range(n):
        off = st_.log_end(key)
        st_.append(key, ts0 + off, f"t/{key}", 1, None, payload_for(key, off))
    st_.flush_sync_commit()


def replicate(leader: LogStore, follower: LogStore, key: str, max_records: int = 7) -> None:
    """Feed ``follower`` the leader's replica stream of ``key`` from its own log end."""
    for _ in range(10_000):
        data, _ = leader.read_replica(key, follower.durable_end(key), max_records,
                                      last_epoch=follower.latest_epoch(key))
        if not data:
            return
        follower.append_follower(key, data, leader.latest_epoch(key))
        follower.flush_sync_commit()
    raise AssertionError("the follower never caught up")


def state(st_: LogStore, key: str) -> tuple:
    """What a replica holds of ``key``: start, ends, epochs, every durable record (a store
    reopened without its checkpoint shows readers nothing of a replicated log until the
    leader gives the mark again, so the records are read up to the durable end)."""
    start = st_.log_range(key)[0]
    recs = [(r.offset, bytes(r.payload))
            for r in st_.read_durable(key, start, 1 << 20, 1 << 30)]
    return (start, st_.durable_end(key), st_.log_end(key), st_.epochs(key), recs)


def leader_with_moved_start(path: Path) -> LogStore:
    """Epoch 1 over [0, 30), epoch 2 from 30 to 80; the start advanced to 50 (inside epoch 2)."""
    leader = LogStore.open(str(path), SMALL)
    leader.start_epoch("d", 1)
    append_n(leader, "d", 30)
    leader.start_epoch("d", 2)
    append_n(leader, "d", 50)
    leader.advance_start("d", 50)
    return leader


def test_epochs_seen_from_the_log_start():
    from commitlog import epochs as ep
    table = [(1, 0, 0, 0), (2, 30, 0, 1), (4, 60, 0, 2)]
    assert ep.from_start(table, 0) == table
    assert ep.from_start(table, 30) == table[1:]
    assert ep.from_start(table, 50) == [(2, 50, 0, 1), (4, 60, 0, 2)]
    assert ep.from_start(table, 70) == [(4, 70, 0, 2)]
    assert ep.from_start(None, 5) == []


def test_a_follower_below_the_leaders_start_restarts_there_and_follows(tmp_path: Path):
    leader = leader_with_moved_start(tmp_path / "leader")
    assert leader.log_range("d") == (50, 80)
    assert leader.epochs("d") == [(2, 50)]  # epoch 1 ended before the start: gone
    follower = LogStore.open(str(tmp_path / "f"), SMALL)
    follower.start_epoch("d", 1)
    append_n(follower, "d", 10)  # what it had: [0, 10) of epoch 1
    with pytest.raises(OffsetOutOfRangeError):
        leader.read_replica("d", 10)  # below the leader's start: the fetch that looped
    with pytest.raises(ValueError):
        follower.reset_start("d", 10)  # not past its end: a start never moves back
    follower.reset_start("d", 50)
    assert state(follower, "d") == (50, 50, 50, [], [])
    with pytest.raises(OffsetOutOfRangeError):
        follower.read("d", 0)  # readers below the start: out of range, as after retention
    follower.flush_sync_commit()
    replicate(leader, follower, "d")
    assert state(follower, "d") == state(leader, "d")
    assert follower.epochs("d") == [(2, 50)]
    assert follower.latest_epoch("d") == leader.latest_epoch("d") == 2
    assert follower.end_offset_for_epoch("d", 2) == leader.end_offset_for_epoch("d", 2)
    expect = state(leader, "d")
    follower.close()
    reopened = LogStore.open(str(tmp_path / "f"), SMALL)  # from its checkpoint
    assert state(reopened, "d") == expect
    reopened.close()
    os.unlink(tmp_path / "f" / CHECKPOINT_NAME)
    rebuilt = LogStore.open(str(tmp_path / "f"), SMALL)  # from the segments alone
    assert state(rebuilt, "d") == expect
    leader.start_epoch("d", 3)  # and it goes on following across epochs
    append_n(leader, "d", 5)
    replicate(leader, rebuilt, "d")
    assert state(rebuilt, "d") == state(leader, "d")
    rebuilt.close()
    leader.close()


def test_a_new_log_restarted_at_the_leaders_start_survives_a_restart(tmp_path: Path):
    """A replica with an empty disk (added by a reassignment, or wiped) has no log at all:
    its start is durable by the marker alone, before any record arrives."""
    st_ = LogStore.open(str(tmp_path / "f"), SMALL)
    st_.reset_start("d", 40)
    st_.flush_sync_commit()
    assert st_.log_range("d") == (40, 40)
    st_.close()
    os.unlink(tmp_path / "f" / CHECKPOINT_NAME)
    st_ = LogStore.open(str(tmp_path / "f"), SMALL)
    assert state(st_, "d") == (40, 40, 40, [], [])
    st_.close()


def test_reset_marker_crash_at_every_byte_is_before_or_after(tmp_path: Path):
    """A crash anywhere in the reset's write recovers the old log whole or the reset one
    (then with the leader's records fetched after it, in the same write), never a mix; a
    checkpoint taken between the reset and its sync already holds the reset."""
    leader = leader_with_moved_start(tmp_path / "leader")
    path = tmp_path / "f"
    follower = LogStore.open(str(path), SMALL)
    follower.start_epoch("d", 1)
    append_n(follower, "d", 10)
    follower.close()
    follower = LogStore.open(str(path), SMALL)
    before = state(follower, "d")
    seg = Path(follower.segments[-1].path)
    size0 = seg.stat().st_size
    follower.reset_start("d", 50)
    data, _ = leader.read_replica("d", 50, 4, last_epoch=-1)
    follower.append_follower("d", data, 2)  # the first fetch after it, same group commit
    follower.flush_sync_commit()
    after = state(follower, "d")
    assert after[:2] == (50, 54) and after[3] == [(2, 50)], after
    size1 = seg.stat().st_size
    assert size1 > size0
    follower.close()
    seen = set()
    for cut in range(size0, size1 + 1):
        img = tmp_path / f"cut{cut}"
        shutil.copytree(path, img)
        os.unlink(img / CHECKPOINT_NAME)  # the close's checkpoint is after the write
        with open(img / seg.name, "r+b") as fh:
            fh.truncate(cut)
        c = LogStore.open(str(img), SMALL)
        got = state(c, "d")
        c.close()
        shutil.rmtree(img)
        reset = (50, 50, 50, [], [])  # marker whole, no fetched record whole yet
        assert got in (before, after, reset) or (
            got[0] == 50 and got[4] == after[4][:len(got[4])]), (cut, got)
        assert got != before or cut < size1, cut
        seen.add(got[0])
        if cut == size1:
            assert got == after
    assert seen == {0, 50}  # both sides of the marker were hit
    # a checkpoint written between reset_start and the sync of its marker
    st_ = LogStore.open(str(tmp_path / "g"), SMALL)
    append_n(st_, "d", 10)
    st_.reset_start("d", 50)
    st_.checkpoint()
    img = tmp_path / "g-crash"
    shutil.copytree(tmp_path / "g", img)  # the marker never written: a crash now
    st_.close()
    c = LogStore.open(str(img), SMALL)
    assert state(c, "d") == (50, 50, 50, [], [])
    c.close()
    leader.close()


def test_records_of_an_older_truncation_never_pass_for_the_new_ones(tmp_path: Path):
    """[0, 60) written, truncated to 10 (records 10..59 stay on disk, stale), restarted at 40:
    the leader's records 40.. are read, never the stale ones at the same offsets, also after
    a rebuild from the segments."""
    leader = LogStore.open(str(tmp_path / "leader"), SMALL)
    for off in range(90):
        leader.append("d", 1_000_000 + off, "t/d", 1, None, b"leader-%d" % off)
    leader.flush_sync_commit()
    leader.advance_start("d", 40)
    st_ = LogStore.open(str(tmp_path / "f"), SMALL)
    append_n(st_, "d", 60)
    st_.truncate("d", 10)
    st_.flush_sync_commit()
    st_.reset_start("d", 40)
    st_.flush_sync_commit()
    replicate(leader, st_, "d")
    want = [(o, b"leader-%d" % o) for o in range(40, 90)]
    assert state(st_, "d")[4] == want
    st_.close()
    os.unlink(tmp_path / "f" / CHECKPOINT_NAME)
    st_ = LogStore.open(str(tmp_path / "f"), SMALL)
    assert state(st_, "d")[:2] == (40, 90) and state(st_, "d")[4] == want
    st_.close()
    leader.close()


def test_reset_refuses_pending_appends(tmp_path: Path):
    st_ = LogStore.open(str(tmp_path / "f"), SMALL)
    append_n(st_, "d", 3)
    st_.append("d", 1, "t/d", 1, None, b"pending")
    with pytest.raises(LogStoreError):
        st_.reset_start("d", 50)
    st_.flush_sync_commit()
    st_.reset_start("d", 50)
    st_.close()


def test_retention_never_moves_a_start_past_the_high_water_mark(tmp_path: Path):
    """Kafka's rule (the log start never passes the HW): records a follower has not fetched
    yet are not deleted by byte or age retention; once the mark moves, retention goes on.
    Without it a lagging follower would find them below the leader's start, restart past
    them (reset_start) and the mark would jump over records no reader ever saw."""
    by_bytes = LogSettings(segment_bytes=4096, index_interval_bytes=200,
                           tail_cache_bytes_per_device=0, retention_ms=0,
                           retention_bytes_per_device=2000)
    st_ = LogStore.open(str(tmp_path / "b"), by_bytes)
    append_n(st_, "d", 100)
    st_.set_high_watermark("d", 20)  # the ISR has fetched [0, 20) only
    st_.apply_retention(2_000_000_000_000)
    start = st_.log_range("d")[0]
    assert start <= 20 and st_.stats.retention_held_by_hwm >= 1, start
    assert [r.offset for r in st_.read_durable("d", 20, 1000)] == list(range(20, 100))
    st_.set_high_watermark("d", 100)
    st_.apply_retention(2_000_000_000_000)
    assert st_.log_range("d")[0] > 20  # the mark moved: the byte limit applies again
    st_.close()

    by_age = LogSettings(segment_bytes=4096, index_interval_bytes=256,
                         tail_cache_bytes_per_device=0, retention_ms=1000)
    st_ = LogStore.open(str(tmp_path / "a"), by_age)
    for _ in range(200):  # old records of two devices over several segments
        append_n(st_, "d", 1, ts0=1_000)
        append_n(st_, "o", 1, ts0=1_000)
    append_n(st_, "o", 1, ts0=10**15)  # a fresh segment holding something new
    assert len(st_.segments) > 2
    st_.set_high_watermark("d", 5)
    st_.set_high_watermark("o", st_.durable_end("o"))
    segs = len(st_.segments)
    st_.apply_retention(10**15)
    assert st_.log_range("d")[0] <= 5 and st_.stats.retention_held_by_hwm >= 1
    assert [r.offset for r in st_.read_durable("d", 5, 1000)] == list(range(5, 200))
    assert st_.log_range("o")[0] > 5 and len(st_.segments) == segs  # held for "d"
    st_.set_high_watermark("d", 200)
    st_.apply_retention(10**15)
    assert st_.log_range("d")[0] > 5 and len(st_.segments) < segs
    st_.close()


def test_reset_fails_the_commit_waiters_of_the_dropped_records(tmp_path: Path):
    """A waiter for a record the reset dropped (above the mark, below the old end) gets an
    error, never a success when the mark later passes its offset at the new start."""
    from commitlog.store import LogTruncatedError

    st_ = LogStore.open(str(tmp_path / "f"), SMALL)
    append_n(st_, "d", 10)
    st_.set_high_watermark("d", 5)
    got: list = []
    st_.when_high_watermark("d", 8, got.append)  # record 7 (acks=all of it)
    st_.when_high_watermark("d", 60, got.append)  # a record never written here
    st_.reset_start("d", 50)
    st_.flush_sync_commit()
    st_.set_high_watermark("d", 50)
    assert len(got) == 2 and all(isinstance(e, LogTruncatedError) for e in got), got
    st_.close()
