"""Offset replay: a subscription that asked for an offset reads its device log from there.

The reading half of ``devicelogs.ReplayCursor`` (the seam with live delivery lives there): read
committed records from the cursor's offset, in chunks, at the pace the subscriber's window and
socket allow, and hand over to live delivery at the log end.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.auth import topic_matches
from broker.devicelogs import record_message
from broker.message import Message
from broker.stats import DropReason
from commitlog.store import OffsetOutOfRangeError

if TYPE_CHECKING:
    from broker.router import Router
    from broker.session import Session

log = logging.getLogger("broker.router")

_REPLAY_CHUNK = 500  # records read per replay step
_REPLAY_STEP = 5_000  # records replayed per loop turn before yielding to other work


def pump_replays(self: Router, session: Session) -> None:
    """Advance this session's replay cursors while its window and socket have room.

    A method of ``Router`` (``Router._pump_replays``) kept in its own module so the router
    stays the owner of state, not of every way of reading the log."""
    conn = session.conn
    logs = self.logs
    if conn is None or logs is None or conn.closing or session not in self._replaying:
        return
    store = logs.store
    budget = _REPLAY_STEP
    for sub in list(session.subscriptions.values()):
        cursor = sub.replay
        if cursor is None or cursor.live:
            continue
        while budget > 0:
            if conn.congested or len(session.queue) >= session.window:
                return  # resumed by acks (_window_freed) or the socket draining (writable)
            try:
                records = store.read(cursor.device, cursor.next, _REPLAY_CHUNK)
            except OffsetOutOfRangeError as err:
                start = store.log_range(cursor.device)[0]
                log.warning("replay cursor fell behind retention; skipping ahead",
                            extra={"client_id": session.client_id, "device": cursor.device,
                                   "from": cursor.next, "to": start, "error": str(err)})
                self.stats.dropped(DropReason.EXPIRED, max(0, start - cursor.next))
                cursor.next = start
                continue
            if not records:
                # caught up (past a quarantined gap, if any): live delivery takes over
                cursor.next = store.past_gap(cursor.device, cursor.next)
                cursor.live = True
                break
            ids = (sub.sub_id,) if sub.sub_id else None
            for rec in records:
                budget -= 1
                cursor.next = rec.offset + 1
                if not topic_matches(sub.filter, rec.topic):
                    continue
                msg = record_message(rec, Message)
                self._deliver(session, msg, sub.qos,
                              sub.retain_as_published and msg.retain, ids, position=True)
                if conn.congested or len(session.queue) >= session.window:
                    break
    if budget <= 0:
        self.loop.call_soon(self._pump_replays, session)
    else:
        # every cursor ran out of history without returning early: all are live now
        self._replaying.discard(session)
