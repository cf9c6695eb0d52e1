"""``Placement``: which router leads each device log, and at what epoch. The one answer.

Every caller that needs a device log's owner asks one ``Placement`` per process, at the moment
it needs the answer: routing a logged publish (APPEND), serving or relaying a read (FETCH,
RESOLVE, the fetch API's relay), the node admin's ``--device`` answer and proxy, replay and
catch-up cursors (each read, not once at subscribe), session restore and the bench. The broker
gets it as the plain callable it already takes (``owner_of``: ``broker/`` never imports
``cluster/``). Nothing keeps an owner past a change: a caller that must act on one (fail reads
out to a former leader, move a cursor) subscribes to change events.

``leader_of(device)`` answers ``Leader(router, epoch)``, or ``UNKNOWN`` when no router leads the
log now (under Raft: an election in progress, every ISR member gone). A caller treats an unknown
leader as unreachable: a publish is refused as not stored, a read fails and is retried.

Behind it, for now, the static layout: rendezvous (highest-random-weight) hashing over the
configured routers, epoch 0 for every device. Every router computes the same leader from the same
config with no coordination, and adding or removing a router moves only the logs whose highest
weight changes (about 1/N of them), unlike ``hash % N`` (Thaler and Ravishankar's HRW, used for
the same reason by Kafka's sticky assignors and Ceph's CRUSH "straw" buckets). Issue 24 replaces
it with the leader, ISR and leader epoch held in Raft: its watch stream calls ``update`` for each
committed leader move, and the epoch only grows (Kafka's leader epoch: an older one is fenced).

With ``cluster.placement = "raft"`` (``static=False``) there is no hash: a device Raft has not
placed has **no leader yet** (``leader_of`` answers ``UNKNOWN``, ``owner_of`` ``UNPLACED``), and
its first publish places it (cluster/raftplace.py) where its publisher is connected. Raft's
records come in through ``learn`` (the watch stream, and each create_log's answer).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import NamedTuple

log = logging.getLogger("cluster.placement")


class Leader(NamedTuple):
    """The router leading a device log (None: unknown) and its leader epoch."""

    router: str | None
    epoch: int


UNKNOWN = Leader(None, -1)
# what ``owner_of`` answers for a log with no known leader: a router id no link has, so every
# mesh call treats it as unreachable (a publish refused as not stored, a read failed and retried)
NO_LEADER = "(no leader)"
# what ``owner_of`` answers, under Raft placement, for a device Raft has not placed yet: like
# NO_LEADER no link has it (a read fails and is retried), and a publish is held until Raft
# places the log (cluster/raftplace.py)
UNPLACED = "(not placed yet)"
# what ``owner_of`` answers for a log whose acknowledged records were lost with every replica
# (cluster/logfloor.py): like NO_LEADER no link has it, so its publishes are refused as not
# stored and its reads fail, never served from offset 0 again
LOST = "(log lost)"

ChangeHandler = Callable[[str, Leader, Leader], None]  # (device, before, after)


class StaleEpoch(ValueError):
    """An update whose epoch is not above the device's current one (fencing)."""


class PlacedLogs:
    """The logs a Raft placement knows (``Placement.devices``), lost ones left out: a view of
    its table, so a resumed session asking about the one device it names costs a lookup, not
    a copy of every log in the cluster (broker/resumepoints.py)."""

    __slots__ = ("_moved",)

    def __init__(self, moved: dict[str, Leader]) -> None:
        self._moved = moved

    def __contains__(self, device: object) -> bool:
        leader = self._moved.get(device)  # type: ignore[call-overload]
        return leader is not None and leader.router != LOST

    def __iter__(self) -> Iterator[str]:
        return (d for d, leader in list(self._moved.items()) if leader.router != LOST)


