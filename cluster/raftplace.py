"""Device logs placed by Raft (``cluster.placement = "raft"``; issue 24, docs/replication.md
step 2): a router's side of the metadata process for placement.

Two jobs, one per process (a router, or the node admin with ``me=None``):

- **Feed** the process's one ``Placement`` from the metadata process's watch stream: the whole
  state once, then every committed change; when the stream ends (the metadata process
  restarted), reconnect and start over (``Placement.learn`` ignores what it already knows).
- **Place** a device log on its first publish (``RaftPlacer.hold``): the publish path meets a
  device with no leader (``placement.UNPLACED``) and hands the publish here; the first one
  proposes ``create_log(device, this router, replicas)`` and every publish of that device waits
  behind it, in order, until Raft answers. The compare-and-set answers with the record that won:
  this router (the held publishes are appended here) or another router that placed it first
  (they are forwarded there, as any publish at a non-leader is). Kafka creates a partition's
  leader the same way, in its controller before the first produce, and EMQX's durable storage
  places a stream in its Raft-held metadata before writing it.

An unknown outcome (the metadata process or the Raft leader lost mid-proposal) is never taken as
success: the same compare-and-set is proposed again, which either applies once or answers with
the record as it is (cluster/metastate.py). No Raft majority within ``cluster.append_timeout``
means the held publishes are refused as not stored (v5 0x80 with a reason string naming the
cause; 3.x: the connection closes), never acknowledged. The held publishes are bounded by
``cluster.placement_max_held`` (refused past it, with a reason string naming the key).

Existing logs (``register``): a router starting under Raft with device logs on disk that Raft
does not know registers them with itself as leader; one Raft places on another router is
reported (ERROR naming both, ``meshmq_placement_conflicts``) and not served as leader here: the
placement says the other router leads it, so no publish or read is taken here as leader.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from broker.forwarding import OwnerNotStored
from broker.message import Message
from cluster.metaclient import Proposer, follow
from cluster.placement import Placement
from cluster.settings import ClusterSettings, split_router_id
from commitlog.store import LogWriteError

log = logging.getLogger("cluster.raftplace")

Done = Callable[[BaseException | None, int], None]  # (error or None, offset): as Mesh.append_at
_RECONNECT = 0.5  # seconds before the watch stream or the proposal socket is dialled again


class PlacementRefused(OwnerNotStored):
    """A publish refused because its device log could not be placed: v5 gets 0x80 with this
    text as the reason string (the router's ``not_stored``), 3.x a closed connection."""


class PlacementHeldFull(PlacementRefused):
    """Past ``cluster.placement_max_held``."""


def replicas_for(settings: ClusterSettings, device: str, leader: str) -> list[str]:
    """The leader first, then one router on each of RF-1 other nodes (``replication_factor``,
    capped by the node count), picked by a rendezvous hash of the device over the nodes so new
    logs spread over the cluster; on each, the router with the leader's index."""
    node, index = split_router_id(leader)
    others = [n.id for n in settings.nodes if n.id != node]
    key = device.encode()
    others.sort(key=lambda n: hashlib.blake2b(n.encode() + b"\0" + key,
                                              digest_size=8).digest(), reverse=True)
    count = max(0, min(settings.replication_factor, len(settings.nodes)) - 1)
    return [leader] + [f"{n}/{index}" for n in others[:count]]


def append_here(router: Any, device: str, msg: Message, expiry: int | None,
                done: Done) -> None:
    """Append a publish held while Raft placed its log on this router: stored, routed and
    answered as a peer's APPEND is (``done(error, offset)`` once durable: ``Mesh.appended``
    reads the ticket ``(None, done, None)``), so its ack waits for the fsync as every ack
    does."""
    try:
        router.remote.append_for_peer(device, msg, expiry, (None, done, None))
    except LogWriteError as err:
        done(err, -1)


# A log record listener (``RaftFeed.listeners``): called with each newer record of a device
# before the placement applies it; False holds the placement change until ``release(device)``
# (a new leader's epoch-start record must precede its first append: cluster/replication.py).
RecordListener = Callable[[str, dict], bool]


class RaftFeed:
    """Feeds ``placement`` from the metadata process's watch stream (see the module
    docstring); ``records`` holds every log record as Raft committed it (leader, ISR,
    replicas, epoch) for whoever answers "who leads D" with more than the leader, and
    ``listeners`` hear each newer one (the replica manager's role transitions)."""

    def __init__(self, placement: Placement, socket_path: str) -> None:
        self.placement = placement
        self.socket_path = socket_path
        self.records: dict[str, dict] = {}
        self.synced = asyncio.Event()  # set once the first snapshot is in
        # this router process's incarnation (hex; cluster/routerreg.py): a record naming this
        # router as leader by an election of another process of it is fenced (no leader here)
        self.incarnation: str | None = None
        self.on_learned: Callable[[str], None] | None = None
        # a router's check that it may lead what a record names it leader of (its log not
        # short of the record's floor: cluster/logfloor.py); False marks the log lost here
        self.admit: Callable[[str, dict], bool] | None = None
        self.listeners: list[RecordListener] = []
        self._held: set[str] = set()  # placement changes a listener holds (``release``)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
                pass

    def learn(self, device: str, rec: Any) -> None:
        """A committed log record (from the stream or a proposal's answer)."""
        if not isinstance(rec, dict) or "leader" not in rec:
            return
        known = self.records.get(device)
        # newer: a later epoch, or the same epoch's later ISR (set_isr keeps the epoch); the
        # same record seen twice (a proposal's answer, then the stream) is not news. A
        # reassignment (``reassign``) changes the replicas at the same epoch and ISR version:
        # news too (an added replica starts following, the leader serves it), unless it is an
        # older record arriving late (a proposal's answer after the stream moved on: ``_moved``)
        if known is not None and _version(rec) == _version(known) \
                and _moved(known) > _moved(rec):
            return  # an older record of the same version: what is known stays
        if known is None or _version(rec) > _version(known) \
                or (_version(rec) == _version(known)
                    and rec.get("replicas") != known.get("replicas")):
            self.records[device] = rec
            held = False
            for listener in list(self.listeners):
                try:
                    held = listener(device, rec) is False or held
                except Exception:  # noqa: BLE001 - one listener's bug must not hide the record
                    log.exception("a Raft log record listener failed", extra={"device": device})
            if held:
                self._held.add(device)
                return
            self._held.discard(device)  # a newer record no listener holds replaces it
        elif _version(rec) == _version(known) and rec != known:
            # the same leader, epoch, ISR and replicas with other fields moved (ops' floor or
            # lost mark): kept, and not news to the role listeners
            self.records[device] = rec
            if device in self._held:
                return
        elif device in self._held:
            return
        self._apply(device)

    def release(self, device: str) -> None:
        """A listener is ready for the placement change it held (``learn``)."""
        if device in self._held:
            self._held.discard(device)
            self._apply(device)

    def leads_here(self, rec: dict) -> bool:
        """Whether ``rec`` makes this router process the leader: named, and by this run's
        incarnation when the record says one (a restarted router is not its old self)."""
        me = self.placement.me
        if me is None or rec.get("leader") != me:
            return False
        inc = rec.get("leader_incarnation")
        return inc is None or self.incarnation is None or inc == self.incarnation

    def _apply(self, device: str) -> None:
        rec = self.records[device]
        leader = rec["leader"]
        fenced_here = leader == self.placement.me and not self.leads_here(rec)
        if fenced_here:
            leader = None  # a follower-in-waiting: no leader here until the controller elects
        since = rec.get("leader_since")
        # the lost-log check (cluster/logfloor.py) only for a record this process may lead: a
        # restarted router named by its old incarnation leads nothing, so its short log is not
        # "lost" while another in-sync replica holds the records (the controller elects it)
        if (not fenced_here or rec.get("lost")) and self.admit is not None \
                and not self.admit(device, rec):
            self.placement.mark_lost(device, int(rec["epoch"]))
        else:
            self.placement.learn(device, leader, int(rec["epoch"]),
                                 since if isinstance(since, int) else None)
        if self.on_learned is not None:
            self.on_learned(device)

    async def _run(self) -> None:
        await follow(self.socket_path, "logs", "log", self.learn, self.synced,
                     "Raft placement", log, _RECONNECT)


def _version(rec: dict) -> tuple[int, int]:
    return int(rec.get("epoch", 0)), int(rec.get("isr_version", 0))


def _moved(rec: dict) -> tuple[bool, int, bool]:
    """How far a record of one version has moved: within a (epoch, ISR version) the commands
    that keep both only ever add a reassignment's target (``complete_reassign`` bumps the ISR
    version), raise the floor and mark the log lost, so a smaller tuple is an older record."""
    return "target" in rec, int(rec.get("floor", 0) or 0), bool(rec.get("lost"))


class RaftPlacer:
    """Places device logs on their first publish (see the module docstring)."""

    def __init__(self, settings: ClusterSettings, me: str, feed: RaftFeed,
                 send: Callable[[str, str, Message, int | None, Done], None],
                 here: Callable[[str, Message, int | None, Done], None]) -> None:
        self.settings = settings
        self.me = me
        self.feed = feed
        self.placement = feed.placement
        self._send = send  # forward to the leader: Mesh.append_at
        self._here = here  # append to this router's log, answered once durable
        self.held: dict[str, list[tuple[Message, int | None, Done]]] = {}
        # peers' APPENDs waiting for this router to hear of their log (``when_placed``)
        # (the epoch it names, run), in arrival order
        self.peers_waiting: dict[str, list[tuple[int, Callable[[], None]]]] = {}
        self.held_count = 0
        self.max_held = settings.placement_max_held
        self.stats = {"placed": 0, "placed_elsewhere": 0, "conflicts": 0, "held_full": 0,
                      "no_majority": 0, "retries": 0}
        self.proposer = Proposer(feed.socket_path, self.stats)
        self.latency: list[float] = []  # seconds from the first held publish to the answer
        self._tasks: set[asyncio.Task] = set()
        feed.on_learned = self._learned

    # -- the publish path --------------------------------------------------------------------
    def hold(self, device: str, msg: Message, expiry: int | None, done: Done) -> None:
        """A publish of a device with no placement: held (in order) until Raft places it."""
        if self.placement.placed(device):  # placed meanwhile: go where it is
            self._release(device, [(msg, expiry, done)])
            return
        if self.held_count >= self.max_held:
            self.stats["held_full"] += 1
            log.warning("publish refused: %d publishes already wait for their device logs to "
                        "be placed by Raft (cluster.placement_max_held); is the metadata "
                        "process slow or without a majority? (meshmq cluster status)",
                        self.held_count, extra={"device": device})
            done(PlacementHeldFull(
                f"not stored: {self.held_count} publishes already wait for device logs to be "
                f"placed (cluster.placement_max_held); retry later"), -1)
            return
        waiting = self.held.get(device)
        self.held_count += 1
        if waiting is not None:
            waiting.append((msg, expiry, done))
            return
        self.held[device] = [(msg, expiry, done)]
        self._spawn(self._place(device, time.monotonic()))

    def when_placed(self, device: str, run: Callable[[], None], epoch: int = -1) -> None:
        """A peer's APPEND for a log this router has not heard placed, or naming a leader
        epoch newer than the one it knows: the peer heard first that this router leads it
        (the compare-and-set answered there before this router's watch stream; or the
        controller's election, which the peer's stream brought first: its APPENDs waiting on
        the old leader move here at once, cluster/appendmove.py). ``run`` (the APPEND's
        fencing check and append) waits, in arrival order, until this router's placement has
        the log at that epoch or ``cluster.append_timeout`` passes; then it is fenced as
        usual if this router does not lead it. Without this wait the first publishes of a log
        placed here from another router's race, and those moved after a failover, were
        refused (Kafka answers a newer epoch than it knows with the retriable
        UNKNOWN_LEADER_EPOCH; the wait here is that retry, without a round trip)."""
        if (self._ready(device, epoch) and device not in self.peers_waiting) \
                or self.held_count >= self.max_held:
            run()
            return
        waiting = self.peers_waiting.get(device)
        self.held_count += 1
        if waiting is not None:
            waiting.append((epoch, run))
            return
        self.peers_waiting[device] = [(epoch, run)]
        asyncio.get_running_loop().call_later(self.settings.append_timeout,
                                              self._peers_timed_out, device)

    def _ready(self, device: str, epoch: int) -> bool:
        """Whether this router's placement has ``device`` at ``epoch`` or later."""
        return self.placement.placed(device) and self.placement.epoch_of(device) >= epoch

    def _peers_timed_out(self, device: str) -> None:
        self._run_peers(device, everything=True)

    def _run_peers(self, device: str, everything: bool = False) -> None:
        """The waiting APPENDs whose epoch is known now, in order: the first still ahead
        stops the rest (their order), until the timeout runs them all (fenced, then)."""
        waiting = self.peers_waiting.pop(device, None) or []
        for i, (epoch, run) in enumerate(waiting):
            if not everything and not self._ready(device, epoch):
                self.peers_waiting[device] = waiting[i:]
                return
            self.held_count -= 1
            try:
                run()
            except Exception:  # noqa: BLE001 - one APPEND's failure (answered to its peer
                # by the run itself) must not stop the others waiting behind it
                log.exception("a peer's APPEND failed after its placement arrived",
                              extra={"device": device})

    def _learned(self, device: str) -> None:
        """Raft placed ``device`` (its stream or the proposal's answer, whichever is first):
        its held publishes go, before any later publish of it is taken (order holds)."""
        waiting = self.held.pop(device, None)
        if waiting:
            self.held_count -= len(waiting)
            self._release(device, waiting)
        if device in self.peers_waiting:
            self._run_peers(device)

    def _release(self, device: str, waiting: list[tuple[Message, int | None, Done]]) -> None:
        owner = self.placement.owner_of(device)
        for msg, expiry, done in waiting:
            if owner is None:
                self._here(device, msg, expiry, done)
            else:  # another router won (or the leader is gone: the mesh refuses it)
                self._send(owner, device, msg, expiry, done)

    def _refuse(self, device: str, why: str) -> None:
        waiting = self.held.pop(device, None) or []
        self.held_count -= len(waiting)
        for _msg, _expiry, done in waiting:
            done(PlacementRefused(why), -1)

    # -- proposals ---------------------------------------------------------------------------
    async def propose(self, cmd: list, timeout: float) -> tuple[bool, Any] | str:
        """Propose ``cmd`` (another module's compare-and-set: the replica manager's
        ``set_isr``) on this placer's connection, retried like a placement (unknown outcome:
        the same command again) until Raft answers or ``timeout`` passes (then: why)."""
        return await self.proposer.propose_until(cmd, time.monotonic() + timeout)

    async def _place(self, device: str, started: float) -> None:
        cmd = self._create_cmd(device)
        answer = await self.proposer.propose_until(cmd, started + self.settings.append_timeout)
        if isinstance(answer, str):
            self.stats["no_majority"] += 1
            log.error("device log not placed: %s; its publishes are refused as not stored "
                      "(known devices keep working). Check `meshmq cluster status`: metadata",
                      answer, extra={"device": device})
            self._refuse(device, f"not stored: the device log could not be placed: {answer}")
            return
        applied, rec = answer
        if not isinstance(rec, dict):
            self._refuse(device, f"not stored: the device log could not be placed: {rec}")
            return
        self.latency.append(time.monotonic() - started)
        del self.latency[:-256]
        self.stats["placed" if rec.get("leader") == self.me else "placed_elsewhere"] += 1
        self.feed.learn(device, rec)  # releases the held publishes (``_learned``)
        if device in self.held:  # Raft's record names no router of ours (learn refused it)
            self._refuse(device, "not stored: Raft places this log on a router this node's "
                                 "config does not list")

    async def register(self, devices: Iterable[str], timeout: float) -> None:
        """Logs on this router's disk that Raft does not know: placed here (their leader is
        where their records are); ones Raft places elsewhere are reported, not served here."""
        todo = []
        for device in devices:
            if device.startswith("#"):
                continue
            rec = self.feed.records.get(device)
            if rec is None:
                todo.append(device)
            elif rec.get("leader") != self.me and self.me not in (rec.get("replicas") or ()):
                # a copy of a log this router replicates is its follower copy, not a conflict
                self._conflict(device, rec)
        if not todo:
            return
        deadline = time.monotonic() + timeout
        answers = await asyncio.gather(*(self.proposer.propose_until(self._create_cmd(d), deadline)
                                         for d in todo))
        left = 0
        for device, answer in zip(todo, answers, strict=True):
            if isinstance(answer, str):
                left += 1
                continue
            rec = answer[1]
            self.feed.learn(device, rec)
            if isinstance(rec, dict) and rec.get("leader") != self.me \
                    and self.me not in (rec.get("replicas") or ()):
                self._conflict(device, rec)
        log.info("device logs on disk registered in Raft", extra={
            "router": self.me, "registered": len(todo) - left, "not_yet": left})
        if left:
            log.error("%d device logs on disk are not registered in Raft yet (no majority?): "
                      "they are not served until a publish places them", left)

    def _create_cmd(self, device: str) -> list:
        """create_log with this router as leader, and its incarnation when registered."""
        cmd = ["create_log", device, self.me, replicas_for(self.settings, device, self.me)]
        if self.feed.incarnation is not None:
            cmd.append(self.feed.incarnation)
        return cmd

    def _conflict(self, device: str, rec: dict) -> None:
        self.stats["conflicts"] += 1
        log.error("device log %r is on this router's disk (%s) but Raft places it on router "
                  "%s: not served here as leader (never two leaders). Its records here are "
                  "not visible; compare both logs before removing one", device, self.me,
                  rec.get("leader"), extra={"device": device, "router": self.me,
                                            "raft_leader": rec.get("leader")})

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for device in list(self.held):
            self._refuse(device, "not stored: this router is shutting down")
        for device in list(self.peers_waiting):
            self._run_peers(device)  # fenced: not placed here
        self.proposer.close_now()
