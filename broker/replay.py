"""Offset replay: a subscription that asked for an offset reads its device log from there.

The subscription holds a ``LogCursor`` (``broker/cursors.py``, the seam with live delivery in
``LogCursor.accept_live``); ``Replays`` delivers what the router's ``LogSource`` reads from
the cursor's offset, in chunks, at the pace the subscriber's window and socket allow, and the
cursor hands over to live delivery at the log end. In a cluster the log may be another
router's: ``Replays.resolve`` asks the owner where the subscription starts before the SUBACK
(so a bad offset is refused as on one node), then the source reads it over the mesh a chunk at
a time, with the one retry policy and the same seam (see ``broker/cursors.py``).

A live replay cursor on another router's log is read back from where it is when the link to
that router comes up again (``owner_back``, called with the sessions' positions by
``broker/positions.py``): what the owner stored and routed while the link was down, or just
before it was killed, never reached this router, and a replay delivery is not a session
position (``broker/delivery.py`` records those only for the session's own subscriptions).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from broker.auth import topic_matches
from broker.devicelogs import record_message
from broker.message import Message
from broker.protocol.reasons import SUBACK_FAILURE_V3, Reason

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.cursors import LogCursor, LogSource
    from broker.port import RouterPort
    from broker.session import Session, Subscription

log = logging.getLogger("broker.router")

_REPLAY_STEP = 5_000  # records replayed per loop turn before yielding to other work


def _nothing() -> None:
    pass


class Replays:
    """Offset replay for one router: the sessions still reading history, the pump that delivers
    their cursors' records, and the owner questions a remote cursor needs before its SUBACK."""

    kind = "replay"
    chunk = 500  # records read per replay step

    def __init__(self, router: RouterPort) -> None:
        self.router = router
        self.replaying: set[Session] = set()  # sessions with a cursor still reading history
        self.source: LogSource | None = None  # set with the commit log (Router.__init__)

    # -- what broker/cursors.py's LogSource asks (its Reader) -----------------------------------
    def wants(self, session: Session, cursor: LogCursor) -> bool:
        return not cursor.live

    def went_live(self, session: Session, cursor: LogCursor) -> None:
        pass  # the pump sees it live, and drops the session once every cursor is

    def resume(self, session: Session) -> None:
        self.pump(session)
        self.router.flush_writes()

    def pump(self, session: Session) -> None:
        """Advance this session's replay cursors while its window and socket have room.

        The router calls it when the window or socket frees room (a bound method it holds, no
        extra call per message); an answer from another router's log calls it again."""
        router = self.router
        conn = session.conn
        source = self.source
        if conn is None or source is None or conn.closing or session not in self.replaying:
            return
        budget = _REPLAY_STEP
        for sub in list(session.subscriptions.values()):
            cursor = sub.replay
            if cursor is None or cursor.live:
                continue
            while budget > 0:
                if conn.congested or len(session.queue) >= session.window:
                    return  # resumed by acks (window_freed) or the socket draining (writable)
                records = source.take(session, cursor, self.chunk, self)
                if records is None:
                    break  # live now, or a read of the owner is out (its answer pumps again)
                remote = cursor.owner is not None
                ids = (sub.sub_id,) if sub.sub_id else None
                while records:
                    rec = records.popleft()
                    budget -= 1
                    if rec.offset > cursor.next:  # offsets lost to a corrupt record: skipped
                        source.skip_lost(session, cursor, rec.offset)
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
        elif all(s.replay is None or s.replay.live for s in session.subscriptions.values()):
            self.replaying.discard(session)  # every cursor ran out of history: all live now

    def devices_moved(self, devices: set[str] | frozenset[str]) -> int:
        """Those logs' leader epochs rose (broker/positions.py ``logs_moved``): every live replay
        cursor on one reads back from where it is, at the new leader (a deposed leader's
        DELIVERs are dropped from now on, cluster/deliverfence.py). Returns how many
        sessions read back."""
        started = 0
        for session in list(self.router.sessions.values()):
            back = False
            for sub in session.subscriptions.values():
                cursor = sub.replay
                if cursor is not None and cursor.live and cursor.device in devices:
                    cursor.live = False
                    back = True
            if back:
                started += 1
                self.replaying.add(session)
                if session.conn is not None:
                    self.pump(session)
        return started

    def owner_back(self, owner: str) -> int:
        """The link to router ``owner`` came up (again): every live replay cursor on a log it
        leads reads back from where it is (nothing new: it goes live again at once). Returns
        how many cursors read back."""
        started = 0
        for session in list(self.router.sessions.values()):
            back = False
            for sub in session.subscriptions.values():
                cursor = sub.replay
                if cursor is not None and cursor.live and cursor.owner == owner:
                    cursor.live = False
                    back = True
            if back:
                started += 1
                self.replaying.add(session)
                if session.conn is not None:
                    self.pump(session)
        return started

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
            if offset is None:
                cid = session.client_id
                if session.subscriptions.get(key_flt) is sub:
                    if old is not None:
                        session.own_subscriptions()[key_flt] = old
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
