"""Internal state logs in the store (keys starting with '#', broker/statelog.py): hidden from
the device listing, never deleted by retention, and trimmed only by ``advance_start``."""

from __future__ import annotations

import os

import pytest

from commitlog.settings import LogSettings
from commitlog.store import CHECKPOINT_NAME, LogStore, OffsetOutOfRangeError, is_internal

STATE = "#sessions"


def test_internal_keys_are_not_device_logs(tmp_path):
    with LogStore.open(str(tmp_path), LogSettings()) as st:
        st.append("d1", 1, "devices/d1/t", 1, None, b"x")
        st.append(STATE, 1, "client-1", 0, None, b"{}")
        st.flush_sync_commit()
        assert st.keys() == ["d1"]
        assert st.internal_keys() == [STATE]
        assert "d1" in st and STATE not in st
        assert st.read(STATE, 0)[0].payload == b"{}"  # its owner still reads it
        assert is_internal(STATE) and not is_internal("d1")


def test_retention_keeps_state_records_until_their_start_moves(tmp_path):
    """Age retention drops old device records but not a state log's: the segments holding
    them stay until advance_start moves past them; then they go too."""
    s = LogSettings(segment_bytes=4096, index_interval_bytes=256, retention_ms=1000,
                    tail_cache_bytes_per_device=0)
    with LogStore.open(str(tmp_path), s) as st:
        st.append(STATE, 0, "client-1", 0, None, b"old state")
        for i in range(300):  # ts in µs: first 150 old, last 150 new
            ts = 0 if i < 150 else 10_000_000
            st.append("a", ts, "t", 0, None, b"x" * 40)
            st.flush_sync_commit()
        st.append(STATE, 10_000_000, "client-1", 0, None, b"snapshot")
        st.flush_sync_commit()
        segs = len(st.segments)
        first = st.segments[0].path
        assert st.apply_retention(now_us=10_500_000) == 0  # pinned by the state record
        assert len(st.segments) == segs and os.path.exists(first)
        assert st.log_range("a")[0] > 0  # the device's own start moved all the same
        assert st.log_range(STATE) == (0, 2)
        st.advance_start(STATE, 1)
        assert st.log_range(STATE) == (1, 2)
        with pytest.raises(OffsetOutOfRangeError):
            st.read(STATE, 0)
        assert [r.payload for r in st.iter_records(STATE)] == [b"snapshot"]
        assert st.apply_retention(now_us=10_500_000) > 0
        assert not os.path.exists(first)
        st.advance_start(STATE, 0)  # never backwards
        st.advance_start(STATE, 99)  # never past the end
        assert st.log_range(STATE) == (2, 2)
    with LogStore.open(str(tmp_path), s) as st:  # the start is in the checkpoint
        assert st.log_range(STATE) == (2, 2)
    (tmp_path / CHECKPOINT_NAME).unlink()
    with LogStore.open(str(tmp_path), s) as st:
        # rebuilt from the records still on disk: possibly an earlier start (a longer suffix,
        # which a compacted log replays to the same state), never a later one
        assert st.log_range(STATE)[1] == 2
        assert [r.payload for r in st.iter_records(STATE)] in ([], [b"snapshot"])


def test_byte_retention_skips_state_logs(tmp_path):
    s = LogSettings(segment_bytes=4096, index_interval_bytes=64,
                    retention_bytes_per_device=512, tail_cache_bytes_per_device=0)
    with LogStore.open(str(tmp_path), s) as st:
        for i in range(100):
            st.append(STATE, i, f"c{i}", 0, None, b"y" * 40)
            st.append("a", i, "t", 0, None, b"x" * 40)
            st.flush_sync_commit()
        st.apply_retention(now_us=10**9)
        assert st.log_range("a")[0] > 0
        assert st.log_range(STATE) == (0, 100)
