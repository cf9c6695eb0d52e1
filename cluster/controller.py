"""The controller: moves device-log leadership off dead nodes and restarted routers (issue 24,
docs/replication.md step 4). Kafka's KRaft controller, made small.

It runs in the metadata process of the **current Raft leader only** (``ControllerLoop`` ticks
on that process's event loop and does nothing while its voter is not the leader), so exactly
one controller acts at a time, and its proposals are compare-and-sets on the leader epoch
(cluster/metastate.py): a controller deposed mid-proposal, or two in a term change, can at
worst propose an ``elect`` that is refused as stale.

**Node liveness** (``alive_nodes``): a node is alive while its voter answered the Raft leader
within ``cluster.node_timeout`` (cluster/raftcontact.py); this node is always alive. A new
controller counts every node as heard at the moment it took over, so it never declares a node
dead before ``node_timeout`` has passed under its own watch. This is Kafka's broker session
timeout (``broker.session.timeout.ms``, 9 s there; a broker that misses heartbeats is fenced).

**Why electing after ``node_timeout`` is safe** (the leader lease, cluster/lease.py): a router
acknowledges publishes only while its node's voter heard from a Raft majority within
``cluster.leader_lease``. A node the controller has not heard from for ``node_timeout`` has
not been counted in by this leader for that long, so its voter's majority time is at least
that old, and ``node_timeout > leader_lease + LEASE_SLACK`` (config.py checks) means its
routers stopped acknowledging before the new leader is elected: a leader partitioned with a
follower does not go on acking while the majority elects another (two leaders acking in one
epoch is what loses acknowledged messages). A controller that just took over was not the one
counting: the old Raft leader's majority time is at most when the voters that elected this one
stopped hearing it, which is before this controller started, so waiting ``node_timeout`` from
its start is enough for it too. ``LEASE_SLACK`` covers the one-message delay of the follower's
majority time and the router's lease poll interval.

**What it elects** (``plan``), for every log whose leader is on a dead node, or whose leader
restarted (its registered incarnation differs from the record's ``leader_incarnation``: the
process that led it is gone, and the new one may have lost its disk): an ISR member on a live
node with a current registration, at a new epoch; the new ISR is the old one without the dead
routers and without a restarted leader whose disk came back empty (Kafka removes fenced brokers
from ISRs). Preference: the restarted leader itself when it came back *with its logs*
(``kept_logs``: it found device logs on its disk at start, so a kill -9 or a clean restart, not
a lost disk, and its recovery quarantined no record of this log: ``damaged``), then the router
the device's client is connected to (session registry, when the
device id is a client id), then the log's replica order (deterministic: every controller picks
the same one). No unclean election: with no eligible ISR member the log stays leaderless and is
reported offline (``offline``; ERROR once per log).

Why a restarted leader with its logs may lead again (KIP-966's rule for the last replica
standing, "only if it holds everything up to the high-water mark", applied to every restarted
leader): the high-water mark never passes the leader's own durable end, and every ack waited
for fsync, so a leader's kept log holds every acknowledged record, and more (its tail past the
mark), which electing a follower would truncate. It is still *elected again*, at a new epoch
recording its new incarnation: the restarted process never resumes on the old election's
authority. A router whose disk came back empty is never re-elected for a log it led: with
another ISR member alive that one leads; with none (it was the only one) the log stays offline
rather than restart at offset 0 (the issue's "offsets are never reused"). The flag is per
router: one that lost some logs' files but kept others passes for all of them (a per-log check
of the log end against the high-water mark needs the replica fetcher's state).

**Batched**: all elections of one scan go in one Raft proposal (one entry, one fsync per voter),
so the thousands of logs of a dead node fail over in one round, not one each.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cluster.settings import LEASE_SLACK  # noqa: F401 - the rule above; defined by the config

log = logging.getLogger("meshmq.controller")

TICK = 0.05  # seconds between liveness checks
RETRY = 0.5  # seconds before a refused or failed proposal's logs are planned again
# seconds a proposal may go unanswered before the controller plans again anyway (pysyncobj
# answers every proposal, a failure included; this only bounds a lost callback: a retry is a
# compare-and-set on the epoch, harmless if the first one did apply)
STUCK = 10.0


def alive_nodes(now: float, nodes: Mapping[str, str], self_node: str,
                last_heard: Callable[[str], float], since: float,
                node_timeout: float) -> frozenset[str]:
    """The nodes alive at ``now``: this one, and every node whose voter (address in ``nodes``)
    was heard within ``node_timeout``, counting ``since`` (when this controller took over) as
    heard (a new controller never declares a node dead sooner than ``node_timeout``).

    A node this voter has never heard from since its process started counts as alive (not
    seen yet): a cluster starting, or restarted whole, must not move logs off a node whose
    processes are still starting (on a loaded host that takes seconds), onto replicas that may
    not have caught up. The cost: a node that dies before this voter ever heard it keeps its
    logs leaderless until it returns or a voter that heard it leads Raft."""
    alive = {self_node}
    for node, addr in nodes.items():
        if math.isinf(last_heard(addr)):
            alive.add(node)  # not seen yet
        elif now - max(last_heard(addr), since) < node_timeout:
            alive.add(node)
    return frozenset(alive)


def _node(router: str) -> str:
    return router.rpartition("/")[0]


def completes(rec: Mapping[str, Any], routers: Mapping[str, dict],
              alive: frozenset[str]) -> bool:
    """Whether a reassignment (``meshmq cluster rebalance``: cluster/rebalance.py) is ready to
    finish: every target replica in the ISR (its leader saw it caught up and proposed
    ``set_isr``), on a live node and registered. ``complete_reassign`` then drops the old
    replicas and, when the leader is not a target, makes the first target replica the leader
    at a new epoch: never one on a dead node (the log would be offline until the next
    election). A target on a dead node leaves the move waiting (``meshmq cluster status``
    reports it stuck) until the node returns and its router catches up: Kafka's reassignment
    likewise waits for a dead target broker rather than finishing without it."""
    target = rec.get("target")
    if not target:
        return False
    isr = set(rec.get("isr") or ())
    return all(r in isr and _node(r) in alive and r in routers for r in target)


def plan(logs: Mapping[str, dict], routers: Mapping[str, dict], alive: frozenset[str],
         sessions: Mapping[str, dict] | None = None) -> tuple[list[list], list[str]]:
    """The ``elect`` commands for every log that must move, and the logs that cannot (offline:
    no eligible ISR member); ``complete_reassign`` for every reassignment whose target
    replicas are all in sync (``completes``). Pure: the controller's whole decision,
    unit-tested alone.

    Why the controller completes reassignments, not the log's leader (which proposed the ISR
    change that made it possible): it already scans every record at every Raft change, on the
    Raft leader, and batches its commands in one entry, so a rebalance of a thousand logs
    finishes in a few proposals; it knows node liveness (never makes a dead router leader);
    and it finishes a move whose leader died mid-way, after electing another, with no
    reassignment logic in the routers. Kafka's KRaft controller completes a reassignment the
    same way, when it applies the AlterPartition that puts the last target replica in sync."""
    cmds: list[list] = []
    offline: list[str] = []
    sessions = sessions or {}
    for device, rec in logs.items():
        leader = rec.get("leader")
        isr = rec.get("isr") or []
        inc = rec.get("leader_incarnation")
        reg = routers.get(leader) if leader else None
        restarted = inc is not None and reg is not None and reg["incarnation"] != inc
        # followers whose process registered after the ISR was last set: that membership was
        # their previous process's, whose disk may have come back short (wiped, restored)
        isr_at = int(rec.get("isr_at", 0))
        stale = [r for r in isr if r != leader and r in routers
                 and int(routers[r].get("since", 0)) > isr_at]
        if leader is not None and _node(leader) in alive and not restarted:
            if stale:  # out of the ISR until their leader sees them caught up (set_isr)
                cmds.append(["set_isr", device, rec["epoch"], rec["isr_version"],
                             [r for r in isr if r not in stale]])
            elif completes(rec, routers, alive):
                cmds.append(["complete_reassign", device, rec["epoch"]])
            continue  # led by a live router of the incarnation that was elected
        lost = restarted and not (reg or {}).get("kept_logs")  # came back with an empty disk
        keep = [r for r in isr if _node(r) in alive and r in routers and r not in stale
                and not (r == leader and lost)]
        if restarted and leader in keep and len(keep) > 1 \
                and device in ((reg or {}).get("damaged") or ()):
            # its recovery quarantined a record of this log (rot, a torn write): re-elected,
            # it would serve the hole although the others hold good copies (review 7). Out of
            # the ISR; as a follower it repairs the hole from the new leader
            # (cluster/logverify.py, the fetcher's repair) and rejoins. Kafka takes a log dir
            # with a corrupt record offline and elects elsewhere. The last replica standing
            # still leads with the hole: offline would lose every other record too.
            keep.remove(leader)
        if not keep:
            offline.append(device)
            floor = int(rec.get("floor") or 0)
            if lost and floor > 0 and not rec.get("lost") and not any(
                    _node(r) in alive and r in routers for r in isr if r != leader):
                # its only in-sync replica came back with an empty disk: what Raft recorded as
                # acknowledged (the floor: cluster/logfloor.py) is gone with it. Reported lost
                # everywhere (status, metrics), never restarted at offset 0
                cmds.append(["mark_lost", device, rec["incarnation"], floor, 0])
            continue
        # the restarted leader with its logs first (it holds the most: its tail past the
        # high-water mark too, and offsets continue where its clients saw them; its acked
        # records are on its disk: an ack waits for its fsync), then the router the device is
        # connected to, then replica order. ``kept_logs`` says what its disk held before its
        # fetchers copied anything (meshmq/cluster_wiring.py): a wiped router that had copied
        # part of other logs before registering was re-elected from that short copy (chaos)
        preferred = leader if restarted and leader in keep else \
            sessions.get(device, {}).get("router")
        if preferred not in keep:
            order = rec.get("replicas") or isr
            preferred = min(keep, key=lambda r: (order.index(r) if r in order else len(order),
                                                 r))
        cmds.append(["elect", device, rec["epoch"], preferred, keep])
    return cmds, offline


class ControllerLoop:
    """Drives ``plan`` on the metadata process's event loop while its voter leads Raft.

    ``read`` returns (index, logs, routers, sessions) copied under the state lock; ``propose``
    submits a batch of commands as one Raft entry and calls back (results or None, error
    name or None) from any thread; ``is_leader`` asks pysyncobj."""

    def __init__(self, loop: asyncio.AbstractEventLoop, self_node: str, nodes: Mapping[str, str],
                 node_timeout: float, is_leader: Callable[[], bool],
                 last_heard: Callable[[str], float],
                 read: Callable[[], tuple[int, dict, dict, dict]],
                 propose: Callable[[list, Callable[[Any, str | None], None]], None]) -> None:
        self.loop = loop
        self.self_node = self_node
        self.nodes = {n: a for n, a in nodes.items() if n != self_node}
        self.node_timeout = node_timeout
        self.is_leader = is_leader
        self.last_heard = last_heard
        self.read = read
        self.propose = propose
        self.since: float | None = None  # when this voter last became Raft leader
        self.in_flight = False
        self.in_flight_since = 0.0
        self.retry_at = 0.0
        self._scanned: tuple | None = None
        self.alive: frozenset[str] = frozenset()
        self.offline: set[str] = set()
        self.stats = {"elections": 0, "proposals": 0, "refused": 0, "failed": 0,
                      "reassignments": 0}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self.loop.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                self.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - one bad scan must not stop failover for good
                log.exception("controller scan failed; trying again")
            await asyncio.sleep(TICK)

    def tick(self, now: float) -> None:
        if not self.is_leader():
            if self.since is not None:
                log.info("controller stopped: this metadata process's voter is no longer the "
                         "Raft leader (the new leader's controller takes over)")
                self.since = None
                self._scanned = None
            return
        if self.since is None:
            self.since = now
            log.info("controller started: this voter leads Raft; nodes count as alive for "
                     "cluster.node_timeout = %.2f s from now before any is declared dead",
                     self.node_timeout, extra={"nodes": sorted(self.nodes)})
        alive = alive_nodes(now, self.nodes, self.self_node, self.last_heard, self.since,
                            self.node_timeout)
        if alive != self.alive:
            dead = sorted(set(self.nodes) - alive)
            log.warning("node liveness changed: alive %s, dead %s%s", sorted(alive), dead,
                        ": their logs' leadership moves to live ISR members" if dead else "")
            self.alive = alive
        if self.in_flight:
            if now - self.in_flight_since < STUCK:
                return
            log.warning("controller proposal unanswered for %.0f s: planning again", STUCK)
            self.in_flight = False
        index, logs, routers, sessions = self.read()
        key = (index, alive)
        if key == self._scanned and now < self.retry_at:
            return
        self._scanned = key
        self.retry_at = now + RETRY
        cmds, offline = plan(logs, routers, alive, sessions)
        newly = sorted(set(offline) - self.offline)
        if newly:
            log.error("%d device logs are offline: no live in-sync replica to elect (no unclean "
                      "election); they accept no writes until an ISR member's node is back",
                      len(newly), extra={"devices": newly[:20]})
        self.offline = set(offline)
        if not cmds:
            return
        self.in_flight = True
        self.in_flight_since = now
        self.stats["proposals"] += 1
        started = time.monotonic()

        def done(results: Any, error: str | None) -> None:
            self.loop.call_soon_threadsafe(self._answered, cmds, results, error, started)
        self.propose(cmds, done)

    def _answered(self, cmds: list, results: Any, error: str | None, started: float) -> None:
        self.in_flight = False
        if error is not None:
            self.stats["failed"] += 1
            log.warning("controller proposal of %d elections not committed (%s): planned "
                        "again from the state as it is", len(cmds), error)
            return
        moved = sum(1 for (applied, _), c in zip(results, cmds, strict=False)
                    if applied and c[0] == "elect")
        done = sum(1 for (applied, _), c in zip(results, cmds, strict=False)
                   if applied and c[0] == "complete_reassign")
        refused = sum(1 for applied, _ in results if not applied)
        self.stats["elections"] += moved
        self.stats["reassignments"] += done
        self.stats["refused"] += refused
        if done:
            log.info("controller completed %d reassignments (every target replica in "
                     "sync: the old replicas dropped)", done,
                     extra={"devices": _sample(c[1] for c in cmds
                                               if c[0] == "complete_reassign")})
        if moved or refused or len(cmds) > done:
            log.warning("controller moved the leadership of %d device logs in %.3f s (%d "
                        "refused as stale: planned again)", moved, time.monotonic() - started,
                        refused, extra={"devices": _sample(c[1] for c in cmds),
                                        "to": _sample(c[3] for c in cmds
                                                      if c[0] == "elect")})
        self._scanned = None  # scan again at once: the state moved


def _sample(items: Iterable[str], n: int = 10) -> list[str]:
    out = []
    for item in items:
        if len(out) >= n:
            break
        out.append(item)
    return out
