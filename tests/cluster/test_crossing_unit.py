"""The receiving side of a crossing in one call per frame (issue 25): ``fresh_of`` must say of
every entry exactly what ``fresh`` said of it one by one, whatever the frame holds (new
entries, resends after a reconnect, out of order), since a resent APPEND taken as fresh is
stored twice and a fresh one taken as resent is lost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import frames
from cluster.link import InboundSequence


def _entry(seq: int) -> frames.Entry:
    return frames.Entry(seq, frames.DELIVER, "t", b"", 0, False, None, None, None, -1, None)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 50), st.lists(st.integers(1, 60), max_size=20))
def test_fresh_of_a_frame_is_fresh_of_each_entry(received: int, seqs: list[int]) -> None:
    one, batch = InboundSequence(), InboundSequence()
    for s in (one, batch):
        s.reset(b"inc")
        s.received = received
    entries = [_entry(seq) for seq in seqs]
    expect_fresh = [e for e in entries if one.fresh(e.seq)]
    fresh, resent = batch.fresh_of(entries)
    assert fresh == expect_fresh
    assert resent == [e for e in entries if not any(e is f for f in expect_fresh)]
    assert batch.received == one.received


def test_a_frame_of_new_entries_comes_back_as_it_is() -> None:
    s = InboundSequence()
    s.reset(b"inc")
    entries = [_entry(seq) for seq in (1, 2, 3)]
    fresh, resent = s.fresh_of(entries)
    assert fresh is entries and resent == [] and s.received == 3
    fresh, resent = s.fresh_of([_entry(3), _entry(4)])  # a resend, then a new one
    assert [e.seq for e in fresh] == [4] and [e.seq for e in resent] == [3]
