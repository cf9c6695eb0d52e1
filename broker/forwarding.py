"""The router's side of the cluster seam, kept out of ``router.py``.

``Forwarder`` is what the node wiring may hand the router (``cluster/mesh.py`` implements it;
``broker/`` never imports ``cluster/``, see docs/architecture.md). ``RemotePublishes`` is
the router-side half of "a publish whose device log another router owns": the publisher's
router holds the PUBACK/PUBREC until the owner says the record is durable (so "a PUBACK means
stored" holds cluster-wide), and the owner's router appends for a peer and routes once durable.
Without a forwarder none of this runs and the router is the single-node broker unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from broker.connection import fail_client
from broker.lograte import RateLimitedLog
from broker.protocol.packets import PubRec
from broker.protocol.properties import Prop
from broker.protocol.reasons import Reason
from broker.stats import DropReason
from commitlog.store import LogWriteError

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.message import Message
    from broker.port import RouterPort
    from broker.session import Session
    from commitlog.record import Record

log = logging.getLogger("broker.forwarding")

#: Retained clears remembered for the resync rule (cluster/retainsync.py): oldest forgotten
#: first past this many (about 100 bytes each).
CLEARS_KEPT = 65_536


class OwnerNotStored(Exception):
    """A publish its device log's owner router did not store, or did not confirm in time (the
    mesh raises its subclasses). Its text names the owner and why: the v5 reason string the
    publisher gets with its 0x80, so whoever reads the client's log knows which router to
    look at, where a local disk failure says "the commit log cannot write"."""


class NotCommittedYet(OwnerNotStored):
    """An ack refused while the record stays in its log (Kafka's NOT_ENOUGH_REPLICAS: the
    high-water mark did not pass it in time). The publisher is told "not stored" and resends;
    the record may still be committed later, and then its subscribers get it: routed when
    the mark passes it (broker/ingest.py), as a Kafka consumer reads it from the log then."""


class FetchResult(NamedTuple):
    """A read of a device log another router owns (``Forwarder.fetch``)."""

    status: str  # "ok", "out_of_range" (retention removed it), or "failed" (``why``)
    records: list[Record]
    start: int  # the owner's log start
    high_watermark: int  # the owner's high-water mark (its visible end)
    next_offset: int  # where to read next: past the records, or past a quarantined gap
    why: str


class Forwarder(Protocol):
    def forward(self, msg: Message) -> None:
        """After local delivery of a message published (or stored) here: once to each peer
        router with a matching subscription; never called for a message from a peer."""

    def forward_again(self, msg: Message) -> None:
        """``forward`` for a record found stored by this router's previous run
        (``route_again``): the peers route it without QoS 0 copies."""

    def forward_run(self, topic: str, payloads: list[bytes], origin: str | None) -> None:
        """``forward`` for a run of plain QoS 0 messages on one unlogged topic (no properties,
        no expiry; broker/publishrun.py), in order."""

    def plain_runs(self) -> bool:
        """Whether such a run may be routed as one now (False while a peer's shared groups
        need a share picked per message)."""

    def owner_of(self, device: str) -> str | None:
        """The router owning a device log, None when it is this router."""

    def append_at(self, owner: str, device: str, msg: Message, expiry: int | None,
                  done: Any) -> None:
        """Send a publish to its owner; ``done(error or None, offset)`` once durable there."""

    def appended(self, ticket: Any, msg: Message, exc: BaseException | None) -> None:
        """A publish appended for a peer (``append_for_peer``) is durable, or failed."""

    def retained(self, msg: Message) -> None:
        """A retained message was set or cleared here: every router keeps the same set."""

    def claim(self, client_id: str, clean: bool, done: Any, to: str | None = None,
              timeout: float | None = None) -> None:
        """Ask every other router (or only ``to``) to release ``client_id``'s session;
        ``done(state or None)`` (after ``timeout`` at most, when given)."""

    def share(self, msg: Message, groups: list) -> list:
        """Pick, for each shared group matching ``msg`` here or on peers, the router whose
        member gets it: send the peers' shares, return the local groups to deliver to."""

    def hand_on(self, msg: Message, key: tuple[str, str]) -> bool:
        """A share of group ``key`` (name, filter) with no connected member here: send it to
        another router with members (never handed on again there); False when none is up."""

    def resolve(self, owner: str, device: str, spec: str, reset: str, done: Any) -> None:
        """Where an offset subscription of ``device`` starts, asked of its owner after this
        router's routes for it: ``done(offset or None, why)``."""

    def fetch(self, owner: str, device: str, offset: int, max_records: int, done: Any) -> None:
        """Committed records of ``device`` from ``offset``, read at its owner:
        ``done(FetchResult)``."""

    def devices(self) -> Iterable[str] | None:
        """Every device log the cluster has placed (Raft placement), None when the layout
        cannot list them (the static hash places any name): what a resumed session with a
        filter spanning every log reads from its resume time (broker/resumepoints.py)."""


