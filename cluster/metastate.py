"""The cluster metadata Raft replicates: a deterministic state machine, sans-I/O.

What it holds (issue 24): for every device log its **leader, in-sync replicas (ISR), leader
epoch**, an incarnation id and the **leader's incarnation**; the **session registry** (client
id -> router, session epoch); the **routers' registrations** (router id -> its current
process incarnation: KRaft's broker registration with its incarnation id, KIP-903).
Membership is the configured node list for now (static voters, as Kafka's KRaft controller
quorum is), so it is not here yet.

Every command is a compare-and-set on an epoch, the way Kafka's controller answers
AlterPartition (it carries the leader epoch and partition epoch it was computed from; a stale
one is refused with the current state). Why: a Raft proposal can end with an *unknown
outcome* (pysyncobj's LEADER_CHANGED, DISCARDED, UNKNOWN_OUTCOME after a leader died); the
caller then proposes the same command again, and a compare-and-set makes the retry harmless:
it either applies once or answers "already so" with the record as it is now. So every command
returns the record it leaves behind, and the caller judges by that, never by "it returned".

Determinism: ``apply`` reads nothing but its arguments and the state (no clock, no random, no
set iteration order), because every node applies the same log and must reach the same state.
The incarnation id of a log is the number of the command that created it (every node
applies the same commands in the same order, so every node gives it the same number).
"""

from __future__ import annotations

from typing import Any

LogRecord = dict[str, Any]  # {"leader", "isr", "replicas", "epoch", "isr_version", "incarnation"}
# optional fields, absent until set (records written before them stay valid):
# "floor": offsets below it were acknowledged (raise_floor); "lost": every replica lost them
# (mark_lost); "target"/"adding"/"removing": a reassignment in progress (reassign);
# "leader_incarnation"/"leader_since": the process of the leader the controller chose (elect)


