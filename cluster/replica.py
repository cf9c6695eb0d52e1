"""Replication state of one device log, sans-I/O: Kafka's replica manager, made small.

The leader side (``LeaderState``) is Kafka's ``Partition`` on its leader: it learns each
follower's **log end** from the offsets the follower fetches at, computes the **high-water
mark** (the lowest log end in the ISR, counting its own), and proposes ISR shrinks and
expansions. The follower side (``FollowerState``) is Kafka's fetcher thread for one
partition: where to fetch from, with which **last fetched epoch**, and where to truncate when
the leader answers "diverging" (KIP-101/279, Kafka >= 2.7 answers inside the fetch).

No I/O, no clock of its own (``now`` is passed), no Raft: the caller reads the log
(``commitlog.store``: ``end_offset_for_epoch``, ``truncate``, ``append_follower``,
``set_high_watermark``), sends frames over the mesh, and proposes ISR changes through the
metadata process (``cluster/metastate.py``'s ``set_isr``). So every rule here is a pure
function of what it was told, and unit-tested as such.

Rules, and where each comes from:

- The high-water mark advances only while the ISR has at least ``min_insync`` members
  (Kafka's KIP-966: with fewer, "last replica standing" acknowledged writes that died with
  it). It never moves back on the leader.
- A follower is caught up when it fetches at or past the leader's log end as it was at its
  previous fetch (Kafka's ``lastCaughtUpTimeMs``); one not caught up for ``lag_max_s``
  leaves the ISR (``replica.lag.time.max.ms``). One whose log end reaches the high-water
  mark rejoins (and at least the start of the current leader epoch: it has truncated).
- A fetch whose last fetched epoch ended before the fetch offset (the follower holds a tail
  the leader never had) is answered "diverging" with that epoch's end, and the follower
  truncates to it before fetching again; a log end is learned only from a fetch that did not
  diverge, so a diverged tail is never counted toward the high-water mark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

EndOffsetForEpoch = Callable[[int], tuple[int, int]]  # Kafka's OffsetsForLeaderEpoch
UNDEFINED = -1


@dataclass(frozen=True)
class Diverging:
    """The follower's tail past ``end_offset`` is not in the leader's log: truncate there."""

    epoch: int
    end_offset: int


@dataclass
class _Follower:
    log_end: int = UNDEFINED  # learned from its last non-diverging fetch
    caught_up_at: float = 0.0  # last time it fetched at or past the leader's end (see above)
    leader_end_at_last_fetch: int = 0


@dataclass
class LeaderState:
    """One device log on its leader."""

    me: str
    leader_epoch: int
    epoch_start: int  # where this leader epoch started in the log (its epoch-start record)
    isr: set[str]
    replicas: list[str]
    min_insync: int
    lag_max_s: float
    high_watermark: int = 0
    # when this leadership began (the caller's clock): every follower counts as caught up
    # then, as Kafka's makeLeader resets lastCaughtUpTime; from 0 every follower of a new
    # leader was "behind for ages" and the first ISR check shrank the ISR to the leader alone
    started_at: float = 0.0
    followers: dict[str, _Follower] = field(default_factory=dict)
    # Held False, the high-water mark does not move (a leader past its lease may have been
    # replaced: it must not call anything committed). failover builds it (cluster/lease.py).
    lease_ok: Callable[[], bool] = field(default=lambda: True)

    def __post_init__(self) -> None:
        for r in self.replicas:
            if r != self.me:
                self.followers.setdefault(r, _Follower(caught_up_at=self.started_at))

    def on_fetch(self, replica: str, fetch_offset: int, last_fetched_epoch: int,
                 log_end: int, end_offset_for_epoch: EndOffsetForEpoch,
                 now: float) -> Diverging | None:
        """A follower asks for records from ``fetch_offset``; its previous record is of
        ``last_fetched_epoch``. Returns Diverging (serve nothing) or None (serve from there,
        and the caller then reads ``high_watermark`` for the answer)."""
        f = self.followers.get(replica)
        if f is None:
            raise KeyError(f"{replica!r} is not a replica of this log")
        if last_fetched_epoch != UNDEFINED and fetch_offset > 0:
            epoch, end = end_offset_for_epoch(last_fetched_epoch)
            if epoch == UNDEFINED or epoch < last_fetched_epoch or end < fetch_offset:
                # the follower's epoch is unknown here, or ended earlier on the leader
                return Diverging(epoch, end if epoch != UNDEFINED else self.high_watermark)
        if fetch_offset > log_end:
            return Diverging(self.leader_epoch, log_end)  # ahead of the leader: cannot be
        if fetch_offset >= f.leader_end_at_last_fetch:
            f.caught_up_at = now
        f.leader_end_at_last_fetch = log_end
        f.log_end = fetch_offset
        self.advance(log_end)
        return None

    def advance(self, log_end: int) -> int:
        """Recompute the high-water mark (after a fetch, an ISR change or a local append);
        returns it. Never back; held while the ISR is below ``min_insync``."""
        if len(self.isr) < self.min_insync:
            return self.high_watermark
        if not self.lease_ok():
            return self.high_watermark
        lowest = log_end
        for r in self.isr:
            if r == self.me:
                continue
            f = self.followers.get(r)
            end = UNDEFINED if f is None else f.log_end  # an ISR member we never heard of
            if end < lowest:
                lowest = end
        if lowest > self.high_watermark:
            self.high_watermark = lowest
        return self.high_watermark

    def isr_change(self, now: float) -> set[str] | None:
        """The ISR the leader should propose now, or None if it is right: shrink the
        followers not caught up for ``lag_max_s``; expand by the ones back at the
        high-water mark (and inside this leader epoch)."""
        new = set(self.isr)
        for r, f in self.followers.items():
            if r in new and now - f.caught_up_at > self.lag_max_s:
                new.discard(r)
            elif r not in new and f.log_end >= max(self.high_watermark, self.epoch_start) \
                    and now - f.caught_up_at <= self.lag_max_s:
                new.add(r)
        new.add(self.me)
        return None if new == self.isr else new

    def isr_changed(self, isr: set[str], log_end: int) -> None:
        """Raft committed a new ISR (ours or the controller's)."""
        self.isr = set(isr)
        self.advance(log_end)

    def replicas_changed(self, replicas: list[str], now: float) -> None:
        """Raft committed another replica set at this leader epoch (a reassignment, KIP-455:
        ``reassign`` adds the target replicas, ``complete_reassign`` drops the old ones). An
        added replica is a follower from now (counted caught up now, as a new leader counts
        its followers: ``started_at``), outside the ISR until it reaches the high-water mark
        (``isr_change``); a dropped one is forgotten, so it is never proposed back into the
        ISR (``set_isr`` refuses a router outside the replicas)."""
        self.replicas = list(replicas)
        for r in list(self.followers):
            if r not in replicas:
                del self.followers[r]
        for r in replicas:
            if r != self.me:
                self.followers.setdefault(r, _Follower(caught_up_at=now))


@dataclass
class FollowerState:
    """One device log on a follower: where to fetch, and what a diverging answer means."""

    leader: str
    leader_epoch: int
    log_end: int
    last_fetched_epoch: int = UNDEFINED

    def fetch_request(self) -> tuple[int, int]:
        """(fetch offset, last fetched epoch) for the next FETCH."""
        return self.log_end, self.last_fetched_epoch

    def on_diverging(self, answer: Diverging,
                     own_end_offset_for_epoch: EndOffsetForEpoch) -> int:
        """Where to truncate: the leader's end of that epoch, and no further than this
        replica's own end for it (Kafka: min of both; a replica never keeps more than the
        leader had in an epoch). The caller truncates the log, then fetches again."""
        truncate_to = min(answer.end_offset, self.log_end)
        if answer.epoch != UNDEFINED:
            epoch, own_end = own_end_offset_for_epoch(answer.epoch)
            if epoch != UNDEFINED:
                truncate_to = min(truncate_to, own_end)
        truncate_to = max(0, truncate_to)
        self.log_end = truncate_to
        self.last_fetched_epoch = answer.epoch if answer.epoch != UNDEFINED else UNDEFINED
        return truncate_to

    def on_records(self, new_log_end: int, last_epoch: int) -> None:
        """Records appended (``append_follower``): the next fetch starts at the new end."""
        self.log_end = new_log_end
        self.last_fetched_epoch = last_epoch

    def high_watermark(self, leader_hw: int) -> int:
        """A follower's mark: the leader's, never past its own log end (Kafka)."""
        return min(leader_hw, self.log_end)