class RemotePublishes:
    """Publishes crossing the mesh to or from their device log's owner."""

    def __init__(self, router: RouterPort) -> None:
        self.router = router
        # topic -> time.monotonic() of its last retained clear here, oldest first (at most
        # CLEARS_KEPT): what keeps a peer's resync from bringing back a message cleared while
        # that peer was away (cluster/retainsync.py)
        self.clears: dict[str, float] = {}
        self._log_not_kept = RateLimitedLog(log, logging.WARNING,
                                            "peer retained changes not persisted",
                                            burst=3, window=10.0)

    # -- at the publisher's router ----------------------------------------------------------
    def append_at_owner(self, owner: str, key: str, msg: Message, conn: Connection | None,
                        packet_id: int | None, expiry: int | None) -> None:
        """Like the ingest room's ``_append`` (broker/ingest.py), with the owner's fsync in
        place of ours."""
        router = self.router
        msg.device = key  # for the ack's log position; the owner routes its own copy
        if conn is not None:
            conn.unsettled += 1
            if msg.qos == 2:
                conn.session.own_incoming_qos2()[packet_id] = False
        router.forwarder.append_at(
            owner, key, msg, expiry,
            lambda exc, offset: self._stored_at_owner(conn, packet_id, msg, exc, offset))

    def _stored_at_owner(self, conn: Connection | None, packet_id: int | None, msg: Message,
                         exc: BaseException | None, offset: int) -> None:
        router = self.router
        if conn is None:  # a will: nobody to answer
            if exc is not None:
                router.not_stored(None, None, msg.qos, exc)
            return
        conn.unsettled -= 1
        if msg.qos == 2 and conn.closing and conn.session is not None:
            # first: not_stored forgets the id, and a live connection must hear the outcome
            msg.offset = offset
            self.settle_resumed_qos2(conn.session, packet_id, exc, msg)  # type: ignore[arg-type]
        if exc is not None:
            router.not_stored(conn, packet_id, msg.qos, exc)
        elif msg.qos and not conn.closing and conn.session is not None:
            props = None
            if conn.ack_offsets:
                msg.offset = offset
                props = {Prop.USER_PROPERTY: msg.log_position()}
            router.ack_publish(conn, msg.qos, packet_id, 0, props)
        if not conn.unsettled and conn.pending is not None:
            router.release_held(conn)
        # no flush here: the ack is queued on the connection, written once per loop tick with
        # every other ack of the RESULTS frame (a flush per ack was a third of a router's CPU)

    def settle_resumed_qos2(self, session: Session, packet_id: int,
                             exc: BaseException | None, msg: Message | None = None) -> None:
        """A QoS 2 publish's outcome came after its connection closed (the owner slow, frozen
        or cut off: up to cluster.append_timeout; or our own fsync slow, from
        ``_on_durable`` in broker/ingest.py). Its packet id must not stay pending in the
        session: the client, reconnected, resends it [MQTT-4.4.0-1], and a resend of a pending
        id is answered only once it is stored (router's [MQTT-4.3.3-10] path), so nobody would
        ever answer it and the client would hang on that id. Stored: the id is the client's to
        release (PUBREC, now to the session's live connection if any, and to any resend).
        Not stored: the id is forgotten (a resend is a new publish) and a live connection hears
        the refusal (v5 0x80; a 3.x one is closed, it resends after reconnecting). The PUBREC
        carries ``msg``'s log position when the live connection asked for ``ack-offsets``, as
        every other PUBREC does (review4: it came without)."""
        if session.incoming_qos2.get(packet_id) is not False:
            return  # no longer pending: a takeover's clean start, or the id already settled
        live = session.conn
        if live is not None and live.closing:
            live = None
        if exc is None:
            session.own_incoming_qos2()[packet_id] = True
            if live is not None:
                props = ({Prop.USER_PROPERTY: msg.log_position()}
                         if msg is not None and live.ack_offsets else None)
                self.router.ack_publish(live, 2, packet_id, 0, props)
            return
        del session.incoming_qos2[packet_id]
        if live is None:
            return
        if live.level == 5:
            live.send(PubRec(packet_id, Reason.UNSPECIFIED_ERROR, {Prop.REASON_STRING: str(exc)}))
        else:
            live.close()

    # -- at the owner's router --------------------------------------------------------------
    def append_for_peer(self, key: str, msg: Message, expiry: int | None, ticket: Any,
                        source: bytes | None = None) -> None:
        """Store a peer's publish; ``stored`` routes it and answers the peer once durable.
        Raises LogWriteError when the log cannot take it (the peer refuses its publisher).
        ``source`` names the APPEND in the record, for a restart's resend check."""
        logs = self.router.logs
        if logs is None:
            raise RuntimeError("this router has no commit log to store a peer's publish")
        if msg.maybe_stored and logs.dedupe is not None:
            # a client's resend, maybe through another router than its first copy (a
            # failover): answered with the stored copy's offset once committed, not stored
            # again (broker/pubdedupe.py)
            found = logs.dedupe.stored_at(key, msg)
            if found is not None:
                offset, route = found
                msg.device = key
                msg.offset = offset
                log.info("resent publish already stored: answered with its offset, not "
                         "stored again (counted in meshmq_publish_dedupe_total"
                         "{result=\"hit\"})", extra={"device": key, "offset": offset})
                logs.dedupe.when_committed(key, offset, lambda exc: self._resend_committed(
                    ticket, msg, route, exc))
                return
        logs.append(key, msg, None, ticket, expiry, source)

    def _resend_committed(self, ticket: Any, msg: Message, route: bool,
                          exc: BaseException | None) -> None:
        """A peer's resend found in the log is committed: answer the peer; routed again only
        when our previous run stored it (it may have died before routing it)."""
        if route:
            self.stored(ticket, msg, exc)
        else:
            self.router.forwarder.appended(ticket, msg, exc)

    def stored(self, ticket: Any, msg: Message, exc: BaseException | None) -> None:
        """From ``_on_durable`` (broker/ingest.py), for a publish stored for a peer, once its
        device's high-water mark here passed it: route it here (the owner routes every logged
        message, so all subscribers see its log order) and answer the peer (its RESULTS: the
        publisher's PUBACK waits for that, so it too means committed at the owner)."""
        router = self.router
        try:
            if exc is None:
                if msg.retain:
                    router.retain(msg)
                router.route(msg)
            else:
                router.stats.dropped(DropReason.NOT_STORED)
        except Exception:  # noqa: BLE001 - it is stored: the peer must still hear so (and
            # the rest of the durable batch must go on)
            log.exception("routing a peer's stored publish failed", extra={"topic": msg.topic})
        router.forwarder.appended(ticket, msg, exc)

    def keep_retained(self, msg: Message) -> None:
        """Set or clear (empty payload) a retained message in memory, and note when a topic
        was cleared. For the router's own changes, which ``DeviceLogs.append`` has already
        written to the ``#retained`` state log with their publish; a peer's go through
        ``retain_from_peer``, which writes them itself."""
        retained = self.router.retained
        topic = msg.topic
        clears = self.clears
        if not msg.payload:
            retained.delete(topic)
            clears.pop(topic, None)  # re-inserted last: the dict stays in time order
            clears[topic] = time.monotonic()
            if len(clears) > CLEARS_KEPT:
                del clears[next(iter(clears))]
        else:
            retained.set(topic, msg)
            if clears:
                clears.pop(topic, None)

    def retain_from_peer(self, msg: Message, stored: Callable[[], object] | None = None) -> None:
        """A peer's retained change (set, or clear with an empty payload): kept here and, with
        ``mqtt.persistence``, written to the same ``#retained`` state log as our own, in this
        tick's group commit; never broadcast again (one hop). ``stored()`` runs once that write
        is durable (the mesh holds the link's ACK until then, so a change the peer saw
        acknowledged survives a kill -9 here, and one that did not is resent to our next
        incarnation), at once without persistence, and also when the write failed: the change
        is then kept in memory only (logged), since a peer's change cannot be refused."""
        self.keep_retained(msg)
        logs = self.router.logs
        persist = logs.retain_log if logs is not None else None
        if persist is None:
            if stored is not None:
                stored()
            return
        try:
            persist.write(msg)
        except LogWriteError as err:
            self._log_not_kept("a retained change from a peer router is kept in memory only "
                               "(the #retained state log cannot write): %s", err,
                               extra={"topic": msg.topic})
            if stored is not None:
                stored()
            return

        def durable(exc: BaseException | None) -> None:
            if exc is not None:
                self._log_not_kept("a retained change from a peer router is kept in memory "
                                   "only (its state record was not stored): %s", exc,
                                   extra={"topic": msg.topic})
            if stored is not None:
                stored()

        persist.log.committer.when_durable(durable)

    def cleared_since(self, topic: str, since: float) -> bool:
        """Whether ``topic``'s retained message was cleared here (by a client of this router
        or by a peer's change) at or after ``since`` (time.monotonic()) and not set since."""
        at = self.clears.get(topic)
        return at is not None and at >= since

    def forget_clears_before(self, since: float) -> None:
        """Drop the clears older than ``since``: the mesh asks no older question (see
        cluster/retainsync.py)."""
        clears = self.clears
        while clears:
            topic, at = next(iter(clears.items()))
            if at >= since:
                break
            del clears[topic]