class MetadataState:
    """The replicated maps, and the one function that changes them."""

    def __init__(self) -> None:
        self.logs: dict[str, LogRecord] = {}
        self.sessions: dict[str, dict[str, Any]] = {}  # client id -> {"router", "epoch"}
        # client id -> {"epoch", "state"}: a persistent session's saved state (not in snapshots)
        self.session_states: dict[str, dict[str, Any]] = {}
        self.session_seq = 0  # the last session epoch given (one counter for every client id)
        # router id -> {"incarnation": hex of its process's 16 random bytes, "node",
        # "kept_logs": whether it started with device logs on its disk}
        self.routers: dict[str, dict[str, Any]] = {}
        self.index = 0  # commands applied (a watcher's position in the change stream)

    def __setstate__(self, state: dict) -> None:
        """A Raft snapshot written by a build without the router registry still loads."""
        self.__dict__.update(state)
        self.__dict__.setdefault("routers", {})

    # -- the state machine ----------------------------------------------------------------
    def apply(self, cmd: list) -> tuple[bool, Any, tuple | None]:
        """Apply one command: (applied, the record as it now is, the change for watchers or
        None when nothing changed; ``("changes", [change, ...])`` when one command changed
        several records). A malformed command changes nothing and says why."""
        self.index += 1
        handler = _HANDLERS.get(cmd[0]) if cmd else None
        if handler is None:
            return False, f"unknown command {cmd[:1]!r}", None
        try:
            return handler(self, self.index, *cmd[1:])
        except (TypeError, KeyError, ValueError) as err:
            return False, f"malformed command {cmd[0]!r}: {err}", None

    def _create_log(self, index: int, device: str, leader: str, replicas: list[str],
                    leader_incarnation: str | None = None) -> tuple[bool, Any, tuple | None]:
        """A log's first publish places it: leader where the device is (affinity), replicas on
        other nodes. Placed once: a second create (a retry, or a race from another router)
        gets the record that won, so offsets are never restarted elsewhere.

        ``leader_incarnation``: the creating router's process incarnation (hex). A router
        leads a log only while the record names it *and* this incarnation is absent or its
        own, so the same router id restarted (kill -9, disk lost) never resumes leading with
        what it has: the controller elects again (cluster/controller.py). The 3-argument form
        (no incarnation) is kept for routers of the previous build during a rolling upgrade."""
        rec = self.logs.get(device)
        if rec is not None:
            return False, rec, None
        if leader not in replicas:
            return False, f"leader {leader!r} is not among the replicas {replicas!r}", None
        rec = {"leader": leader, "isr": list(replicas), "replicas": list(replicas),
               "epoch": 0, "isr_version": 0, "incarnation": index, "isr_at": index}
        if leader_incarnation is not None:
            rec["leader_incarnation"] = str(leader_incarnation)
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _elect(self, index: int, device: str, expected_epoch: int, leader: str,
               isr: list[str] | None = None) -> tuple[bool, Any, tuple | None]:
        """Leadership moves to an ISR member only (no unclean election), and every move bumps
        the epoch (Kafka's leader epoch: the fence for appends and fetches). The record takes
        the chosen router's registered incarnation (``leader_incarnation``), so only that
        process of it leads. ``isr``, when given, is the new ISR: the old one without the
        dead or fenced routers (Kafka's controller drops fenced brokers from ISRs the same
        way); it must keep the leader and add nobody (a router outside the ISR may lack
        acknowledged records), and the ISR version moves with it."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        if rec["epoch"] != expected_epoch or leader not in rec["isr"]:
            return False, rec, None
        if isr is not None and (leader not in isr or not set(isr) <= set(rec["isr"])):
            return False, rec, None
        if leader == rec["leader"]:
            # the same router again (its process restarted with its logs, and the controller
            # elected it anew): it has led without a break since ``leader_since``, so an
            # APPEND a peer queued for it at any epoch from there is still for this log
            # (cluster/fencing.py via Placement.leads); another leader resets it
            since = rec.get("leader_since", rec["epoch"])
            rec = dict(rec, leader=leader, epoch=rec["epoch"] + 1, leader_since=since)
        else:
            rec = dict(rec, leader=leader, epoch=rec["epoch"] + 1)
            rec.pop("leader_since", None)
        if isr is not None and list(isr) != rec["isr"]:
            rec["isr"] = list(isr)
            rec["isr_version"] += 1
            rec["isr_at"] = index
        registered = self.routers.get(leader)
        if registered is not None:
            rec["leader_incarnation"] = registered["incarnation"]
        else:
            rec.pop("leader_incarnation", None)
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _register_router(self, index: int, router: str, incarnation: str,
                         info: dict | None = None) -> tuple[bool, Any, tuple | None]:
        """A router process announces itself (on every start, before it leads anything): the
        registry keeps each router's current incarnation, and its node (the part of the id
        before "/"). A retry of the same registration answers "already so"; a new incarnation
        replaces the old one, which fences every log record naming the old one (the
        controller then elects again). ``info``: {"kept_logs": bool} (whether the router
        started with device logs on its disk), for the sole-ISR-member rule in the
        controller, and optionally "damaged": [device] (logs whose recovery quarantined a
        corrupt record at this start: the controller elects another ISR member for them)."""
        if not isinstance(router, str) or "/" not in router or not incarnation:
            raise ValueError("expected a router id <node>/<index> and an incarnation")
        old = self.routers.get(router)
        rec = {"incarnation": str(incarnation), "node": router.rpartition("/")[0],
               "kept_logs": bool((info or {}).get("kept_logs", False))}
        damaged = (info or {}).get("damaged")
        if isinstance(damaged, list) and damaged:  # absent unless some log was (older routers)
            rec["damaged"] = [str(d) for d in damaged]
        if old is not None and all(old.get(k) == v for k, v in rec.items()):
            return False, old, None
        # ``since``: the command that registered this process. An ISR membership older than it
        # (the record's ``isr_at``) was the previous process's: its disk may have come back
        # short, so the controller takes it out of the ISR and never elects it (Kafka's
        # KRaft fences a re-registered broker out of every ISR the same way); it rejoins when
        # its leader sees it caught up (set_isr)
        rec["since"] = index
        self.routers[router] = rec
        change: tuple = ("router", router, rec)
        if old is not None and old["incarnation"] != rec["incarnation"] and not rec["kept_logs"]:
            # Back with an empty disk: every ISR it was in as a follower counted records it no
            # longer holds, and the controller elects any ISR member, so electing it before it
            # caught up would lose every acknowledged record of those logs (review5). Out of
            # those ISRs now, in the same command; its leader expands it again once it is back
            # at the high-water mark. KRaft removes a broker re-registering with a new
            # incarnation from every ISR (KIP-903, KIP-966's unclean shutdown). Logs it led
            # are the controller's (it elects another ISR member, ``plan``'s ``lost``).
            dropped = []
            for device, log_rec in self.logs.items():
                isr = log_rec["isr"]
                if router in isr and log_rec["leader"] != router:
                    log_rec = dict(log_rec, isr=[r for r in isr if r != router],
                                   isr_version=log_rec["isr_version"] + 1)
                    dropped.append((device, log_rec))
            for device, log_rec in dropped:
                self.logs[device] = log_rec
            if dropped:
                change = ("changes", [change, *(("log", d, r) for d, r in dropped)])
        return True, rec, change

    def _set_isr(self, index: int, device: str, leader_epoch: int, isr_version: int,
                 isr: list[str]) -> tuple[bool, Any, tuple | None]:
        """The leader shrinks or expands its ISR (Kafka's AlterPartition): refused unless it
        is computed from the current leader epoch and ISR version, and the leader stays in."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        if rec["epoch"] != leader_epoch or rec["isr_version"] != isr_version \
                or rec["leader"] not in isr or not set(isr) <= set(rec["replicas"]):
            return False, rec, None
        rec = dict(rec, isr=list(isr), isr_version=isr_version + 1, isr_at=index)
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _claim_session(self, index: int, client_id: str, router: str,
                       clean: bool = False) -> tuple[bool, Any, tuple | None]:
        """The registry decides who holds a client id: each claim takes the next session
        epoch, and the router holding an older one closes its connection (0x8E).

        Epochs come from one counter for every client id (``session_seq``), not per id: a
        released id claimed again still gets an epoch above any its watchers saw, so a late
        change in a router's watch stream can never look newer than the claim it answered
        (Kafka's producer epochs are bumped the same way, never reset). The answer carries
        more than the registry keeps: the router that held it before (``prev``) and the
        session state last saved for it (``state``, none for a clean start, which drops it),
        so the claiming router resumes the session without asking any peer."""
        self.session_seq = getattr(self, "session_seq", 0) + 1
        old = self.sessions.get(client_id)
        states = self._states()
        saved = states.pop(client_id, None) if clean else states.get(client_id)
        rec = {"router": router, "epoch": self.session_seq}
        self.sessions[client_id] = rec
        answer = dict(rec, prev=old["router"] if old else None,
                      state=saved["state"] if saved and not clean else None)
        return True, answer, ("session", client_id, rec)

    def _release_session(self, index: int, client_id: str, router: str,
                         epoch: int) -> tuple[bool, Any, tuple | None]:
        """A session ended at ``router``: removed only if that claim is still the newest."""
        old = self.sessions.get(client_id)
        if old is None or old["router"] != router or old["epoch"] != epoch:
            return False, old, None
        del self.sessions[client_id]
        self._states().pop(client_id, None)
        return True, None, ("session", client_id, None)

    def _save_session(self, index: int, client_id: str, router: str, epoch: int,
                      state: str) -> tuple[bool, Any, tuple | None]:
        """A persistent session's state (subscriptions, held log offsets, QoS 2 receive state,
        expiry: broker/sessionstore.py ``portable``), saved by the router holding the claim:
        a compare-and-set on the session epoch, so a router that lost the client id (a newer
        claim elsewhere) can never overwrite what the new holder saves. Watchers hear only
        that it changed and its size: the state itself goes out in the next claim's answer."""
        old = self.sessions.get(client_id)
        if old is None or old["router"] != router or old["epoch"] != epoch:
            return False, old, None
        self._states()[client_id] = {"epoch": epoch, "state": state}
        return True, old, ("session_state", client_id, {"epoch": epoch, "bytes": len(state)})

    def _states(self) -> dict[str, dict[str, Any]]:
        # a state pickled by a build before saved session states has no such attribute
        states = getattr(self, "session_states", None)
        if states is None:
            states = self.session_states = {}
        return states

    def _raise_floor(self, index: int, device: str, incarnation: int,
                     floor: int) -> tuple[bool, Any, tuple | None]:
        """The leader records, in batches, how far the log was acknowledged (its high-water
        mark): a replica that comes back shorter than this lost acknowledged records. Only
        ever raised (a retry or a late batch is "already so"), and only for the incarnation
        it was read from (a log deleted and created again starts from 0)."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        if rec["incarnation"] != incarnation or int(floor) <= rec.get("floor", 0):
            return False, rec, None
        rec = dict(rec, floor=int(floor))
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _mark_lost(self, index: int, device: str, incarnation: int, floor: int,
                   end: int) -> tuple[bool, Any, tuple | None]:
        """A leader found its log shorter than the floor (``end`` < ``floor``) and no replica
        to fetch it from: the log is lost, kept as a record (reported everywhere, never
        restarted at offset 0) until an operator acts. Refused when the floor moved since the
        router read it (its view was stale)."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        if rec["incarnation"] != incarnation or rec.get("floor", 0) != floor \
                or not 0 <= int(end) < floor or rec.get("lost"):
            return False, rec, None
        rec = dict(rec, lost={"floor": floor, "end": int(end), "leader": rec["leader"]})
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _reassign(self, index: int, device: str, expected_epoch: int,
                  target: list[str]) -> tuple[bool, Any, tuple | None]:
        """Start moving a log's replicas to ``target`` (Kafka's reassignment, KIP-455):
        the new replicas are *added* first (replicas = target + the old ones, ISR unchanged:
        they join it through set_isr once they have caught up); ``complete_reassign`` drops
        the old ones, and only then. One at a time per log; the same command again is
        "already so"."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        target = list(target)
        if not target or len(set(target)) != len(target):
            return False, f"target {target!r} is empty or names a router twice", None
        if rec["epoch"] != expected_epoch or "target" in rec or target == rec["replicas"]:
            return False, rec, None
        replicas = target + [r for r in rec["replicas"] if r not in target]
        rec = dict(rec, replicas=replicas, target=target,
                   adding=[r for r in target if r not in rec["replicas"]],
                   removing=[r for r in rec["replicas"] if r not in target])
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _complete_reassign(self, index: int, device: str,
                           expected_epoch: int) -> tuple[bool, Any, tuple | None]:
        """Finish a reassignment once every target replica is in the ISR (caught up): the
        replicas become the target, the old ones leave the ISR, and when the leader is not a
        target replica, leadership moves to the first target replica in the ISR (a new
        epoch: the old leader is fenced). Refused while a target replica is not in sync."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        target = rec.get("target")
        if target is None or rec["epoch"] != expected_epoch \
                or not set(target) <= set(rec["isr"]):
            return False, rec, None
        leader, epoch = rec["leader"], rec["epoch"]
        if leader not in target:
            leader, epoch = target[0], epoch + 1  # target[0] is in the ISR (checked above)
        rec = {k: v for k, v in rec.items() if k not in ("target", "adding", "removing")}
        if leader != rec["leader"]:  # as elect does: only that process of the new leader leads
            rec = {k: v for k, v in rec.items() if k != "leader_since"}
            registered = self.routers.get(leader)
            if registered is not None:
                rec["leader_incarnation"] = registered["incarnation"]
            else:
                rec.pop("leader_incarnation", None)
        rec.update(replicas=list(target), isr=[r for r in rec["isr"] if r in target],
                   leader=leader, epoch=epoch, isr_version=rec["isr_version"] + 1,
                   isr_at=index)
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _cancel_reassign(self, index: int, device: str,
                         expected_epoch: int) -> tuple[bool, Any, tuple | None]:
        """Give up a reassignment not completed (``meshmq cluster rebalance --cancel``,
        Kafka's ``kafka-reassign-partitions --cancel``, KIP-455): the replicas go back to the
        old ones, the added ones leave the replica set and the ISR (they stop following;
        what they copied is never served), the leader and its epoch stay: the leader is an
        old replica until ``complete_reassign``, which a cancel can no longer race (it
        finds no target). Refused when no move is in progress or the epoch moved."""
        rec = self.logs.get(device)
        if rec is None:
            return False, f"no log for device {device!r}", None
        if "target" not in rec or rec["epoch"] != expected_epoch:
            return False, rec, None
        added = set(rec.get("adding") or ())
        isr = [r for r in rec["isr"] if r not in added]
        if rec["leader"] in added or not isr:
            return False, rec, None  # cannot happen before completion; never leave no ISR
        rec = {k: v for k, v in rec.items() if k not in ("target", "adding", "removing")}
        rec.update(replicas=[r for r in rec["replicas"] if r not in added], isr=isr,
                   isr_version=rec["isr_version"] + 1, isr_at=index)
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The whole state for a new watcher (JSON-ready)."""
        return {"index": self.index, "logs": self.logs, "sessions": self.sessions,
                "routers": self.routers}


_HANDLERS = {
    "create_log": MetadataState._create_log,
    "elect": MetadataState._elect,
    "register_router": MetadataState._register_router,
    "set_isr": MetadataState._set_isr,
    "claim_session": MetadataState._claim_session,
    "release_session": MetadataState._release_session,
    "save_session": MetadataState._save_session,
    # operations (ops): lost-log detection and replica moves
    "raise_floor": MetadataState._raise_floor,
    "mark_lost": MetadataState._mark_lost,
    "reassign": MetadataState._reassign,
    "complete_reassign": MetadataState._complete_reassign,
    "cancel_reassign": MetadataState._cancel_reassign,
}
COMMANDS = tuple(_HANDLERS)
