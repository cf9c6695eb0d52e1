"""The session registry in Raft (``cluster.placement = "raft"``; issue 24): a router's side.

Who holds a client id is decided by the metadata Raft group (``cluster/metastate.py``,
``claim_session``), not by asking the other routers: a CONNECT proposes a claim through this
node's metadata process and its CONNACK waits for the commit, and nothing else. So a frozen or
unreachable peer never delays a CONNECT (the mesh's CLAIM asked every peer and waited up to 2 s
for each silent one), and after a partition heals exactly one connection per client id
survives: every router watches the registry's changes and closes its connection of a client id
claimed at a newer session epoch elsewhere (v5 DISCONNECT 0x8E). EMQX's session registry
(``emqx_cm_registry``, in Mria) and Kafka's group coordinator (one owner per group, fenced by
generation) decide ownership the same way: in replicated state, by epoch.

A persistent session's state is saved in the same registry (``save_session``, compare-and-set
on the session epoch; docs/replication.md says why Raft and not a replicated log), so a claim
at any router answers with it and the session resumes there even when its old node is gone
with its disk.

This module knows nothing of MQTT: the broker side (``broker/registry.py``) calls ``claim``,
``release`` and ``save`` and is told ``on_taken`` (the broker never imports ``cluster/``; the
node wiring joins them, ``meshmq/session_wiring.py``).

Outcomes: a claim either commits (its epoch, the previous holder, the saved state) or fails
with a reason (no Raft majority within ``cluster.append_timeout``), never "maybe": an unknown
outcome (the Raft leader lost mid-proposal) is proposed again. A retried claim takes one more
epoch, which is harmless (the same router holds it, at the newer epoch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from cluster.metaclient import Proposer, follow

log = logging.getLogger("cluster.sessionreg")

_RECONNECT = 0.5  # seconds before the watch stream is dialled again


class Claimed(NamedTuple):
    """A committed claim: this router holds the client id at ``epoch``; ``prev`` held it
    before (None: nobody); ``state`` is the session state last saved for it (None: none, or a
    clean start)."""

    epoch: int
    prev: str | None
    state: str | None


class SessionRegistry:
    """Claims, releases and saves through this node's metadata process; watches the
    registry and calls ``on_taken(client_id, router, epoch)`` when a client id this router
    holds is claimed at a newer epoch by another router."""

    def __init__(self, me: str, socket_path: str, timeout: float) -> None:
        self.me = me
        self.socket_path = socket_path
        self.timeout = timeout  # cluster.append_timeout: how long a CONNECT waits for Raft
        self.held: dict[str, int] = {}  # client id -> the epoch this router holds it at
        # client ids with a claim in flight here -> the newest epoch seen elsewhere meanwhile
        # (the watch and the proposal's answer are two streams: a newer claim elsewhere can be
        # seen before this router's own, older, answer arrives)
        self.claiming: dict[str, int] = {}
        self.on_taken: Callable[[str, str, int], None] = lambda _c, _r, _e: None
        self._tasks: set[asyncio.Task] = set()
        self._watching: asyncio.Task | None = None
        self.synced = asyncio.Event()
        self.stats = {"claims": 0, "claims_failed": 0, "taken_over": 0, "releases": 0,
                      "saves": 0, "saves_failed": 0, "retries": 0}
        # proposals: an unknown outcome is proposed again, never taken as applied (as the
        # placer does); those of one loop tick go out as one Raft entry (a burst of CONNECTs
        # costs one commit)
        self.proposer = Proposer(socket_path, self.stats)
        self.claim_latency: list[float] = []  # seconds per committed claim, last 256

    # -- the broker's calls --------------------------------------------------------------------
    def claim(self, client_id: str, clean: bool,
              done: Callable[[Claimed | str], None]) -> None:
        """Propose the claim; ``done(Claimed)`` once committed, ``done(why)`` when Raft did not
        commit it within ``cluster.append_timeout``."""
        self._spawn(self._claim(client_id, clean, done))

    def release(self, client_id: str) -> None:
        """The session ended here (clean, expired, evicted): give the client id up, if this
        router still holds it (a compare-and-set: a newer claim elsewhere is left alone)."""
        epoch = self.held.pop(client_id, None)
        if epoch is None:
            return
        self.stats["releases"] += 1
        self._spawn(self._propose(["release_session", client_id, self.me, epoch],
                                  time.monotonic() + self.timeout))

    def save(self, client_id: str, state: str, done: Callable[[str | None], None]) -> None:
        """Save a persistent session's state under this router's claim; ``done(None)`` once
        committed, ``done(why)`` when it was not (no majority, or the claim is no longer
        this router's)."""
        epoch = self.held.get(client_id)
        if epoch is None:
            done("this router does not hold the client id in the session registry")
            return
        self._spawn(self._save(client_id, epoch, state, done))

    def holds(self, client_id: str) -> bool:
        return client_id in self.held

    # -- proposals -----------------------------------------------------------------------------
    async def _claim(self, client_id: str, clean: bool,
                     done: Callable[[Claimed | str], None]) -> None:
        started = time.monotonic()
        self.claiming.setdefault(client_id, 0)
        try:
            answer = await self._propose(["claim_session", client_id, self.me, clean],
                                         started + self.timeout)
        finally:
            newer = self.claiming.pop(client_id, 0)
        if isinstance(answer, str) or not isinstance(answer[1], dict):
            self.stats["claims_failed"] += 1
            done(answer if isinstance(answer, str) else f"metadata answered {answer[1]!r}")
            return
        rec = answer[1]
        epoch = int(rec["epoch"])
        if newer > epoch:  # another router claimed it after this claim committed
            self.stats["claims_failed"] += 1
            done(f"the client id was claimed again at another router meanwhile (session "
                 f"epoch {newer} > {epoch})")
            return
        if epoch > self.held.get(client_id, 0):
            self.held[client_id] = epoch
        self.stats["claims"] += 1
        self.claim_latency.append(time.monotonic() - started)
        del self.claim_latency[:-256]
        done(Claimed(epoch, rec.get("prev"), rec.get("state")))

    async def _save(self, client_id: str, epoch: int, state: str,
                    done: Callable[[str | None], None]) -> None:
        answer = await self._propose(["save_session", client_id, self.me, epoch, state],
                                     time.monotonic() + self.timeout)
        if isinstance(answer, str):
            self.stats["saves_failed"] += 1
            done(answer)
            return
        applied, rec = answer
        if not applied:
            self.stats["saves_failed"] += 1
            done(f"the session registry names another claim: {rec!r}")
            return
        self.stats["saves"] += 1
        done(None)

    def _propose(self, cmd: list, deadline: float) -> Any:
        # Neither a claim nor a save is a compare-and-set: a claim takes the next epoch each
        # time (a second one names this router as the previous holder, and the real one's
        # handover is skipped), and a save has no order against a newer save of the same
        # session (a late repeat would put the older state back). So neither is proposed
        # again while its first attempt may still commit (metaclient.Proposer.propose_until,
        # ``bounded``); only a release (a CAS on its epoch) is. review11 made both CAS with a
        # claim id and a writer sequence, which changes the Raft commands: left for a
        # version-gated change (a voter of the previous build would refuse the new forms
        # during a rolling restart, and the voters' states would differ).
        return self.proposer.propose_until(cmd, deadline, bounded=cmd[0] == "release_session")

    # -- the watch -----------------------------------------------------------------------------
    def start(self) -> None:
        self._watching = asyncio.get_running_loop().create_task(self._watch())

    def _seen(self, client_id: str, rec: Any) -> None:
        """A committed registry record (from the snapshot or a change)."""
        if not isinstance(rec, dict):
            return  # released: whoever held it knows
        router, epoch = rec.get("router"), int(rec.get("epoch", 0))
        if router == self.me:
            # restored at start (or claimed by this router before a restart of the stream)
            if epoch > self.held.get(client_id, 0):
                self.held[client_id] = epoch
            return
        if client_id in self.claiming:
            self.claiming[client_id] = max(self.claiming[client_id], epoch)
        if epoch > self.held.get(client_id, 0):
            # claimed elsewhere, later than this router's claim (or this router never
            # claimed it: a session restored from disk that moved while this node was down)
            if self.held.pop(client_id, None) is not None:
                self.stats["taken_over"] += 1
            self.on_taken(client_id, router, epoch)

    async def _watch(self) -> None:
        await follow(self.socket_path, "sessions", "session", self._seen, self.synced,
                     "session registry", log, _RECONNECT)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in [*self._tasks, *([self._watching] if self._watching else [])]:
            task.cancel()
        self.proposer.close_now()
