"""Session end: a connection closed (will now or delayed, session kept or ended), session
expiry and delayed wills on timers, and the sweep (keepalive, connect timeout, stuck partial
packets) twice a second. A room of the router.

Why this cut: Mosquitto keeps the same work in ``loop.c``'s periodic checks and
``session_expiry.c`` / ``will_delay.c``; EMQX in its session and keepalive timers. Everything
here runs on a connection's end or on the clock, never per message. ``SessionEndRoom`` is a mixin
of ``Router`` (its methods run with the router as ``self``); it calls down into the ingest room
(``publish_will``) and the engines.
"""

from __future__ import annotations

import heapq
import logging
import time

from broker.connection import Connection
from broker.protocol.reasons import Reason
from broker.session import NEVER, Session

log = logging.getLogger("broker.router")  # the router's log lines keep the router's name

SWEEP_INTERVAL = 0.5  # seconds between keepalive / expiry sweeps


class SessionEndRoom:
    """Connection closed, session ended, timers, sweep (a mixin of ``Router``; see the module
    docstring)."""

    def _connection_closed(self, session: Session, conn: Connection, abnormal: bool) -> None:
        now = time.monotonic()
        if conn.will is not None and abnormal:
            delay = conn.will_delay
            if delay <= 0 or session.expiry_interval == 0:
                self.publish_will(conn.will)
            else:
                session.will = conn.will
                due = now + min(delay, session.expiry_interval)
                session.will_due = due
                self.schedule(due, "will", session)
            conn.will = None
        if session.expiry_interval == 0:
            self.end_session(session)
            return
        for old in self.limits.went_offline(session):
            self.end_session(old)
        if session.conn is not None or self.sessions.get(session.client_id) is not session:
            return  # ended just now (max_offline_sessions = 0)
        self.persist.went_offline(session)  # (written with this tick's batch)
        if self.registry is not None:
            self.registry.went_offline(session)  # saved in the cluster's session registry
        # a shared subscriber going offline: its unacked shares go to members still online
        self.shared.redispatch(session)
        if session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
            self.schedule(session.expires_at, "expiry", session)

    def schedule(self, due: float, kind: str, session: Session) -> None:
        """The sweep runs ``kind`` ("will": a delayed will; "expiry": the session's end) for
        ``session`` at ``due`` (time.monotonic()); a timer whose reason went away meanwhile
        (client back, will cancelled) is checked and skipped then, not removed now."""
        heapq.heappush(self._timers, (due, next(self._seq), kind, session))

    def end_session(self, session: Session) -> None:
        self._replaying.discard(session)
        self.retained_pacer.forget(session)
        self.persist.ended(session)
        if self.registry is not None:
            self.registry.ended(session)  # the claim in the session registry is given up
        if self.catchup is not None:
            self.catchup.forget(session)
        self.limits.offline.back(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        for sub in session.subscriptions.values():
            self.trie.remove(sub.filter, session.client_id, sub.group)
        self.shared.redispatch(session)
        if session.will is not None:  # the session ends before the will delay ran out
            self.publish_will(session.will)
            session.will = None
        session.subscriptions.clear()
        session.inflight.clear()
        session.queue.clear()

    def _sweep(self) -> None:
        """Keepalive, connect timeout, delayed wills and session expiry, twice a second."""
        now = time.monotonic()
        connect_timeout = self.mqtt.connect_timeout
        for conn in list(self.connections):
            if conn.closing:
                continue
            if conn.session is None:
                if conn.pending is None and now - conn.accepted_at > connect_timeout:
                    self._log_no_connect("closing connection: no CONNECT within %.0f s",
                                         connect_timeout, extra={"peer": conn.peer})
                    conn.listener.rejected += 1
                    conn.abort()
            elif conn.keepalive and now - conn.last_rx > conn.keepalive * 1.5 \
                    and conn.pending is None and conn not in self._paused_publishers:
                # (not while we hold its packets and do not read: its PINGREQs wait unread)
                # [MQTT-3.1.2-24]: 1.5 × keepalive without a packet → disconnect (will is sent)
                conn.close_reason = f"keepalive timeout (nothing for 1.5 x {conn.keepalive} s)"
                conn.close(Reason.KEEP_ALIVE_TIMEOUT)
            elif conn not in self._paused_publishers and self.limits.packet_overdue(conn, now):
                conn.abort()  # mid-packet: nothing we write could be read as a packet anyway
        self._log_no_connect.tick()
        self._log_not_stored.tick()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, session = heapq.heappop(timers)
            if kind == "will":
                due = session.will_due
                if session.will is not None and due is not None and due <= now:
                    will, session.will, session.will_due = session.will, None, None
                    self.publish_will(will)
            elif session.conn is None and session.expires_at is not None \
                    and session.expires_at <= now:
                log.debug("session expired", extra={"client_id": session.client_id})
                self.end_session(session)
        self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL, self._sweep)
