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

# {"leader", "isr", "replicas", "epoch", "isr_version", "incarnation", "leader_incarnation"}
LogRecord = dict[str, Any]


class MetadataState:
    """The replicated maps, and the one function that changes them."""

    def __init__(self) -> None:
        self.logs: dict[str, LogRecord] = {}
        self.sessions: dict[str, dict[str, Any]] = {}  # client id -> {"router", "epoch"}
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
        None when nothing changed). A malformed command changes nothing and says why."""
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
               "epoch": 0, "isr_version": 0, "incarnation": index}
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
        controller."""
        if not isinstance(router, str) or "/" not in router or not incarnation:
            raise ValueError("expected a router id <node>/<index> and an incarnation")
        old = self.routers.get(router)
        rec = {"incarnation": str(incarnation), "node": router.rpartition("/")[0],
               "kept_logs": bool((info or {}).get("kept_logs", False))}
        if old == rec:
            return False, old, None
        self.routers[router] = rec
        return True, rec, ("router", router, rec)

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
        rec = dict(rec, isr=list(isr), isr_version=isr_version + 1)
        self.logs[device] = rec
        return True, rec, ("log", device, rec)

    def _claim_session(self, index: int, client_id: str,
                       router: str) -> tuple[bool, Any, tuple | None]:
        """The registry decides who holds a client id: each claim takes the next session
        epoch, and the router holding an older one closes its connection (0x8E)."""
        old = self.sessions.get(client_id)
        rec = {"router": router, "epoch": (old["epoch"] + 1) if old else 1}
        self.sessions[client_id] = rec
        return True, rec, ("session", client_id, rec)

    def _release_session(self, index: int, client_id: str, router: str,
                         epoch: int) -> tuple[bool, Any, tuple | None]:
        """A session ended at ``router``: removed only if that claim is still the newest."""
        old = self.sessions.get(client_id)
        if old is None or old["router"] != router or old["epoch"] != epoch:
            return False, old, None
        del self.sessions[client_id]
        return True, None, ("session", client_id, None)

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
}
COMMANDS = tuple(_HANDLERS)
