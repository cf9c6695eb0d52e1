"""Leadership follows the device (issue 24's affinity rule): a router that proxies a device's
publishes to the log's leader on another router, while it is itself an in-sync replica of that
log, asks Raft to make it the leader once the device has stayed connected to it for
``cluster.leader_affinity_stable`` seconds.

Why: a log is created where its device first publishes (cluster/raftplace.py), but after a
failover, or when the device reconnects to another node (a load balancer, ``SO_REUSEPORT``
spreading connections over a node's routers), every publish of it crosses the mesh twice (APPEND
out, RESULTS back) and its PUBACK waits for another router's fsync, for as long as it stays
there. Kafka's answer to the same drift is the *preferred leader election*
(``auto.leader.rebalance.enable``): the controller moves leadership back to the preferred
replica with a clean, epoch-bumping election of an in-sync replica. The MQTT form of
"preferred" is "the router the device is connected to", which only that router knows for sure
(the session registry names the router a client id is claimed on, not which connection
publishes which device), so the router asks, and Raft decides: the proposal is the existing
``elect(device, expected_epoch, leader)`` compare-and-set (cluster/metastate.py), refused when
the epoch moved meanwhile (a stale request) or the asker is not in the ISR (not caught up, as
the ISR says). The controller's failover election prefers the connected router the same way.

**Not flapping.** The stable time counts from the first publish of the device that this router
proxied *on the current connection* (the publisher's session's connection, by identity): a
client bouncing between nodes (or between a node's routers) starts over at every reconnect, so
it never moves leadership. On top, a log is not moved here within
``cluster.leader_affinity_min_interval`` of its last leader change seen by this router (a move,
a failover, or any election: whatever moved it, it stays put that long; a router counts the
logs it found at its own start as changed then), and a router asks at most once per stable
period per device. EMQX and VerneMQ have no such rule (their sessions
move, not their storage); Kafka's rebalance runs every ``leader.imbalance.check.interval``
(300 s) for the same reason: leadership moves are not free.

**Losing nothing, keeping order: the move drains first.** From the moment the router decides,
it holds the device's new publishes (bounded by ``cluster.placement_max_held``, as publishes
held for a placement are) and waits until (1) every APPEND it sent the old leader for that
device was answered (acked ones are below the old leader's high-water mark, so this router, an
ISR member, holds them), (2) its own copy is durable and its visible high-water mark reached its
log end (so the new epoch inherits no tail that would be routed a second time; the leader's ack
of this router's last APPEND says the mark passed it, which the next fetch answer would only
say up to ``cluster.replica_fetch_wait`` later), and (3) it has
fetched everything the old leader has. Only then it proposes ``elect``; once Raft committed it
and this router's replica manager started the new epoch (cluster/replication.py), the held
publishes are appended here, in order. Nothing of this device is then in flight at the old
leader when its epoch ends, so no publisher of it sees a refusal. Publishes from *other*
routers (another client publishing the same device elsewhere) may still be in flight: the old
leader fences them at the epoch bump or truncates them as a follower, and their publishers are
told "not stored" (never acked), then retry at the new leader (publisher dedupe finds a copy
that made it). A drain that does not finish within ``DRAIN`` seconds (the old leader slow, a
follower behind) gives up: the held publishes go to the old leader, in order, and the router
asks again after another stable period.

**Bounded state.** One small entry per device this router proxies, at most
``cluster.leader_affinity_max_devices`` (the longest tracked dropped first: that device's
stable time starts over; counted in ``meshmq_leader_affinity_events_total{event="evicted"}``
with a rate-limited log line).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.forwarding import OwnerNotStored
from broker.lograte import RateLimitedLog

log = logging.getLogger("cluster.affinity")

Done = Callable[[BaseException | None, int], None]  # (error or None, offset): Mesh.append_at
Send = Callable[[str, str, Any, "int | None", Done], None]  # Mesh.append_at
Here = Callable[[str, Any, "int | None", Done], None]  # raftplace.append_here

DRAIN = 2.0  # seconds a move may hold a device's publishes before proposing (else: given up)
_POLL = 0.01  # seconds between checks while a move drains or waits for its epoch to start


class AffinityHeldFull(OwnerNotStored):
    """A publish refused while its device's leadership moves here: too many held."""


