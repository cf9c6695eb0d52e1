"""Offset replay: a subscription that asked for an offset reads its device log from there.

The reading half of ``devicelogs.ReplayCursor`` (the seam with live delivery lives there): read
committed records from the cursor's offset, in chunks, at the pace the subscriber's window and
socket allow, and hand over to live delivery at the log end.

In a cluster the log may be another router's (``RemoteReplayCursor``): ``RemoteReplays`` asks
the owner where the subscription starts before the SUBACK (so a bad offset is refused as on one
node), then the pump reads over the mesh link a chunk at a time. The seam is the same one: the
owner routes every stored message to this router once it has the subscription's route, with
its device and offset, and the router sent that route before any of its reads (the link writes
routes before requests), so a message is either below the offset where a read ended (read) or
routed after it (live), never neither; an answer with no records means the read reached the
owner's committed end, and the cursor goes live there at once.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.auth import topic_matches
from broker.devicelogs import RemoteReplayCursor, record_message
from broker.lograte import RateLimitedLog
from broker.message import Message
from broker.protocol.reasons import SUBACK_FAILURE_V3, Reason
from broker.stats import DropReason
from commitlog.store import OffsetOutOfRangeError

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.forwarding import FetchResult
    from broker.port import RouterPort
    from broker.session import Session, Subscription

log = logging.getLogger("broker.router")

_REPLAY_CHUNK = 500  # records read per replay step
_REPLAY_STEP = 5_000  # records replayed per loop turn before yielding to other work
_RETRY_S = 1.0  # a failed read of another router's log is tried again after this


def _skip_lost(router: RouterPort, session: Session, cursor: Any, to: int) -> None:
    """Move a replay cursor over offsets a corrupt record took (the store quarantined them
    and logged them at ERROR): counted as dropped, reason ``corrupt``, never a stall."""
    if to > cursor.next:
        log.warning("replay skips offsets lost to a corrupt record in the device log",
                    extra={"client_id": session.client_id, "device": cursor.device,
                           "from": cursor.next, "to": to})
        router.stats.dropped(DropReason.CORRUPT, to - cursor.next)
    cursor.next = to


def _nothing() -> None:
    pass


class Replays:
    """Offset replay for one router: the sessions still reading history, the pump that reads
    their cursors (local logs from the store, other routers' over the mesh), and the owner
    questions a remote cursor needs before its SUBACK."""

    def __init__(self, router: RouterPort) -> None:
        self.router = router
        self.replaying: set[Session] = set()  # sessions with a cursor still reading history
        self._failed_log = RateLimitedLog(log, logging.WARNING,
                                          "reads of other routers' logs failed",
                                          burst=3, window=10.0)

    def pump(self, session: Session) -> None:
        """Advance this session's replay cursors while its window and socket have room.

        The router calls it when the window or socket frees room (a bound method it holds, no
        extra call per message); local logs are read here, another router's through ``read``."""
        router = self.router
        conn = session.conn
        logs = router.logs
        if conn is None or logs is None or conn.closing or session not in self.replaying:
            return
        store = logs.store
        budget = _REPLAY_STEP
        waiting = False  # a read of another router's log is out: its answer pumps again
        for sub in list(session.subscriptions.values()):
            cursor = sub.replay
            if cursor is None or cursor.live:
                continue
            remote = cursor.owner is not None
            while budget > 0:
                if conn.congested or len(session.queue) >= session.window:
                    return  # resumed by acks (window_freed) or the socket draining (writable)
                if remote:
                    buffer = cursor.buffer
                    if not buffer:
                        self.read(session, cursor)
                        waiting = True
                        break
                    records: deque = buffer  # consumed from the left; the rest waits for room
                else:
                    try:
                        records = store.read(cursor.device, cursor.next, _REPLAY_CHUNK)
                    except OffsetOutOfRangeError as err:
                        start = store.log_range(cursor.device)[0]
                        log.warning("replay cursor fell behind retention; skipping ahead",
                                    extra={"client_id": session.client_id,
                                           "device": cursor.device, "from": cursor.next,
                                           "to": start, "error": str(err)})
                        router.stats.dropped(DropReason.EXPIRED, max(0, start - cursor.next))
                        cursor.next = start
                        continue
                    if not records:
                        # caught up (past a quarantined gap, if any): live delivery takes over
                        _skip_lost(router, session, cursor,
                                   store.past_gap(cursor.device, cursor.next))
                        cursor.live = True
                        break
                    records = deque(records)
                ids = (sub.sub_id,) if sub.sub_id else None
                while records:
                    rec = records.popleft()
                    budget -= 1
                    if rec.offset > cursor.next:  # offsets lost to a corrupt record: skipped
                        _skip_lost(router, session, cursor, rec.offset)
                    cursor.next = rec.offset + 1
                    if not topic_matches(sub.filter, rec.topic):
                        continue
                    msg = record_message(rec, Message)
                    msg.remote = remote  # read from its owner: a copy here, never a position
                    router.deliver(session, msg, sub.qos,
                                   sub.retain_as_published and msg.retain, ids, position=True)
                    if conn.congested or len(session.queue) >= session.window:
                        break
        if budget <= 0:
            router.loop.call_soon(self.pump, session)
        elif not waiting:
            # every cursor ran out of history without returning early: all are live now
            self.replaying.discard(session)

    def resolve(self, conn: Connection, session: Session,
                resolving: list[tuple[int, str, Subscription, Subscription | None]],
                codes: list[int], reasons: list[str], replays: list[Subscription],
                finish: Any) -> None:
        """Ask each owner where its subscription starts; ``finish()`` (the SUBACK) once every
        one answered. A refused one is undone and its code becomes a failure with the owner's
        reason, as a local ``open_cursor`` refusal would be.

        The client's later packets are not held meanwhile (unlike behind a publish waiting for
        the disk, ``conn.unsettled``): holding them means not reading its socket, for up to
        the RESOLVE timeout, and a client whose PINGREQ gets no PINGRESP within its keepalive
        closes the connection (paho does). A later SUBSCRIBE or UNSUBSCRIBE may then be
        answered first; the state still follows the packets' order, since an answer only
        touches a subscription that is still the one it resolves."""
        router = self.router
        left = [len(resolving)]
        failure = Reason.IMPLEMENTATION_SPECIFIC_ERROR if conn.level == 5 else SUBACK_FAILURE_V3

        def answered(item: tuple[int, str, Subscription, Subscription | None],
                     offset: int | None, why: str) -> None:
            index, key_flt, sub, old = item
            cursor = sub.replay
            assert isinstance(cursor, RemoteReplayCursor)
            if offset is None:
                cid = session.client_id
                if session.subscriptions.get(key_flt) is sub:
                    if old is not None:
                        session.subscriptions[key_flt] = old
                        router.trie.add(old.filter, cid, old, old.group)
                    else:
                        del session.subscriptions[key_flt]
                        router.trie.remove(sub.filter, cid, sub.group)
                if sub in replays:
                    replays.remove(sub)
                codes[index] = failure
                reasons.append(why)
            else:
                cursor.next = offset
                cursor.pending_spec = None
            left[0] -= 1
            if left[0]:
                return
            if router.sessions.get(session.client_id) is not session:
                return  # ended meanwhile (clean, expired, or moved to another router)
            if any(s.replay is not None and not s.replay.live
                   for s in session.subscriptions.values()):
                # (also when the SUBACK is not sent: a persistent session's cursors read once
                # its client is back, finish_connect pumps them)
                self.replaying.add(session)
            if conn.closing or conn.session is not session:
                # no SUBACK to send; what resolved (or was undone) is stored all the same, and
                # a client already back on a new connection starts reading now
                router.persist.stored(session, _nothing)
                if session.conn is not None and session in self.replaying:
                    self.pump(session)
                    router.flush_writes()
                return
            finish()
            if session in self.replaying:  # e.g. an old replaying subscription put back
                self.pump(session)
            router.flush_writes()

        for item in resolving:
            cursor = item[2].replay
            spec, reset = cursor.pending_spec
            router.forwarder.resolve(cursor.owner, cursor.device, spec, reset,
                                     lambda offset, why, item=item: answered(item, offset, why))

    def read(self, session: Session, cursor: RemoteReplayCursor) -> None:
        """Fetch the cursor's next chunk from its owner, unless a read is out or waiting to
        be tried again; the answer fills ``cursor.buffer`` and pumps the session again."""
        if cursor.reading or cursor.retrying or cursor.pending_spec is not None:
            return  # an answer, or the failed read's retry, pumps again
        cursor.reading = True
        owner = cursor.owner
        self.router.forwarder.fetch(owner, cursor.device, cursor.next, _REPLAY_CHUNK,
                                    lambda result: self._fetched(session, cursor, result, owner))

    def _retry(self, session: Session, cursor: RemoteReplayCursor) -> None:
        cursor.retrying = False
        self.pump(session)
        self.router.flush_writes()

    def _fetched(self, session: Session, cursor: RemoteReplayCursor,
                 result: FetchResult, owner: str | None) -> None:
        router = self.router
        cursor.reading = False
        if cursor.owner != owner:
            # the log's leader moved while this read was out: what the former one answered
            # (its end, its records) is not the log's now; read again, from the new leader
            self.pump(session)
            router.flush_writes()
            return
        if result.status == "ok":
            if result.records:
                cursor.buffer = deque(r for r in result.records if r.offset >= cursor.next)
            else:
                # the owner's committed end: the messages it stores from here are routed
                # here live (after this answer, on the same link), so live delivery takes over
                # now, not when the window next has room (past offsets the owner lost to a
                # corrupt record at its end, if any: counted as dropped)
                if result.next_offset > cursor.next:
                    _skip_lost(router, session, cursor, result.next_offset)
                cursor.live = True
        elif result.status == "out_of_range":
            start, hw = result.start, result.high_watermark
            to = start if cursor.next < start else hw
            log.warning("replay cursor outside the owner's log; skipping ahead",
                        extra={"client_id": session.client_id, "device": cursor.device,
                               "from": cursor.next, "to": to, "owner": cursor.owner})
            router.stats.dropped(DropReason.EXPIRED, max(0, to - cursor.next))
            cursor.next = to
        else:
            self._failed_log("reading %r from its owner router %s failed (retried in %.0f s): "
                             "%s", cursor.device, cursor.owner, _RETRY_S, result.why,
                             extra={"client_id": session.client_id})
            cursor.retrying = True
            router.loop.call_later(_RETRY_S, self._retry, session, cursor)
            return
        self.pump(session)
        router.flush_writes()
