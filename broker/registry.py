"""The router's side of a cluster-wide session registry (``cluster.placement = "raft"``).

With a registry (``RouterPort.registry``, set by the node wiring; None on a single node and
under static placement) a client id is held by whichever router last *claimed* it in the
registry, and the claim decides, not a conversation with the other routers:

- **CONNECT** (``claim``): the client's packets wait while the claim is proposed; the CONNACK
  is sent only once it committed (with the session's saved state when this router did not
  hold it: ``SessionHooks.resume``). No commit within ``cluster.append_timeout`` (no Raft
  majority): v5 CONNACK 0x88 Server unavailable with a reason string, 3.x 0x03, and a log
  line; never a CONNACK for a claim that did not commit. No peer is asked, so no frozen peer
  can delay it.
- **Taken over** (``taken``): the registry says another router claimed the client id later:
  this router's connection is closed with v5 DISCONNECT 0x8E and its copy of the session ends
  (the new holder resumed it from the registry's saved state). After a partition heals, the
  router on the losing side learns it from its watch: one connection per client id survives.
- **Ended** (``ended``): a session that ends here (clean start, expiry 0 disconnect, expiry,
  eviction) gives its claim up.
- **Saved** (``stored``, ``went_offline``, the checkpoint timer): a persistent session's state
  (``SessionHooks.portable``) is saved in the registry: before the SUBACK/UNSUBACK of a
  (un)subscription, when its client goes offline, and every
  ``cluster.session_checkpoint_interval`` while its delivery progress moves (Kafka's consumer
  offset auto-commit: after a failover the session reads its logs again from the last save,
  at least once, never a gap).

The hook the wiring fills (``SessionRegistryHook``) is plain data in and out: this module
never imports ``cluster/``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.connection import fail_client
from broker.protocol.packets import Connack
from broker.protocol.properties import Prop
from broker.protocol.reasons import Reason, v3_connack_code

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.port import RouterPort
    from broker.session import Session

log = logging.getLogger("broker.registry")

# Seconds a CONNECT whose session another router held waits for that router to hand it over
# over the mesh (its queued and in-flight messages, its exact positions: the move as it was
# before the registry) before it resumes from the registry's saved state instead. Only such a
# CONNECT waits, and only on its previous router: a frozen one costs it this, nobody else
# anything. A live router answers in milliseconds.
HANDOVER_WAIT = 0.5
# Seconds a router keeps a persistent session taken over elsewhere (its connection closed at
# once) so that the new holder's hand-over request, which may arrive after the registry's
# change, still finds it to export; then it ends here.
HANDOVER_GRACE = 3.0


class SessionRegistryHook(Protocol):
    """What the cluster wiring gives the router (``cluster/sessionreg.py`` implements it)."""

    on_taken: Callable[[str, str, int], None]
    me: str  # this router's id, as the registry names holders

    def claim(self, client_id: str, clean: bool, done: Callable[[Any], None]) -> None:
        """``done`` gets an object with ``epoch``, ``prev`` and ``state`` once the claim
        committed, or a str saying why it did not."""

    def release(self, client_id: str) -> None:
        """The session ended here: give the client id up (if still held here)."""

    def save(self, client_id: str, state: str, done: Callable[[str | None], None]) -> None:
        """Save the session's state under this router's claim; ``done(None)`` once
        committed, ``done(why)`` when not."""

    def holds(self, client_id: str) -> bool:
        """This router holds the client id (its claim is the newest it has seen)."""


def _progress(s: Session) -> tuple:
    """Changes when a checkpoint would save something new (cheap, every tick, every session):
    a send allocates a packet id, an ack shrinks the window, a subscription comes or goes."""
    return (s.conn is None, s.next_pid, len(s.inflight), len(s.queue), len(s.lag),
            len(s.positions), len(s.subscriptions), len(s.incoming_qos2), s.expiry_interval)


class RegisteredSessions:
    """The router's registry glue (see the module docstring)."""

    def __init__(self, router: RouterPort, hook: SessionRegistryHook, interval: float) -> None:
        self.router = router
        self.hook = hook
        self.interval = interval
        hook.on_taken = self.taken
        # client id -> the session object its claim belongs to (None while its CONNECT is
        # finishing): a session ended here releases the claim only if it is that session
        self.claimed: dict[str, Session | None] = {}
        self.saved: dict[str, tuple] = {}  # client id -> _progress at its last save
        self.stats = {"refused": 0, "resumed": 0, "handed_over": 0, "taken_over": 0,
                      "saves_failed": 0}
        self._timer: Any = None

    def start(self) -> None:
        self._timer = self.router.loop.call_later(self.interval, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # -- CONNECT -------------------------------------------------------------------------------
    def claim(self, conn: Connection, pkt: Any, rest: list) -> bool:
        """Start the claim (True: the CONNECT continues in ``_claimed``), or False when there
        is nothing to claim (no client id yet: the one assigned here is unique)."""
        if not pkt.client_id or getattr(conn, "claimed", False):
            return False
        conn.claimed = True
        conn.pending = list(rest)
        conn.transport.pause_reading()
        cid = pkt.client_id
        if not pkt.clean_start and cid in self.router.sessions and self.hook.holds(cid):
            # A reconnect to the router that holds the claim, its session here: the newest
            # claim this router has heard of is its own, so no new one is needed (and a
            # reconnect during a Raft election or on a minority side still resumes its
            # session, as on one node). A newer claim elsewhere that this router has not
            # heard of yet closes it with 0x8E when the watch delivers it.
            self._claimed(conn, pkt, None)
            return True
        self.hook.claim(cid, bool(pkt.clean_start),
                        lambda answer: self._claimed(conn, pkt, answer))
        return True

    def _claimed(self, conn: Connection, pkt: Any, answer: Any) -> None:
        """``answer``: the committed claim, why it did not commit (a str), or None for a
        reconnect to the router already holding the claim (no new claim)."""
        router = self.router
        cid = pkt.client_id
        if isinstance(answer, str):
            self._refuse(conn, pkt, answer)
            return
        if answer is not None and answer.prev not in (None, self.hook.me) \
                and router.forwarder is not None:
            # the previous holder, if alive, hands the session over as before the registry
            # (cluster/mesh.py CLAIM, to it alone, HANDOVER_WAIT at most)
            router.forwarder.claim(cid, bool(pkt.clean_start),
                                   lambda state: self._handed(conn, pkt, answer, state),
                                   to=answer.prev, timeout=HANDOVER_WAIT)
            return
        self._handed(conn, pkt, answer, None)

    def _handed(self, conn: Connection, pkt: Any, answer: Any, state: bytes | None) -> None:
        """The claim committed (``answer``; None: already held here) and the previous holder
        handed the session over (``state``) or did not (gone, frozen, no session)."""
        router = self.router
        cid = pkt.client_id
        if not pkt.clean_start and answer is not None and answer.prev not in (None, self.hook.me) \
                and (state is not None or answer.state):
            self._drop_stale(cid)
        if not pkt.clean_start and cid not in router.sessions:
            try:
                if state is not None:
                    router.persist.adopt(cid, state)  # installed even if the client left
                    self.stats["handed_over"] += 1
                elif answer is not None and answer.state \
                        and router.persist.resume(cid, answer.state.encode()):
                    self.stats["resumed"] += 1
                    log.info("session resumed from the session registry (its last router "
                             "%s did not hand it over: gone, or not answering)", answer.prev,
                             extra={"client_id": cid, "session_epoch": answer.epoch})
            except Exception:  # noqa: BLE001 - a bad record costs that session only
                log.exception("session state handed over or saved unreadable: a new session "
                              "starts", extra={"client_id": cid})
        if conn.closing:
            if cid not in router.sessions:
                self.hook.release(cid)  # claimed for a client that left: nothing holds it
            return
        self.claimed[cid] = None
        pending, conn.pending = conn.pending or [], None
        conn.transport.resume_reading()
        try:
            router.finish_connect(conn, pkt, 0)
            if conn.session is not None:
                self.claimed[cid] = conn.session
            if pending and conn.session is not None and not conn.closing:
                router.handle_packets(conn, pending)
        except Exception as err:  # noqa: BLE001 - this client only
            fail_client(router.stats, conn, err)
        router.flush_writes()

    def _drop_stale(self, cid: str) -> None:
        """The claim names another router as the session's holder before it, and that
        router handed the session over or saved it: an offline copy here is older than
        either (restored from this router's disk at its restart, taken over elsewhere since,
        or kept HANDOVER_GRACE after a takeover), so it goes. Resumed instead, it discarded
        the exact state handed over, and read its logs again from positions as old as this
        router's last checkpoint before it went down (a rolling restart's bridge moving back
        to its restarted node re-sent everything bridged meanwhile), and knew no position in
        logs new to the session since (tests/cluster/test_bridge_moves.py)."""
        router = self.router
        stale = router.sessions.get(cid)
        if stale is None or stale.conn is not None:
            return
        self.claimed[cid] = None  # its end must not give up the claim just committed
        self.saved.pop(cid, None)
        log.info("an older copy of the session here is dropped: the router that held it "
                 "since hands it over or saved it", extra={"client_id": cid})
        router.end_session(stale)

    def _refuse(self, conn: Connection, pkt: Any, why: str) -> None:
        self.stats["refused"] += 1
        text = f"the session registry did not commit this client id's claim: {why}"
        log.warning("connection refused: %s; the client retries (check `meshmq cluster "
                    "status`: metadata, Raft majority)", text,
                    extra={"client_id": pkt.client_id, "peer": conn.peer,
                           "reason_code": Reason.SERVER_UNAVAILABLE})
        if conn.closing:
            return
        conn.pending = None
        # on the minority side of a partition (the node's leader lease ran out: the router's
        # write gate says so, and where the majority is) a v5 client is sent there: 0x9C Use
        # another server with a Server Reference, as a refused publish is (cluster/lease.py)
        gate = getattr(self.router, "write_gate", None)
        refusal = gate() if gate is not None else None
        if pkt.protocol_level == 5 and refusal is not None and refusal[1]:
            conn.send(Connack(reason_code=Reason.USE_ANOTHER_SERVER,
                              properties={Prop.REASON_STRING: f"{text}; {refusal[0]}"[:500],
                                          Prop.SERVER_REFERENCE: refusal[1]}))
        elif pkt.protocol_level == 5:
            conn.send(Connack(reason_code=Reason.SERVER_UNAVAILABLE,
                              properties={Prop.REASON_STRING: text[:500]}))
        else:
            conn.send(Connack(reason_code=v3_connack_code(Reason.SERVER_UNAVAILABLE)))
        conn.close()
        self.router.flush_writes()

    # -- the registry's news -------------------------------------------------------------------
    def taken(self, client_id: str, holder: str, epoch: int) -> None:
        """``holder`` claimed ``client_id`` at a newer epoch: our connection and our copy of
        the session go (the holder resumed it from the registry)."""
        router = self.router
        session = router.sessions.get(client_id)
        if session is None:
            return
        self.claimed.pop(client_id, None)
        self.saved.pop(client_id, None)
        self.stats["taken_over"] += 1
        old = session.conn
        if old is not None:
            session.conn = None
            old.close_reason = (f"session taken over at router {holder} (session epoch "
                                f"{epoch} in the registry)")
            # a persistent session lives on at the holder: its will waits there as it would
            # here (will delay); one that ends with its connection publishes its will now
            if old.will is not None and (old.will_delay == 0 or session.expiry_interval == 0):
                router.publish_will(old.will)
            old.will = None
            old.close(Reason.SESSION_TAKEN_OVER)
        log.info("session taken over at router %s (session epoch %d): its connection here "
                 "closed (0x8E)", holder, epoch, extra={"client_id": client_id})
        router.flush_writes()
        if session.expiry_interval:
            # kept a moment for the new holder's hand-over request (HANDOVER_GRACE)
            router.loop.call_later(HANDOVER_GRACE, self._drop, client_id, session)
        else:
            router.end_session(session)

    def _drop(self, client_id: str, session: Session) -> None:
        """A session taken over elsewhere and not handed over meanwhile ends here."""
        router = self.router
        if router.sessions.get(client_id) is session and session.conn is None \
                and not self.hook.holds(client_id):
            router.end_session(session)

    def ended(self, session: Session) -> None:
        cid = session.client_id
        if self.claimed.get(cid, session) is not session:
            return  # an older session object of a client id claimed again meanwhile
        self.claimed.pop(cid, None)
        self.saved.pop(cid, None)
        self.hook.release(cid)

    # -- saving --------------------------------------------------------------------------------
    def stored(self, session: Session, then: Callable[..., object], *args: Any) -> None:
        """``then(*args)`` (a SUBACK or UNSUBACK) once the session's change is durable here
        and, for a persistent session, committed in the registry."""
        if not session.expiry_interval:
            self.router.persist.stored(session, then, *args)
            return
        self.router.persist.stored(session, self._save_then, session, then, args)

    def _save_then(self, session: Session, then: Callable[..., object], args: tuple) -> None:
        conn = session.conn

        def saved(why: str | None) -> None:
            if conn is not None and conn.closing:
                return
            if why is None:
                then(*args)
                self.router.flush_writes()
                return
            # never acknowledge what another router could not resume: the client
            # subscribes again after reconnecting
            self.stats["saves_failed"] += 1
            log.error("subscription not acknowledged: the session registry did not save it "
                      "(%s); closing the client", why, extra={"client_id": session.client_id})
            if conn is not None:
                conn.close_reason = f"session state not saved in the registry: {why}"
                conn.close(Reason.UNSPECIFIED_ERROR)
                self.router.flush_writes()
        if not self._save(session, saved):
            then(*args)

    def went_offline(self, session: Session) -> None:
        """Its client left: saved now (the offsets it got to, when it went offline)."""
        if session.expiry_interval:
            self._save(session, self._logged(session.client_id))

    def _save(self, session: Session, done: Callable[[str | None], None]) -> bool:
        cid = session.client_id
        if not self.hook.holds(cid):
            return False
        state = self.router.persist.portable(session)
        if state is None:
            return False  # persistence off: nothing to resume anywhere
        self.saved[cid] = _progress(session)
        self.hook.save(cid, state.decode(), done)
        return True

    def _logged(self, cid: str) -> Callable[[str | None], None]:
        def done(why: str | None) -> None:
            if why is not None:
                self.stats["saves_failed"] += 1
                self.saved.pop(cid, None)  # tried again at the next checkpoint
                log.warning("session checkpoint not saved in the registry (%s): a resume "
                            "elsewhere starts from the previous one (more redelivered)", why,
                            extra={"client_id": cid})
        return done

    def _tick(self) -> None:
        self._timer = self.router.loop.call_later(self.interval, self._tick)
        start = time.monotonic()
        try:
            for cid, s in list(self.router.sessions.items()):
                if s.expiry_interval and self.saved.get(cid) != _progress(s):
                    self._save(s, self._logged(cid))
        except Exception:  # noqa: BLE001 - the next tick tries again
            log.exception("session registry checkpoint failed")
        took = time.monotonic() - start
        if took > 0.05:
            log.info("session registry checkpoint took %.0f ms", took * 1000)
