"""``ReplicaManager``: each device log's role on this router, and the leader's side of
replication (issue 24, docs/replication.md steps 3 and 4's ISR half).

Kafka's ReplicaManager, made for one router process. Raft's log records (cluster/raftplace.py's
``RaftFeed``, one listener call per newer record) drive the role of every device log this
router is a replica of:

- **Leader** (``makeLeaders``): the record names this router, by this process's incarnation
  when it names one. Before the placement sends the first publish here, the log gets the
  epoch-start record of the record's epoch (``start_epoch``: followers' divergence checks
  find the epoch there); a log with appends still pending (it was following a moment ago)
  holds the placement change until they are durable, so no record of the new epoch precedes
  its epoch start. A ``LeaderState`` (cluster/replica.py) learns each follower's log end from
  the offsets it fetches at and computes the **high-water mark** (lowest log end in the ISR,
  moved only while the ISR has ``cluster.min_insync_replicas`` members); the store's
  replicated mark follows it (``set_high_watermark``), so readers see only what every ISR
  member holds and acks, which wait on the mark, become acks=all. With ``cluster.acks =
  "leader"`` (or one replica) the store keeps the single-node rule (visible and acked once
  durable here) and followers still fetch.
- **Follower** (``makeFollowers``): its fetcher (cluster/fetcher.py) pulls from the leader;
  nothing is appended here (the placement forwards publishes to the leader, and fencing
  refuses APPENDs naming this router).
- **Follower-in-waiting**: the record names this router by an older incarnation (the
  controller chose this router's previous run): it leads nothing and fetches from nobody
  until the controller elects again.

The leader serves a replica's FETCH through ``LeaderState.on_fetch`` (divergence answered
inside the fetch, Kafka >= 2.7) and ``read_replica`` (up to the durable end, epoch starts in
place); one with nothing new is **parked** up to ``cluster.replica_fetch_wait`` and answered
as soon as the log's durable end moves (Kafka's delayed fetch; the store tells us which logs
moved at each commit). On a timer (a quarter of ``cluster.replica_lag_time_max``, Kafka checks
at half) the leader proposes ISR shrinks and expansions (``set_isr``, a compare-and-set on its
epoch and ISR version: an unknown outcome is proposed again, a refusal means a newer record
exists and arrives on the stream), and refuses the acks its mark could not reach within
``cluster.append_timeout`` (v5 0x80 with a reason string, Kafka's NOT_ENOUGH_REPLICAS; 3.x: the
connection closes). A refused record stays in the log and may become visible later (at least
once, as with Kafka).

Reads (subscribers, replay, the fetch API) stay at the leader for now, below its mark.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from broker.forwarding import NotCommittedYet
from broker.lograte import RateLimitedLog
from cluster import frames
from cluster.logserve import FETCH_MAX_BYTES, FETCH_MAX_RECORDS
from cluster.replica import Diverging, LeaderState
from cluster.settings import ClusterSettings
from commitlog.store import LogStoreError, OffsetOutOfRangeError

log = logging.getLogger("cluster.replication")

Answer = Callable[[frames.Records], None]
Propose = Callable[[list, float], Awaitable[Any]]
# acks waiting for replication: latency buckets (seconds) of the histogram
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_RETRY = 0.1  # seconds before a leader whose log still had appends pending is tried again


class NotEnoughReplicas(NotCommittedYet):
    """An ack refused because the high-water mark could not pass the record in time (Kafka's
    NOT_ENOUGH_REPLICAS): v5 gets 0x80 with this text as the reason string, 3.x a closed
    connection. The record stays in the leader's log."""


@dataclass
class _Led:
    """One device log this router leads."""

    state: LeaderState
    isr_version: int
    replicas: list[str]
    proposing: bool = False
    stalled_at: float | None = None  # when the mark was last seen stuck below the durable end
    stalled_hw: int = -1
    published: int = -1  # the mark last given to the store
    # (durable end, when) of recent durable moves: the replication latency histogram
    moves: deque = field(default_factory=lambda: deque(maxlen=64))
    # [from, to) of the tail this leader inherited uncommitted, until its mark passes it
    inherited: tuple[int, int] | None = None


@dataclass
class _Parked:
    fetch: frames.Fetch
    answer: Answer
    timer: asyncio.TimerHandle | None = None