class RemoteSessions:
    """A client id is one session cluster-wide: connecting at one router ends its connection at
    any other [MQTT-3.1.4-3], and a persistent session moves with the client (subscriptions,
    queued and in-flight messages, QoS 2 receive state), as EMQX and HiveMQ move sessions
    between nodes. The CONNACK (and its session-present flag) waits for the answer."""

    def __init__(self, router: RouterPort) -> None:
        self.router = router

    def claim(self, conn: Connection, pkt: Any, rest: list) -> bool:
        """Start the claim (True: the connect continues in ``_claimed``), or False when there
        is nothing to claim (no client id yet: one is assigned here and is unique)."""
        if not pkt.client_id or getattr(conn, "claimed", False):
            return False
        conn.claimed = True
        conn.pending = list(rest)
        conn.transport.pause_reading()
        self.router.forwarder.claim(pkt.client_id, bool(pkt.clean_start),
                                    lambda state: self._claimed(conn, pkt, state))
        return True

    def _claimed(self, conn: Connection, pkt: Any, state: bytes | None) -> None:
        router = self.router
        if conn.closing:
            return
        if state is not None and pkt.client_id not in router.sessions:
            try:
                router.persist.adopt(pkt.client_id, state)
            except Exception:  # noqa: BLE001 - a bad hand-over costs that session only
                log.exception("session handed over by a peer router unreadable: a new session "
                              "starts", extra={"client_id": pkt.client_id})
        pending, conn.pending = conn.pending or [], None
        conn.transport.resume_reading()
        try:
            router.finish_connect(conn, pkt, 0)
            if pending and conn.session is not None and not conn.closing:
                router.handle_packets(conn, pending)
        except Exception as err:  # noqa: BLE001 - this client only
            fail_client(router.stats, conn, err)
        router.flush_writes()

    def release_session(self, client_id: str, clean: bool, to: str) -> bytes | None:
        """A peer router's CLAIM: close our connection of ``client_id`` and give up its
        session; returns the session's record when it moves (persistent, not a clean start)."""
        router = self.router
        session = router.sessions.get(client_id)
        if session is None:
            return None
        old = session.conn
        state = None
        moves = not clean and session.expiry_interval != 0
        if old is not None:
            session.conn = None
            old.close_reason = f"session taken over at router {to}"
            if old.will is not None and (old.will_delay == 0 or not moves):
                router.publish_will(old.will)
            old.will = None
            old.close(Reason.SESSION_TAKEN_OVER)
        if moves:
            state = router.persist.export(session)
            # A pending delayed will is not part of the exported session: it is settled here,
            # where it is pending, as a reconnect here would settle it: published if due
            # (the sweep may not have fired it yet), cancelled if the client came back in time.
            if (due := session.resume_will(time.monotonic())) is not None:
                router.publish_will(due)
        # (a session ended by a clean start keeps its will: end_session publishes it, as the
        # end of a session before the will delay does anywhere [MQTT-3.1.3-9])
        what = "handed over" if state else ("ended for a clean start" if clean else "ended")
        log.info("session %s to router %s", what, to, extra={"client_id": client_id})
        router.end_session(session)
        return state