class Placement:
    """Leaders of device logs for one cluster layout, seen from router ``me`` (None: from no
    router, e.g. the node admin or a bench)."""

    def __init__(self, routers: list[str], me: str | None = None, static: bool = True) -> None:
        if not routers:
            raise ValueError("no routers configured")
        self.routers = list(routers)
        self.me = me
        self.static = static
        self._seeds = [r.encode() + b"\0" for r in self.routers]
        # the hash is a pure function of (layout, device): caching it keeps nothing stale,
        # moved leaders are looked up first (``_moved``). Under Raft a log Raft does not know
        # has no leader yet, never a hashed one (two routers would both append to it).
        self._hashed: Callable[[str], str] = (lru_cache(maxsize=65_536)(self._rendezvous)
                                              if static else self._unplaced)
        self._moved: dict[str, Leader] = {}
        # device -> the oldest epoch its current leader has led it since without a break
        # (only where older than the current epoch: a router re-elected after its process
        # restarted, cluster/controller.py); an APPEND naming such an epoch is for this log
        self._since: dict[str, int] = {}
        self._handlers: list[ChangeHandler] = []

    # -- the answer -----------------------------------------------------------------------
    def leader_of(self, device: str) -> Leader:
        """The router leading ``device``'s log and its epoch, or ``UNKNOWN``."""
        moved = self._moved.get(device)
        if moved is not None:
            return moved
        return Leader(self._hashed(device), 0) if self.static else UNKNOWN

    def epoch_of(self, device: str) -> int:
        """The leader epoch of ``device``'s log, as ``leader_of(device).epoch``, for the hot
        path that already knows the leader (an APPEND's entry head): one lookup in the moved
        logs, no hash (every log the static layout places is at epoch 0)."""
        leader = self._moved.get(device)
        return 0 if leader is None else leader.epoch

    def known_epoch(self, device: str) -> int:
        """``epoch_of``, but -1 for a log Raft placement has no record of here yet (the static
        hash places every log at epoch 0): the delivery fence (cluster/deliverfence.py) must
        tell "epoch 0" from "not known", one lookup per DELIVER."""
        leader = self._moved.get(device)
        if leader is not None:
            return leader.epoch
        return 0 if self.static else -1

    def leads(self, device: str, epoch: int = -1) -> bool:
        """Whether this router (``me``) leads ``device``'s log, at ``epoch`` when it is not -1:
        the check every APPEND a peer sends goes through (cluster/fencing.py), so one lookup
        and nothing built (``leader_of`` makes a ``Leader`` for its caller)."""
        at = self._moved.get(device)
        router, current = (self._hashed(device), 0) if at is None else at
        if epoch < current and self._since.get(device, current) <= epoch:
            return router == self.me  # an epoch of this leader's unbroken run (leader_since)
        return router == self.me and (epoch < 0 or epoch == current)

    def owner_of(self, device: str) -> str | None:
        """The leader's router id when it is another router, None when it is ``me`` (the
        broker's callable; ``NO_LEADER`` when unknown). Keys starting with "#" are a router's
        own state logs (retained messages, sessions: broker/devicelogs.py's RETAIN_ONLY),
        never another router's."""
        if device.startswith("#"):
            return None
        # leader_of without its tuple: this runs for every logged publish
        moved = self._moved.get(device)
        rid = self._hashed(device) if moved is None else moved.router
        if rid is None:
            return NO_LEADER
        return None if rid == self.me else rid

    def devices(self) -> PlacedLogs | None:
        """Every device log placed (Raft placement, from its watch) but lost, as a live view
        (``in`` costs one lookup; nothing is copied until iterated), None under the static
        hash (it places any name: nothing to list)."""
        return None if self.static else PlacedLogs(self._moved)

    def placed(self, device: str) -> bool:
        """Whether ``device``'s log has a placement (always, under the static hash)."""
        return self.static or device in self._moved

    # -- changes ----------------------------------------------------------------------------
    def subscribe(self, handler: ChangeHandler) -> Callable[[], None]:
        """Call ``handler(device, before, after)`` on every change; returns the unsubscribe."""
        self._handlers.append(handler)
        return lambda: self._handlers.remove(handler)

    def update(self, device: str, router: str | None, epoch: int) -> None:
        """A leader move (or loss: ``router`` None) committed for ``device`` at ``epoch``,
        which must be above the current one (an older update is fenced: ``StaleEpoch``)."""
        before = self.leader_of(device)
        if epoch <= before.epoch:
            raise StaleEpoch(f"leader epoch {epoch} for {device!r} is not above the current "
                             f"{before.epoch}")
        if router is not None and router not in self.routers:
            raise ValueError(f"router {router!r} is not in this cluster")
        after = Leader(router, epoch)
        self._moved[device] = after
        log.info("device log leader changed", extra={
            "device": device, "from": before.router, "to": router, "epoch": epoch})
        for handler in list(self._handlers):
            try:
                handler(device, before, after)
            except Exception:  # noqa: BLE001 - one listener's bug must not hide the change
                log.exception("a placement change listener failed", extra={"device": device})

    def learn(self, device: str, router: str | None, epoch: int,
              since: int | None = None) -> bool:
        """A placement read from Raft (its watch stream, or a create_log's answer): applied
        when its epoch is above the one known (``update``), ignored when it is not (the same
        record seen twice: a snapshot after a reconnect, an answer after its change).
        ``since``: the record's ``leader_since`` (the same router has led since that epoch)."""
        if epoch <= self.leader_of(device).epoch:
            return False
        if router is not None and since is not None and since < epoch:
            self._since[device] = since
        else:
            self._since.pop(device, None)
        if router is not None and router not in self.routers:
            # a router this config does not list (removed from the config): no link has it,
            # so nothing is served or sent there; the log has no reachable leader here
            log.error("Raft places a device log on a router this config does not list: "
                      "its reads and publishes fail here until the config lists it again",
                      extra={"device": device, "router": router})
            router = NO_LEADER
            self._moved[device] = Leader(router, epoch)
            return True
        self.update(device, router, epoch)
        return True

    def mark_lost(self, device: str, epoch: int) -> None:
        """``device``'s log lost records every replica held (cluster/logfloor.py): no router
        leads it at ``epoch`` (Raft's), until Raft moves it to a later one."""
        self._moved[device] = Leader(LOST, max(epoch, self.leader_of(device).epoch, 0))

    # -- the static layout --------------------------------------------------------------------
    @staticmethod
    def _unplaced(device: str) -> str:
        return UNPLACED

    def _rendezvous(self, device: str) -> str:
        key = device.encode()
        best = -1
        owner = self.routers[0]
        for rid, seed in zip(self.routers, self._seeds, strict=True):
            # blake2b is in hashlib (C); router id, NUL, device: 8 bytes of weight is plenty.
            weight = int.from_bytes(hashlib.blake2b(seed + key, digest_size=8).digest(), "big")
            if weight > best:
                best, owner = weight, rid
        return owner
