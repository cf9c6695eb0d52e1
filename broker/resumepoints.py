"""Where a resumed session starts in a device log it holds no position in, when that log's
leader is another router: the offset of its resume time, asked of the leader.

A persistent session resumed at another router (from the Raft session registry after its router
died, ``broker/registry.py``, or restored from this router's disk) reads every device log its
subscriptions can read: from the exact position its record names (``Session.positions``,
``broker/positions.py``), else from the record's resume time (``resume_us``: older than anything
that was not yet delivered when the record was written, ``broker/sessionstore.py``). A log with
no position is one the session got its first message from after that record was written (a new
device, or the first one after a checkpoint interval of quiet). The resume time used to be looked
up in this router's own store only, so a log this router holds no copy of (replication factor
below the node count, or no replication) was never read: its messages stored while the session
moved, and the ones its dead router had not sent on yet, were lost. The bridge's
``$bridge/<name>`` session (``meshmq/bridge.py``), resumed at another node after a kill -9 of its
own, lost its backlog on such logs (tests/cluster/test_bridge_moves.py).

So for each such log the session gets a catch-up cursor whose start is *pending*
(``LogCursor.pending_spec``, "@<unix ms>"): it reads nothing and live deliveries of that log
are left to it (``LogCatchUp.divert``), until the log's leader answers where the resume time
falls (the RESOLVE an offset subscription sends, ``broker/replay.py``; answered after this
router's routes, so what the leader stores after its answer is routed here: the catch-up seam
holds). A failed answer (leader dead, a failover under way: no leader) is asked again after
``RETRY_S``, of whoever leads then; a log this router leads meanwhile is looked up here. Kafka's
consumers do the same for a partition with no committed offset when ``auto.offset.reset`` asks
for a time (``offsetsForTimes``).

Asks out at once are bounded per leader (``RESOLVES_PER_OWNER``, as ``broker/cursors.py`` bounds
reads): a wildcard session resumed in a cluster of many logs asks in rounds, not all at once
(a leader refuses past 64 requests waiting on a link).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.cursors import RETRY_S, LogCursor
from broker.devicelogs import resolve_offset
from broker.lograte import RateLimitedLog

if TYPE_CHECKING:
    from broker.port import RouterPort
    from broker.session import Session

log = logging.getLogger("broker.resumepoints")

RESOLVES_PER_OWNER = 32


def time_spec(resume_us: int) -> str:
    """The offset spec of a resume time (``resolve_offset``'s "@<unix ms>"), rounded down."""
    return f"@{max(0, resume_us) // 1000}"


def spec_us(spec: str) -> int:
    """The resume time (µs) a pending cursor's spec names."""
    return int(spec[1:]) * 1000


class ResumePoints:
    """Pending catch-up cursors of resumed sessions, and the asks that resolve them."""

    def __init__(self, router: RouterPort) -> None:
        self.router = router
        self._out: dict[str, int] = {}  # leader -> asks out
        self._waiting: dict[str, deque[tuple[Session, LogCursor]]] = {}
        self._failed_log = RateLimitedLog(log, logging.WARNING,
                                          "resume points not resolved at their leaders",
                                          burst=3, window=10.0)

    def start(self, session: Session, device: str, resume_us: int) -> None:
        """``session`` (just resumed, no cursor on ``device``) reads ``device``'s log from
        ``resume_us``, once its leader said which offset that is."""
        catchup = self.router.catchup
        if catchup is None or device in session.lag:
            return
        catchup.restore(session, device, -1)
        c = session.lag[device]
        c.pending_spec = (time_spec(resume_us), "earliest")
        self._ask(session, c)

    # -- internals ----------------------------------------------------------------------
    def _wanted(self, session: Session, c: LogCursor) -> bool:
        return (self.router.sessions.get(session.client_id) is session
                and session.lag.get(c.device) is c and c.pending_spec is not None)

    def _ask(self, session: Session, c: LogCursor) -> None:
        if not self._wanted(session, c):
            return
        owner = c.owner
        logs = self.router.logs
        if owner is None and logs is not None:  # led here (now): no ask
            offset, why = resolve_offset(logs.store, c.device, c.pending_spec[0], "earliest")
            self._resolved(session, c, None, offset, why)
            return
        forwarder = self.router.forwarder
        if forwarder is None or owner is None:
            self._resolved(session, c, None, None, "no cluster to ask")
            return
        if self._out.get(owner, 0) >= RESOLVES_PER_OWNER:
            self._waiting.setdefault(owner, deque()).append((session, c))
            return
        self._out[owner] = self._out.get(owner, 0) + 1
        forwarder.resolve(owner, c.device, c.pending_spec[0], "earliest",
                          lambda offset, why: self._resolved(session, c, owner, offset, why))

    def _resolved(self, session: Session, c: LogCursor, owner: str | None,
                  offset: int | None, why: str) -> None:
        if owner is not None:
            self._slot_freed(owner)
        if not self._wanted(session, c):
            return
        if offset is None or (owner is not None and c.owner != owner):
            # no answer (leader gone, no leader yet), or the leader moved while asked: ask
            # whoever leads then, a moment later
            self._failed_log("a resumed session's start in %r was not resolved at its leader "
                             "%s (asked again in %.0f s): %s", c.device, owner, RETRY_S, why,
                             extra={"client_id": session.client_id, "device": c.device})
            self.router.loop.call_later(RETRY_S, self._ask, session, c)
            return
        c.next = offset
        c.pending_spec = None
        catchup = self.router.catchup
        if catchup is not None:
            catchup.resume(session)  # reads once its client is connected
            self.router.flush_writes()

    def _slot_freed(self, owner: str) -> None:
        out = self._out.get(owner, 1) - 1
        if out > 0:
            self._out[owner] = out
        else:
            self._out.pop(owner, None)
        waiting = self._waiting.get(owner)
        while waiting and self._out.get(owner, 0) < RESOLVES_PER_OWNER:
            session, c = waiting.popleft()
            self._ask(session, c)
        if not waiting:
            self._waiting.pop(owner, None)


def pending_since(session: Any) -> int | None:
    """The oldest resume time among ``session``'s cursors still waiting for their leader's
    answer (None: none): a checkpoint written meanwhile must not resume later than that."""
    oldest = None
    for c in session.lag.values():
        spec = c.pending_spec
        if spec is not None and spec[0].startswith("@"):
            us = spec_us(spec[0])
            oldest = us if oldest is None else min(oldest, us)
    return oldest
