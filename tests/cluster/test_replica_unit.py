"""``cluster/replica.py``: the leader's high-water mark and ISR rules and the follower's
truncation rule, as pure functions of what they are told (Kafka's replica manager)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.replica import UNDEFINED, Diverging, FollowerState, LeaderState
from commitlog.epochs import end_offset_for


def _leader(isr=("a", "b", "c"), min_insync=2) -> LeaderState:
    return LeaderState(me="a", leader_epoch=1, epoch_start=0, isr=set(isr),
                       replicas=["a", "b", "c"], min_insync=min_insync, lag_max_s=10.0)


def _same_epoch(epoch: int):
    return lambda e: (1, 10**9) if e >= 1 else (UNDEFINED, UNDEFINED)


def test_the_high_water_mark_is_the_lowest_log_end_in_the_isr() -> None:
    lead = _leader()
    assert lead.on_fetch("b", 5, 1, 10, _same_epoch(1), now=0.0) is None
    assert lead.high_watermark == 0  # c has not fetched: its log end is unknown
    assert lead.on_fetch("c", 7, 1, 10, _same_epoch(1), now=0.0) is None
    assert lead.high_watermark == 5
    lead.on_fetch("b", 10, 1, 10, _same_epoch(1), now=1.0)
    assert lead.high_watermark == 7


def test_below_min_insync_the_mark_is_held_and_a_lagging_follower_leaves_the_isr() -> None:
    lead = _leader()
    lead.on_fetch("b", 4, 1, 4, _same_epoch(1), now=0.0)
    lead.on_fetch("c", 4, 1, 4, _same_epoch(1), now=0.0)
    assert lead.high_watermark == 4
    lead.on_fetch("b", 8, 1, 8, _same_epoch(1), now=20.0)  # c silent since 0.0
    assert lead.isr_change(now=20.0) == {"a", "b"}
    lead.isr_changed({"a", "b"}, log_end=8)
    assert lead.high_watermark == 8
    assert lead.isr_change(now=40.0) == {"a"}  # b silent since 20.0 as well
    lead.isr_changed({"a"}, log_end=12)  # below min_insync = 2
    assert lead.advance(12) == 8  # held (KIP-966: no "last replica standing" acks)
    lead.on_fetch("c", 8, 1, 12, _same_epoch(1), now=41.0)  # back, at the mark
    assert lead.isr_change(now=41.0) == {"a", "c"}
    lead.isr_changed({"a", "c"}, log_end=12)
    lead.on_fetch("c", 12, 1, 12, _same_epoch(1), now=42.0)
    assert lead.high_watermark == 12


def test_a_diverged_tail_is_truncated_to_where_the_leader_s_epoch_ended() -> None:
    # the follower led epoch 1 and wrote offsets 5..9 that nobody else has; the new leader
    # took over at epoch 2 from offset 5 (KIP-101's scenario)
    leader_epochs = [(0, 0, 0, 0), (2, 5, 0, 0)]
    lead = LeaderState(me="b", leader_epoch=2, epoch_start=5, isr={"b", "c"},
                       replicas=["a", "b", "c"], min_insync=2, lag_max_s=10.0)
    answer = lead.on_fetch("a", 10, 1, 12, lambda e: end_offset_for(leader_epochs, e, 12),
                           now=0.0)
    assert answer == Diverging(0, 5)
    follower_epochs = [(0, 0, 0, 0), (1, 5, 0, 0)]
    f = FollowerState(leader="b", leader_epoch=2, log_end=10, last_fetched_epoch=1)
    assert f.on_diverging(answer, lambda e: end_offset_for(follower_epochs, e, 10)) == 5
    assert f.fetch_request() == (5, 0)
    assert lead.on_fetch("a", 5, 0, 12, lambda e: end_offset_for(leader_epochs, e, 12),
                         now=1.0) is None
    assert lead.followers["a"].log_end == 5


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["b", "c", "append", "shrink", "expand"]),
                          st.integers(0, 5)), max_size=60))
def test_the_mark_never_moves_back_nor_past_an_isr_member(steps) -> None:
    lead = _leader()
    end = 0
    ends = {"b": 0, "c": 0}
    now = 0.0
    for what, n in steps:
        now += 1.0
        before = lead.high_watermark
        if what == "append":
            end += n
            lead.advance(end)
        elif what in ("b", "c"):
            ends[what] = min(end, ends[what] + n)  # a follower fetches forward, up to the end
            lead.on_fetch(what, ends[what], 1, end, _same_epoch(1), now=now)
        else:
            new = lead.isr_change(now=now + (15.0 if what == "shrink" else 0.0))
            if new is not None:
                lead.isr_changed(new, end)
        assert lead.high_watermark >= before
        assert lead.high_watermark <= end
        assert "a" in lead.isr
        if lead.high_watermark > before:
            assert len(lead.isr) >= lead.min_insync
            for r in lead.isr - {"a"}:
                assert ends[r] >= lead.high_watermark


def test_a_follower_keeps_no_more_of_an_epoch_than_it_had_itself() -> None:
    # the leader's epoch 0 ran to offset 8; the follower's epoch 0 ended at 5, where its own
    # epoch 1 (never on the leader) began: offsets 5..7 differ, so it truncates to 5, not 8
    answer = Diverging(0, 8)
    f = FollowerState(leader="b", leader_epoch=2, log_end=10, last_fetched_epoch=1)
    own = [(0, 0, 0, 0), (1, 5, 0, 0)]
    assert f.on_diverging(answer, lambda e: end_offset_for(own, e, 10)) == 5


def test_a_new_leaders_followers_count_as_caught_up_when_it_started() -> None:
    """Kafka's makeLeader resets each follower's last caught-up time: a leader elected at
    t=1000 (the monotonic clock) must not shrink followers that have not fetched *yet*."""
    lead = LeaderState(me="a", leader_epoch=1, epoch_start=0, isr={"a", "b", "c"},
                       replicas=["a", "b", "c"], min_insync=2, lag_max_s=2.0,
                       started_at=1000.0)
    assert lead.isr_change(now=1001.0) is None
    assert lead.isr_change(now=1003.0) == {"a"}  # silent past lag_max_s: shrunk


def test_without_the_lease_the_mark_is_held() -> None:
    held = [True]
    lead = LeaderState(me="a", leader_epoch=1, epoch_start=0, isr={"a", "b"},
                       replicas=["a", "b"], min_insync=2, lag_max_s=10.0,
                       lease_ok=lambda: not held[0])
    lead.on_fetch("b", 5, 1, 5, _same_epoch(1), now=0.0)
    assert lead.high_watermark == 0
    held[0] = False
    assert lead.advance(5) == 5
