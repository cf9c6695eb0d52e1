"""``ResendCheck`` against a real LogStore (cluster/idempotence.py): what a restarted owner finds
of a resent APPEND in its log, and what it must not find (issue 28, the chaos suite's
``dups_in_log``).

* an APPEND of the publisher incarnation it adopted, within the first window: found at its offset;
* the same seq of a *restarted* publisher (another incarnation, seqs starting again): not found;
* a seq past the resend window (never resent: at most link_window were unanswered): no read;
* a record older than the lookback before the previous run's last write: not looked for (and
  the time the owner was down does not count against it);
* a corrupt record in the tail: the store reads around it, the others are found, no error.
"""

from __future__ import annotations

import time
from pathlib import Path

from broker.devicelogs import H_SOURCE
from cluster.idempotence import RESEND_LOOKBACK_S, ResendCheck, source_value
from commitlog.record import HEADER, HEADER_SIZE
from commitlog.store import LogStore

PUB = b"A" * 16  # the publisher router's incarnation
DEV = "dev1"


def _store(path: Path, seqs: range, ts: int, inc: bytes = PUB) -> None:
    with LogStore.open(str(path)) as st:
        st.append(DEV, ts, f"devices/{DEV}/t", 1, None, b"local")  # a local publish: no :src
        for seq in seqs:
            st.append(DEV, ts, f"devices/{DEV}/t", 1, [(H_SOURCE, source_value(inc, seq))],
                      f"m{seq}".encode())
        st.flush_sync_commit()


def test_a_resent_append_is_found_only_for_its_own_publisher_incarnation(
        tmp_path: Path) -> None:
    now = time.time_ns() // 1000
    _store(tmp_path / "log", range(1, 21), now - 1_000_000)
    with LogStore.open(str(tmp_path / "log")) as st:
        check = ResendCheck(window=8, started_us=now)
        check.adopt(PUB)
        assert check.stored_at(st, DEV, 3, PUB) == 3  # offset 0 is the local publish
        assert check.stored_at(st, DEV, 1, PUB) == 1
        assert check.stored_at(st, DEV, 15, PUB) is None  # past the window (first seq 3 + 8)
        assert check.stored_at(st, "other", 4, PUB) is None  # another device: nothing there
        check.adopt(b"B" * 16)  # the publisher restarted: its seq 3 is a new publish
        assert check.stored_at(st, DEV, 3, b"B" * 16) is None
        assert check.scanned == 3
        # a later incarnation that was not adopted (the publisher restarted again while we
        # ran) is never looked up as the adopted one: its seqs start from 1 again
        check.adopt(PUB)
        check.forget()  # the link heard a later incarnation, C
        assert check.stored_at(st, DEV, 2, b"C" * 16) is None


def test_a_record_another_leader_appended_for_the_same_publisher_is_not_a_resend(
        tmp_path: Path) -> None:
    """With replication a log holds records other leaders appended for this publisher
    incarnation under *their* links' seqs: a restarted leader must not take a new APPEND for
    one of them (the chaos suite saw a new publish answered "stored at offset 28" and lost)."""
    now = time.time_ns() // 1000
    with LogStore.open(str(tmp_path / "log")) as st:
        for seq in range(1, 6):  # appended at n1 for the publisher, replicated here
            st.append(DEV, now - 1_000_000, f"devices/{DEV}/t", 1,
                      [(H_SOURCE, source_value(PUB, seq, "n1/0"))], f"m{seq}".encode())
        st.flush_sync_commit()
        here = ResendCheck(window=8, started_us=now, owner="n2/0")
        here.adopt(PUB)
        assert here.stored_at(st, DEV, 3, PUB) is None  # n2's link seq 3 is a new publish
        there = ResendCheck(window=8, started_us=now, owner="n1/0")
        there.adopt(PUB)
        assert there.stored_at(st, DEV, 3, PUB) == 2  # n1's own record: a resend to it


def test_records_older_than_the_lookback_are_not_looked_for(tmp_path: Path) -> None:
    now = time.time_ns() // 1000
    _store(tmp_path / "log", range(1, 4), now - int((RESEND_LOOKBACK_S + 60) * 1e6))
    with LogStore.open(str(tmp_path / "log")) as st:
        # the previous run's last write (the lookback is measured back from it: review3)
        st.append(DEV, now - 1_000_000, f"devices/{DEV}/t", 1,
                  [(H_SOURCE, source_value(PUB, 4))], b"m4")
        st.flush_sync_commit()
        check = ResendCheck(window=8, started_us=now)
        check.adopt(PUB)
        assert check.stored_at(st, DEV, 1, PUB) is None
        assert check.stored_at(st, DEV, 4, PUB) == 4


def test_a_corrupt_record_in_the_tail_is_read_around(tmp_path: Path) -> None:
    now = time.time_ns() // 1000
    _store(tmp_path / "log", range(1, 6), now - 1_000_000)
    seg = sorted((tmp_path / "log").glob("*.log"))[-1]
    data = bytearray(seg.read_bytes())
    p, seen = 0, 0
    while p + HEADER_SIZE <= len(data):  # damage the payload of the record of seq 3
        length, _c, _m, _f, _a, off, _ts, _kl, _tl, _hc = HEADER.unpack_from(data, p)
        if off == 3:
            data[p + 4 + length - 2] ^= 0x01
            seen += 1
        p += 4 + length
    assert seen == 1
    seg.write_bytes(bytes(data))
    with LogStore.open(str(tmp_path / "log")) as st:
        check = ResendCheck(window=8, started_us=now)
        check.adopt(PUB)
        assert check.stored_at(st, DEV, 3, PUB) is None  # lost: stored again by the resend
        assert [check.stored_at(st, DEV, s, PUB) for s in (1, 2, 4, 5)] == [1, 2, 4, 5]


def test_an_owner_down_longer_than_the_lookback_still_finds_what_it_stored(
        tmp_path: Path) -> None:
    """review3: the lookback was measured back from this process's start, so an owner that
    stayed down longer than it (a reboot, a crash noticed after minutes) stored every resent
    APPEND a second time. Measured back from the last record its previous run wrote, the
    downtime does not count; a local publish made since this start does not move it."""
    now = time.time_ns() // 1000
    down = int((RESEND_LOOKBACK_S + 120) * 1e6)  # the previous run died this long ago
    _store(tmp_path / "log", range(1, 6), now - down)
    with LogStore.open(str(tmp_path / "log")) as st:
        st.append(DEV, now + 1000, f"devices/{DEV}/t", 1, None, b"local, since our start")
        st.flush_sync_commit()
        check = ResendCheck(window=8, started_us=now)
        check.adopt(PUB)
        assert check.stored_at(st, DEV, 4, PUB) == 4, (
            "a resend of an APPEND stored just before a long downtime was not found (it is "
            "stored twice)")
        assert check.stored_at(st, DEV, 1, PUB) == 1