def unversioned_tail(store: Any, f: frames.Fetch) -> Diverging | None:
    """A follower with records but no leader epoch at all (its log predates replication: the
    static placement wrote it) cannot show that any of them came from this log. Records it
    holds past the leader's first epoch start are cut there, and it fetches the rest with no
    last epoch (so the epoch starts come with them). Kafka truncated such a replica to its
    high-water mark; here that mark is its own durable end, which would keep all of it."""
    if f.last_epoch >= 0 or f.offset <= 0:
        return None
    # The epochs as seen from the log start (store.epochs: Kafka's truncateFromStart), and
    # never below the start: a follower that restarted its log at this leader's start
    # (cluster/fetcher.py, reset_start) fetches from there with no epoch yet and holds
    # nothing to cut; "diverging below the start" would be answered to it forever.
    epochs = store.epochs(f.device)
    first = max(epochs[0][1] if epochs else 0, store.log_range(f.device)[0])
    return Diverging(-1, first) if f.offset > first else None


class ReplicaManager:
    """Roles of this router's device logs, and the leader side (see the module docstring).
    ``follow``/``unfollow`` are the fetcher's (cluster/fetcher.py): this module decides,
    that one pulls."""

    def __init__(self, settings: ClusterSettings, me: str, store: Any, committer: Any,
                 feed: Any, propose: Propose, fetcher: Any,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
        self.me = me
        self.store = store
        self.committer = committer
        self.feed = feed
        self.propose = propose
        self.fetcher = fetcher
        self.loop = loop
        self.acks_all = settings.acks == "all"
        self.leading: dict[str, _Led] = {}
        self.waiting: set[str] = set()  # followers-in-waiting (older incarnation named)
        self.parked: dict[str, list[_Parked]] = {}
        self.lease_ok: Callable[[], bool] = lambda: True  # failover's lease (the lead wires it)
        # a new leader's inherited tail, committed: (device, from, to) to route to subscribers
        # (meshmq/replication_wiring.py reads the records and routes them through the router)
        self.on_inherited: Callable[[str, int, int], None] | None = None
        self.stats = {"isr_shrinks": 0, "isr_expands": 0, "bytes_out": 0, "acks_refused": 0,
                      "isr_proposals_failed": 0, "lost_log_refusals": 0}
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self._lost_log_line = RateLimitedLog(log, logging.ERROR, "leader lacks replicas' "
                                             "records", burst=3, window=10.0)
        self._refused_log = RateLimitedLog(log, logging.WARNING, "acks refused: high-water "
                                           "mark stuck", burst=3, window=10.0)
        self._tasks: set[asyncio.Task] = set()
        self._tick_every = min(settings.replica_lag_time_max / 4, 0.25)
        self._timer: asyncio.TimerHandle | None = None
        store.durable_listener = self._durable
        feed.listeners.append(self.on_record)

    def start(self) -> None:
        self._timer = self.loop.call_later(self._tick_every, self._tick)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        for parked in self.parked.values():
            for p in parked:
                if p.timer is not None:
                    p.timer.cancel()
        self.parked.clear()
        self.store.durable_listener = None

    # -- role transitions ------------------------------------------------------------------
    def on_record(self, device: str, rec: dict) -> bool:
        """A newer Raft record of ``device``'s log (RaftFeed listener): the role it gives this
        router. False holds the placement change (``feed.release``) until this router can
        start the epoch (appends still pending)."""
        replicas = list(rec.get("replicas") or ())
        if self.me not in replicas:
            self._drop(device)
            return True
        if rec.get("leader") == self.me:
            if not self.feed.leads_here(rec):
                self._drop(device)
                self.waiting.add(device)
                log.warning("Raft names this router's previous run as leader of a device log: "
                            "waiting for the controller to elect again (nothing accepted or "
                            "fetched meanwhile)", extra={"device": device, "router": self.me,
                                                         "epoch": rec.get("epoch")})
                return True
            led = self.leading.get(device)
            if led is not None and led.state.leader_epoch == int(rec["epoch"]):
                led.isr_version = int(rec.get("isr_version", 0))
                if replicas != led.replicas:
                    self._replicas_changed(device, led, replicas)
                led.state.isr_changed(set(rec["isr"]), self.store.durable_end(device))
                self._publish_hw(device, led)
                return True
            return self._become_leader(device)
        self._become_follower(device, rec)
        return True

    def _replicas_changed(self, device: str, led: _Led, replicas: list[str]) -> None:
        """A reassignment changed the replica set at this epoch (cluster/rebalance.py): the
        added replicas are served and counted toward the ISR once caught up, the dropped
        ones forgotten. A log going from one replica to more starts the replicated mark
        (acks wait for the ISR from now: the added replica is outside it until caught up,
        so nothing waits on it before then)."""
        before = led.replicas
        led.replicas = replicas
        led.state.replicas_changed(replicas, time.monotonic())
        store = self.store
        if self.acks_all and len(before) == 1 and len(replicas) > 1:
            self._move_mark(device, led, led.state.advance(store.durable_end(device)))
        elif len(before) > 1 and len(replicas) == 1:
            store.set_high_watermark(device, None)  # the single-node rule again
        log.info("device log replicas changed (reassignment): %s -> %s", before, replicas,
                 extra={"device": device, "router": self.me, "epoch": led.state.leader_epoch})

    def _drop(self, device: str) -> None:
        self.waiting.discard(device)
        self.fetcher.unfollow(device)
        if self.leading.pop(device, None) is not None:
            self._unpark_all(device)
            # No longer a replica (a reassignment moved the log off this router, leadership
            # with it): no follower fetches from here any more, so the mark never moves again
            # and acks waiting on it would hang. Refused (never acked: an unknown outcome is
            # not a success); the publisher retries, at the new leader
            rec = self.feed.records.get(device) or {}
            failed = self.store.fail_high_watermark_waiters(device, NotEnoughReplicas(
                f"not known to be stored: router {self.me} no longer replicates device "
                f"{device} (moved to {rec.get('leader')}); publish again"))
            if failed:
                self.stats["acks_refused"] += failed

    def _become_leader(self, device: str) -> bool:
        self.fetcher.unfollow(device)
        self.waiting.discard(device)
        self.leading.pop(device, None)
        store = self.store
        if store.log_end(device) != store.durable_end(device):
            # a follower's fetched records (or an older epoch's appends) not durable yet: the
            # epoch starts after them, and no publish is taken here before it does
            self.committer.when_durable(lambda _exc: self._retry_leader(device))
            return False
        return self._start_leading(device)

    def _retry_leader(self, device: str) -> None:
        rec = self.feed.records.get(device)
        if rec is None or not self.feed.leads_here(rec):
            self.feed.release(device)  # a newer record took over meanwhile
            return
        store = self.store
        if store.log_end(device) != store.durable_end(device):
            self.loop.call_later(_RETRY, self._retry_leader, device)
            return
        if self._start_leading(device):
            self.feed.release(device)

    def _start_leading(self, device: str) -> bool:
        rec = self.feed.records[device]
        epoch = int(rec["epoch"])
        store = self.store
        try:
            self.committer.start_epoch(device, epoch)
        except (LogStoreError, ValueError) as err:
            # the log already has a newer epoch than Raft's record (cannot be, unless the disk
            # came from elsewhere): never lead it backwards
            log.error("cannot lead device log at epoch %d: %s; not served here (the "
                      "placement change is held: publishes go where they went)", epoch, err,
                      extra={"device": device, "router": self.me})
            self.waiting.add(device)
            return False
        epochs = store.epochs(device)
        start = epochs[-1][1] if epochs else store.log_end(device)
        # records this router fetched as a follower and never saw committed (its mark lags the
        # old leader's by a fetch): the old leader routed them once committed, unless it died
        # first. When this epoch's mark passes them they are routed from here (at least once:
        # a subscriber may get one the old leader routed too; never lost to one)
        inherited = store.high_watermark(device)
        replicas = list(rec["replicas"])
        min_insync = min(self.settings.min_insync_replicas, len(replicas))
        state = LeaderState(self.me, epoch, start, set(rec["isr"]), replicas, min_insync,
                            self.settings.replica_lag_time_max,
                            high_watermark=store.high_watermark(device),
                            started_at=time.monotonic(),
                            lease_ok=lambda: self.lease_ok())  # rewired later: look it up
        led = self.leading[device] = _Led(state, int(rec.get("isr_version", 0)), replicas)
        if not self.acks_all or len(replicas) == 1:
            store.set_high_watermark(device, None)  # the single-node rule: acks=leader, RF 1
        else:
            store.set_high_watermark(device, state.high_watermark)
            led.published = state.high_watermark
        log.info("leading device log", extra={"device": device, "router": self.me,
                                              "epoch": epoch, "isr": sorted(state.isr)})
        if self.on_inherited is not None and start > inherited:
            # Not a commit waiter (store.when_high_watermark): those are acks, and a mark held
            # past cluster.append_timeout fails them all (_check). This tail has no publisher
            # left to retry it, so it waits as long as this epoch lasts and is routed whenever
            # the mark passes it (the chaos suite's kill-leader: a follower that came back
            # after the timeout left it committed and delivered to nobody)
            led.inherited = (inherited, start)
        self._publish_hw(device, led)
        return True

    def _become_follower(self, device: str, rec: dict) -> None:
        if self.leading.pop(device, None) is not None:
            self._unpark_all(device)
            log.info("device log led elsewhere now: following", extra={
                "device": device, "router": self.me, "leader": rec.get("leader"),
                "epoch": rec.get("epoch")})
        self.waiting.discard(device)
        leader = rec.get("leader")
        if not leader:
            self.fetcher.unfollow(device)  # no leader: nothing to fetch from
            return
        self.fetcher.follow(device, leader, int(rec["epoch"]))

    # -- the leader's high-water mark --------------------------------------------------------
    def _publish_hw(self, device: str, led: _Led) -> None:
        """Recompute the mark from what the leader knows; move the store's (readers, acks)."""
        hw = led.state.advance(self.store.durable_end(device))  # on_fetch may have moved it
        if hw > led.published and self.acks_all and len(led.replicas) > 1:
            self._move_mark(device, led, hw)
            now = time.monotonic()
            moves = led.moves
            while moves and moves[0][0] <= hw:
                self._observe(now - moves.popleft()[1])
            # the followers parked meanwhile learn the new mark now, not at the end of their
            # wait (a follower's mark is where a new leader's starts after a failover)
            self._answer_parked(device, led)
        if led.inherited is not None and self.store.high_watermark(device) >= led.inherited[1]:
            self._route_inherited(device, led)  # (the single-node rule: the mark is the end)

    def _move_mark(self, device: str, led: _Led, hw: int) -> None:
        """Give the store the mark ``hw``; the part of an inherited tail it passes is routed
        first. Moving the store's mark runs the commit waiters below it, which route this
        epoch's records (acks, then their delivery): the inherited tail is older than all of
        them, and a session that got a newer record of the device first drops an older one
        as a copy below its position (broker/delivery.py). So the mark stops at the tail's
        end (or at ``hw`` inside it), where the tail's records are readable and nothing of
        this epoch is yet, the tail is routed, then the mark moves on (found by the
        frozen-leader test under load: h9 routed behind the new leader's probe, lost)."""
        inh = led.inherited
        if inh is not None:
            lo, hi = inh
            cut = hw if hw < hi else hi
            if cut > lo and cut > led.published:
                # the part of the tail the mark passes is routed now, even short of its end:
                # a next leader learns this mark and inherits only what lies above it
                # (review12: a mark stopped inside the tail, then a leader change, and the
                # records below it were committed and routed by nobody)
                led.published = cut
                self.store.set_high_watermark(device, cut)
                led.inherited = (cut, hi) if cut < hi else None
                if self.on_inherited is not None:
                    self.on_inherited(device, lo, cut)
        if hw > led.published:
            led.published = hw
            self.store.set_high_watermark(device, hw)

    def _route_inherited(self, device: str, led: _Led) -> None:
        (lo, hi), led.inherited = led.inherited, None
        if self.on_inherited is not None:
            self.on_inherited(device, lo, hi)

    def _answer_parked(self, device: str, led: _Led) -> None:
        parked = self.parked.pop(device, None)
        for p in parked or ():
            if p.timer is not None:
                p.timer.cancel()
            self._serve_now(led, p.fetch, p.answer)

    def _observe(self, seconds: float) -> None:
        self.latency_sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.latency_counts[i] += 1
                return
        self.latency_counts[-1] += 1

    def _durable(self, keys: list[str]) -> None:
        """The store's commit moved these logs' durable ends (``durable_listener``): the
        mark may move (an ISR of the leader alone), and parked fetches have records now."""
        now = time.monotonic()
        for key in keys:
            led = self.leading.get(key)
            if led is None:
                continue
            if self.acks_all:
                led.moves.append((self.store.durable_end(key), now))
            self._publish_hw(key, led)
            self._answer_parked(key, led)

    # -- serving followers -----------------------------------------------------------------------
    def serves(self, device: str, replica: str) -> bool:
        """Whether a FETCH naming ``replica`` (the link's peer: a replica's own fetch) is for a
        log this router leads (any other FETCH is a reader's: served up to the mark by
        cluster/logserve.py). A replica this leader does not know yet is answered by
        ``serve`` too (refused), never as a reader."""
        return device in self.leading

    def serve(self, f: frames.Fetch, answer: Answer) -> None:
        """A follower's FETCH: divergence, its log end learned, records or a parked wait."""
        device = f.device
        led = self.leading[device]
        if f.replica not in led.state.followers:
            # A replica a reassignment added whose record reached it before this leader (each
            # node's metadata process streams on its own), or one it dropped that has not
            # heard yet. Served as a reader's read, it would get records without their epoch
            # starts and the mark; refused, it fetches again shortly (cluster/fetcher.py)
            answer(frames.Records(f.request, frames.RECORDS_FAILED, -1, -1, f.offset,
                                  f"router {f.replica} is not a replica of {device!r} at "
                                  f"leader {self.me} (epoch {led.state.leader_epoch}) yet"
                                  .encode(), self.store.durable_end(device),
                                  led.state.leader_epoch))
            return
        store = self.store
        end = store.durable_end(device)
        div = unversioned_tail(store, f) or led.state.on_fetch(
            f.replica, f.offset, f.last_epoch, end, partial(store.end_offset_for_epoch, device),
            time.monotonic())
        self._publish_hw(device, led)
        if isinstance(div, Diverging) and f.last_epoch >= 0 \
                and div.epoch in (-1, led.state.leader_epoch):
            # The replica holds records of this leader's own epoch (or of one this log has no
            # trace of) past this log's end: this leader lost records it once had (a router
            # restarted with its disk lost, named by a record without leader_incarnation).
            # Telling the replica to truncate would erase acknowledged messages everywhere;
            # it keeps them, this leader's mark stays, and its acks are refused.
            why = (f"leader {self.me} lacks records of {device!r} that replica {f.replica} "
                   f"holds (epoch {f.last_epoch}, up to offset {f.offset}; this log ends at "
                   f"{end}): its log was lost or cut; not truncating the replica")
            self._lost_log(why, device)
            answer(frames.Records(f.request, frames.RECORDS_FAILED, -1, -1, f.offset,
                                  why.encode(), end, led.state.leader_epoch))
            return
        if isinstance(div, Diverging):
            start, _ = store.log_range(device)
            answer(frames.Records(f.request, frames.RECORDS_DIVERGING, start,
                                  self._answer_hw(device, led), f.offset, b"", end,
                                  led.state.leader_epoch, div.epoch, div.end_offset))
            return
        if f.offset < end:
            self._serve_now(led, f, answer)
            return
        p = _Parked(f, answer)
        p.timer = self.loop.call_later(self.settings.replica_fetch_wait, self._parked_out,
                                       device, p)
        self.parked.setdefault(device, []).append(p)

    def _lost_log(self, why: str, device: str) -> None:
        self.stats["lost_log_refusals"] += 1
        self._lost_log_line("%s. Move leadership to an in-sync replica that has them "
                            "(meshmq cluster status --device %s); publishes here are not "
                            "acknowledged meanwhile", why, device, extra={"device": device})

    def _parked_out(self, device: str, p: _Parked) -> None:
        parked = self.parked.get(device)
        if parked and p in parked:
            parked.remove(p)
            if not parked:
                del self.parked[device]
            led = self.leading.get(device)
            if led is not None:
                self._serve_now(led, p.fetch, p.answer)

    def _unpark_all(self, device: str) -> None:
        """No longer the leader: parked fetches hear so (the follower asks the new one)."""
        for p in self.parked.pop(device, None) or ():
            if p.timer is not None:
                p.timer.cancel()
            p.answer(frames.Records(p.fetch.request, frames.RECORDS_NOT_OWNER, -1, -1,
                                    p.fetch.offset, f"router {self.me} no longer leads "
                                    f"{device!r}".encode()))

    def _answer_hw(self, device: str, led: _Led) -> int:
        return led.state.high_watermark if self.acks_all and len(led.replicas) > 1 \
            else self.store.high_watermark(device)

    def _serve_now(self, led: _Led, f: frames.Fetch, answer: Answer) -> None:
        device, store = f.device, self.store
        start, _ = store.log_range(device)
        end = store.durable_end(device)
        epoch = led.state.leader_epoch
        hw = self._answer_hw(device, led)
        try:
            data, nxt = store.read_replica(device, f.offset, min(f.max_records,
                                                                FETCH_MAX_RECORDS),
                                           FETCH_MAX_BYTES, f.last_epoch)
        except OffsetOutOfRangeError:
            answer(frames.Records(f.request, frames.RECORDS_OUT_OF_RANGE, start, hw, f.offset,
                                  b"", end, epoch))
            return
        except Exception as err:  # noqa: BLE001 - the follower hears why and fetches again
            log.warning("serving a follower's fetch failed: %s", err,
                        extra={"device": device, "replica": f.replica})
            answer(frames.Records(f.request, frames.RECORDS_FAILED, start, hw, f.offset,
                                  str(err).encode()[:2000], end, epoch))
            return
        self.stats["bytes_out"] += len(data)
        answer(frames.Records(f.request, frames.RECORDS_OK, start, hw, nxt, data, end, epoch))

    # -- the ISR and stuck acks, on a timer ----------------------------------------------------
    def _tick(self) -> None:
        self._timer = self.loop.call_later(self._tick_every, self._tick)
        now = time.monotonic()
        for device, led in self.leading.items():
            try:
                self._check(device, led, now)
            except Exception:  # noqa: BLE001 - one log's failure must not stop the others
                log.exception("replication check failed", extra={"device": device})

    def _check(self, device: str, led: _Led, now: float) -> None:
        st = led.state
        if not led.proposing:
            new = st.isr_change(now)
            if new is not None:
                led.proposing = True
                self._spawn(self._propose_isr(device, led, new))
        if not self.acks_all or len(led.replicas) == 1:
            return
        hw, end = st.high_watermark, self.store.durable_end(device)
        if hw >= end:
            led.stalled_at = None
            return
        if led.stalled_at is None or hw != led.stalled_hw:
            led.stalled_at, led.stalled_hw = now, hw
            return
        if now - led.stalled_at < self.settings.append_timeout:
            return
        isr = sorted(st.isr)
        if len(st.isr) < st.min_insync:
            why = (f"not enough in-sync replicas for device {device}: ISR {isr}, "
                   f"min_insync_replicas {st.min_insync}")
        elif not st.lease_ok():
            why = (f"not stored: router {self.me} lost its leader lease for device {device} "
                   f"(no contact with the metadata majority)")
        else:
            why = (f"not replicated in time for device {device}: ISR {isr} did not all "
                   f"fetch it within cluster.append_timeout ({self.settings.append_timeout:g}"
                   f" s)")
        failed = self.store.fail_high_watermark_waiters(device, NotEnoughReplicas(why))
        if failed:
            self.stats["acks_refused"] += failed
            self._refused_log("%s: %d acks refused, their records stay in the log (they may "
                              "become visible later). Check the followers (meshmq cluster "
                              "status --device %s)", why, failed, device,
                              extra={"device": device})

    async def _propose_isr(self, device: str, led: _Led, new: set[str]) -> None:
        st = led.state
        before = set(st.isr)  # the stream may bring our own change before the answer does
        cmd = ["set_isr", device, st.leader_epoch, led.isr_version, sorted(new)]
        try:
            answer = await self.propose(cmd, self.settings.append_timeout)
        finally:
            led.proposing = False
        if isinstance(answer, str):
            self.stats["isr_proposals_failed"] += 1
            log.warning("ISR change not committed: %s; proposed again at the next check",
                        answer, extra={"device": device, "isr": sorted(new)})
            return
        applied, rec = answer
        if applied:
            grown = len(new) - len(before)
            self.stats["isr_expands" if grown > 0 else "isr_shrinks"] += 1
            log.log(logging.INFO if grown > 0 else logging.WARNING,
                    "ISR %s for device log: %s -> %s", "expanded" if grown > 0 else "shrunk",
                    sorted(before), sorted(new),
                    extra={"device": device, "epoch": st.leader_epoch,
                           "lag_max": self.settings.replica_lag_time_max})
        if isinstance(rec, dict):
            self.feed.learn(device, rec)  # ours, or the newer record that refused it

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- operations -----------------------------------------------------------------------------
    def under_replicated(self) -> int:
        """Logs led here whose ISR is smaller than their replica set."""
        return sum(1 for led in self.leading.values() if len(led.state.isr) < len(led.replicas))