@dataclass
class _Move:
    epoch: int  # the epoch the move was decided at (the elect's expected epoch)
    old: str  # the leader it moves from
    deadline: float
    decided: float  # time.monotonic() when it was decided (the held publishes' wait)
    held: list[tuple[Any, int | None, Done]] = field(default_factory=list)
    proposed: bool = False
    drained: float = 0.0  # when it was drained (proposed)


@dataclass
class _Device:
    conn: float | None  # the publisher's connection (its accepted_at: one per connection)
    since: float  # first proxied publish on that connection
    proposed_at: float = -math.inf
    inflight: int = 0  # APPENDs sent to the leader, not answered yet
    acked_end: int = 0  # one past the highest offset the leader acknowledged to this router
    move: _Move | None = None


class LeaderAffinity:
    """The router side of the affinity rule (see the module docstring). ``observe`` sits on
    the mesh's APPEND path (``Mesh.append_at``), everything else runs from timers."""

    def __init__(self, settings: Any, me: str, feed: Any, placer: Any, fetchers: Any,
                 store: Any, sessions: dict[str, Any], send: Send, here: Here,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.stable = settings.leader_affinity_stable
        self.min_interval = settings.leader_affinity_min_interval
        self.max_devices = settings.leader_affinity_max_devices
        self.max_held = settings.placement_max_held
        self.append_timeout = settings.append_timeout
        self.me = me
        self.feed = feed
        self.placement = feed.placement
        self.placer = placer
        self.fetchers = fetchers
        self.store = store
        self.sessions = sessions  # the router's client id -> Session (for its connection)
        self._send = send
        self._here = here
        self.loop = loop
        # insertion order: the oldest tracked device is dropped first past the cap (no
        # reordering per publish: this is on the forwarding path)
        self.devices: dict[str, _Device] = {}
        # device -> (leader epoch, when this router learned it) for every log it replicates
        # (one entry per log, as the fetcher keeps): the minimum interval counts from there
        self.changed: dict[str, tuple[int, float]] = {}
        feed.listeners.append(self._record)
        self.held = 0
        self.stats = {"moves": 0, "refused": 0, "failed": 0, "gave_up": 0, "held_full": 0,
                      "evicted": 0}
        self._evicted_log = RateLimitedLog(log, logging.WARNING, "affinity entries evicted",
                                           burst=3, window=60.0)
        self._tasks: set[asyncio.Task] = set()

    # -- the APPEND path ------------------------------------------------------------------
    def observe(self, owner: str, device: str, msg: Any, expiry: int | None,
                done: Done) -> Done | None:
        """A publish of ``device`` about to be sent to its leader ``owner``: returns the
        ``done`` to send it with (counting it in flight), or None when it is held here
        because the device's leadership is moving to this router."""
        e = self.devices.get(device)
        if e is not None and e.move is not None:
            self._hold(device, e, msg, expiry, done)
            return None
        changed = self.changed.get(device)
        if changed is None:
            return done  # not a replica of it here: never eligible, nothing kept
        now = time.monotonic()
        # the publisher's connection, by the moment it was accepted (a float per connection:
        # a reconnect, even of the same client to the same router, is another one); a will
        # (no origin) or a client gone meanwhile has none and never moves anything
        session = self.sessions.get(msg.origin)
        conn = session.conn if session is not None else None
        key = None if conn is None else conn.accepted_at
        if e is None:
            e = self.devices[device] = _Device(key, now)
            if len(self.devices) > self.max_devices:
                self._evict()
        else:
            if e.conn != key:  # another connection (a reconnect, another client): start over
                e.conn, e.since = key, now
            elif key is not None and now - e.since >= self.stable \
                    and now - changed[1] >= self.min_interval \
                    and now - e.proposed_at >= self.stable and self._eligible(device, owner):
                e.proposed_at = now
                epoch = changed[0]
                e.move = _Move(epoch, owner, now + min(DRAIN, self.append_timeout / 2), now)
                self._hold(device, e, msg, expiry, done)
                log.info("device %r has published through this router for %.1f s "
                         "(cluster.leader_affinity_stable) while %s leads its log: draining "
                         "its publishes to move leadership here (%d in flight to it)", device,
                         now - e.since, owner, e.inflight,
                         extra={"device": device, "router": self.me, "leader": owner,
                                "epoch": epoch})
                self.loop.call_soon(self._drain, device, e)
                return None
        e.inflight += 1

        def answered(exc: BaseException | None, offset: int, e: _Device = e) -> None:
            e.inflight -= 1
            if exc is None and offset >= e.acked_end:
                e.acked_end = offset + 1
            done(exc, offset)
        return answered

    def _record(self, device: str, rec: dict) -> bool:
        """A newer Raft record of a log (RaftFeed listener): note when its epoch moved."""
        if self.me not in (rec.get("replicas") or ()):
            self.changed.pop(device, None)
            return True
        epoch = int(rec.get("epoch", 0))
        known = self.changed.get(device)
        if known is None or known[0] != epoch:
            self.changed[device] = (epoch, time.monotonic())
        return True

    def _eligible(self, device: str, owner: str) -> bool:
        """In the ISR of the log's current record, and fetching it from ``owner`` at that
        record's epoch (a follower of this very leadership, not one still starting)."""
        rec = self.feed.records.get(device)
        if rec is None or rec.get("leader") != owner or self.me not in (rec.get("isr") or ()):
            return False
        fol = self.fetchers.devices.get(device)
        return fol is not None and fol.state.leader == owner \
            and fol.state.leader_epoch == int(rec["epoch"])

    def _hold(self, device: str, e: _Device, msg: Any, expiry: int | None,
              done: Done) -> None:
        assert e.move is not None
        if self.held >= self.max_held:
            self.stats["held_full"] += 1
            log.warning("publish refused: %d publishes already wait for leadership moves to "
                        "this router (cluster.placement_max_held)", self.held,
                        extra={"device": device})
            done(AffinityHeldFull(f"not stored: {self.held} publishes already wait while "
                                  f"device logs' leadership moves (cluster.placement_max_held);"
                                  f" retry"), -1)
            return
        self.held += 1
        e.move.held.append((msg, expiry, done))

    def _evict(self) -> None:
        for device, e in self.devices.items():
            if e.move is None:
                del self.devices[device]
                self.stats["evicted"] += 1
                self._evicted_log("device affinity entries full (cluster."
                                  "leader_affinity_max_devices = %d): the longest "
                                  "tracked device's stable time starts over; raise the key if "
                                  "this router proxies more devices than that",
                                  self.max_devices, extra={"device": device})
                return

    # -- the move ---------------------------------------------------------------------------
    def _drain(self, device: str, e: _Device) -> None:
        move = e.move
        if move is None or self.devices.get(device) is not e:
            return
        now = time.monotonic()
        rec = self.feed.records.get(device)
        if rec is None or int(rec["epoch"]) != move.epoch or rec.get("leader") != move.old:
            self._give_up(device, e, "its log's leadership changed meanwhile")
            return
        if now >= move.deadline:
            self._give_up(device, e, "not caught up in time: "
                          f"{e.inflight} publishes unanswered by {move.old}, log end "
                          f"{self.store.log_end(device)}, durable "
                          f"{self.store.durable_end(device)}, high-water mark "
                          f"{self.store.high_watermark(device)}")
            return
        if not self._drained(device, e, move):
            self.loop.call_later(_POLL, self._drain, device, e)
            return
        move.proposed = True
        move.drained = now
        task = self.loop.create_task(self._propose(device, e, move))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _drained(self, device: str, e: _Device, move: _Move) -> bool:
        if e.inflight:
            return False
        store = self.store
        end = store.durable_end(device)
        if store.log_end(device) != end:
            return False
        if store.high_watermark(device) < end:
            if e.acked_end < end:
                return False
            # The leader acknowledged our publish at end - 1: its mark passed it, so every
            # record below ``end`` is committed. A follower learns the mark one fetch later,
            # and an idle log's next answer waits cluster.replica_fetch_wait (0.5 s of held
            # publishes); this router knows it now. Left below, the new epoch would route
            # [mark, end) again as an inherited tail (replication_wiring.route_inherited):
            # every subscriber would get those twice.
            store.set_high_watermark(device, end)
        # everything the old leader had at its last answer is here (an unacked tail of
        # another router's publishes included: the new epoch must not cut what it may ack)
        fol = self.fetchers.devices.get(device)
        return fol is not None and fol.leader_end <= end

    async def _propose(self, device: str, e: _Device, move: _Move) -> None:
        left = max(0.1, self.append_timeout - DRAIN)
        answer = await self.placer.propose(["elect", device, move.epoch, self.me], left)
        if isinstance(answer, str):
            self.stats["failed"] += 1
            self._give_up(device, e, f"the election was not committed: {answer}")
            return
        applied, rec = answer
        if isinstance(rec, dict):
            self.feed.learn(device, rec)
            # refused as "already so": an earlier try of this same compare-and-set applied
            # before its answer was lost (an unknown outcome is proposed again, never taken
            # for success or failure: cluster/metaclient.py)
            applied = applied or (rec.get("leader") == self.me
                                  and int(rec.get("epoch", -1)) == move.epoch + 1)
        if not applied:
            self.stats["refused"] += 1
            self._give_up(device, e, "Raft refused the election (the epoch moved or this "
                          "router is not in the ISR)")
            return
        self.stats["moves"] += 1
        now = time.monotonic()
        log.info("leadership of device log %r moved to this router (affinity): its publisher "
                 "stayed connected here; epoch %d -> %d (drained in %.3f s, committed %.3f s "
                 "later)", device, move.epoch, int(rec.get("epoch", move.epoch + 1)),
                 move.drained - move.decided, now - move.drained,
                 extra={"device": device, "from": move.old, "to": self.me,
                        "epoch": rec.get("epoch"), "reason": "affinity",
                        "held": len(move.held)})
        self._started(device, e, time.monotonic() + left)

    def _started(self, device: str, e: _Device, deadline: float) -> None:
        """Release the held publishes once this router's placement names it the leader (the
        replica manager started the epoch), or at the deadline wherever the placement says."""
        if self.placement.owner_of(device) is not None and time.monotonic() < deadline:
            self.loop.call_later(_POLL, self._started, device, e, deadline)
            return
        self._release(device, e)

    def _give_up(self, device: str, e: _Device, why: str) -> None:
        log.info("leadership of device log %r not moved here: %s; its held publishes go to "
                 "its leader, in order (asked again after cluster.leader_affinity_stable)",
                 device, why, extra={"device": device, "router": self.me})
        if not e.move or not e.move.proposed:
            self.stats["gave_up"] += 1
        self._release(device, e)

    def _release(self, device: str, e: _Device) -> None:
        move, e.move = e.move, None
        if move is None:
            return
        self.held -= len(move.held)
        owner = self.placement.owner_of(device)
        for msg, expiry, done in move.held:
            if owner is None:
                self._here(device, msg, expiry, done)
            else:  # through the mesh again: counted in flight, refused if no leader
                self._send(owner, device, msg, expiry, done)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for e in self.devices.values():
            move, e.move = e.move, None
            for _msg, _expiry, done in move.held if move else ():
                self.held -= 1
                done(OwnerNotStored("not stored: this router is shutting down"), -1)
