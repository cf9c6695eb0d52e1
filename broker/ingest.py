"""The ingest path: a publish is logged or routed, appended, settled once durable, and its
publisher answered; wills and the broker's own publishes enter here too. A room of the router.

Why this cut: rumqttd keeps its logs apart from routing; Kafka's broker separates the append
(``ReplicaManager.appendRecords``) from the answer it delays until the write is durable (the
purgatory). Here a publish on a logged topic is appended to its device log (``devicelogs.py``)
and held; ``_on_durable`` routes each stored message and acks its publisher in log order once
its device's high-water mark has passed it (one call per device per group commit: devicelogs.py),
so *a PUBACK means committed*: on one node the mark is the durable end (an fsync covered it),
with replication the mark the in-sync replicas reached. A log another router owns goes through
``forwarding.RemotePublishes`` instead, with the owner's high-water mark in place of ours.
``IngestRoom`` is a mixin of ``Router`` (its methods run with the router as ``self``); it calls
down only, into the delivery room (``route``).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from broker.connection import Connection, fail_client
from broker.devicelogs import RETAIN_ONLY, DeviceLogs, PendingPublish
from broker.forwarding import NotCommittedYet, OwnerNotStored
from broker.message import Message
from broker.protocol.packets import PacketType, PubAck, Publish, PubRec, Will
from broker.protocol.properties import Prop
from broker.protocol.reasons import Reason
from broker.pubacks import pubacks
from broker.stats import DropReason
from commitlog.store import LogTruncatedError, LogWriteError
from commitlog.waiters import Watch

log = logging.getLogger("broker.router")  # the router's log lines keep the router's name

# Properties a subscriber receives unchanged [MQTT-3.3.2-*]: the rest are per hop.
_FORWARDED = (
    Prop.PAYLOAD_FORMAT_INDICATOR, Prop.CONTENT_TYPE, Prop.RESPONSE_TOPIC, Prop.CORRELATION_DATA,
    Prop.USER_PROPERTY,
)
_PUBACK = PacketType.PUBACK
_PUBREC = PacketType.PUBREC
_PUBCOMP = PacketType.PUBCOMP
# Fixed headers of the 4-byte acks (reason 0, no properties: the short form in v5 as well).
_ACK_HEAD = {_PUBACK: b"\x40\x02", _PUBREC: b"\x50\x02", _PUBCOMP: b"\x70\x02"}
# Publishes waiting for the disk beyond which publishers' sockets stop being read: a fast QoS 0
# publisher cannot grow memory faster than fsync drains it (v5 Receive Maximum bounds QoS>0 too).
HELD_LIMIT = 50_000
# ...and only a publisher holding at least this many of them itself is paused (review4): a device
# whose high-water mark is held (a lagging follower, broker/devicelogs.py) may hold HELD_LIMIT
# publishes alone, and pausing every publisher then stopped every other device's publishers too,
# for as long as that one device lagged (Kafka's purgatory delays only the produce requests of
# the lagging partition). Memory stays bounded: HELD_LIMIT plus this many per connection.
PAUSE_MIN_UNSETTLED = 64
_NOT_STORED = "message not stored: the commit log cannot write (disk full or failing?)"
# A record cut by a truncation (this router led the log, lost the leadership before the record
# reached the high-water mark, and its new leader's log ends before it) is no disk fault: the
# client publishes again (Kafka answers NOT_LEADER_OR_FOLLOWER and the producer retries).
_TRUNCATED = ("message not stored: this router's leadership of the device log ended before "
              "the record was committed; publish again")


def forwarded_properties(props: dict | None) -> dict | None:
    """The properties of a PUBLISH (or will) that its subscribers receive."""
    if not props:
        return None
    out = {k: v for k, v in props.items() if k in _FORWARDED}
    return out or None


class IngestRoom:
    """Append, settle, ack; wills and internal publishes (a mixin of ``Router``; see the module
    docstring)."""

    def _append(self, logs: DeviceLogs, key: str, msg: Message, conn: Connection,
                pkt: Publish, expiry: int | None) -> None:
        """Store, and hold routing and the ack until the device's high-water mark passes the
        record (see devicelogs). A possible resend already in the log is answered with the
        stored copy's offset instead (broker/pubdedupe.py)."""
        if msg.maybe_stored and logs.dedupe is not None and key != RETAIN_ONLY:
            found = logs.dedupe.stored_at(key, msg)
            if found is not None:
                self._answer_resend(logs, key, msg, conn, pkt, *found)
                return
        try:
            logs.append(key, msg, conn, pkt.packet_id, expiry)
        except LogWriteError as err:
            self.not_stored(conn, pkt.packet_id, pkt.qos, err)
            return
        conn.unsettled += 1
        if key == RETAIN_ONLY:  # routed once durable: later publishes wait (router.py)
            self._retain_waits.add(conn)
        if pkt.qos == 2:
            conn.session.own_incoming_qos2()[pkt.packet_id] = False
        if logs.held > HELD_LIMIT:
            self.pause_if_holding(conn)

    def pause_if_holding(self, conn: Connection) -> None:
        """Past HELD_LIMIT (appended, unsettled publishes): pause reading ``conn`` if it holds
        PAUSE_MIN_UNSETTLED of them itself (the rest of its read goes on). Only a publisher
        that holds memory is paused: one device whose mark is held must not stop the others'."""
        if conn.unsettled >= PAUSE_MIN_UNSETTLED and conn not in self._paused_publishers:
            conn.transport.pause_reading()
            self._paused_publishers.add(conn)

    def publisher_settled(self, conn: Connection, settled: list[Connection]) -> None:
        """``conn`` has nothing unsettled any more (once a batch, not once a message): what
        waited for that goes on."""
        self._retain_waits.discard(conn)
        if conn.pending is not None:
            settled.append(conn)  # (released after the batch's acks: after_settle)
        if conn in self._paused_publishers:
            # nothing of its own held any more: it costs no memory (see PAUSE_MIN_UNSETTLED),
            # whatever other devices still hold
            self._resume_publisher(conn)

    def _on_durable(self, batch: list[PendingPublish], exc: BaseException | None) -> None:
        """One device's publishes of a group commit are below its high-water mark (or were not
        stored: ``exc``): route them and answer their publishers, in log order."""
        if exc is None and len(batch) > 1 and self._settle_run(batch):
            return  # a run of plain QoS 1 publishes: routed and acked as one (loggedrun.py)
        settled: list[Connection] = []
        later = isinstance(exc, NotCommittedYet) and self.logs is not None
        # A run of plain PUBACKs (QoS 1, reason 0, no properties) to one publisher, in log
        # order: written as one buffer when the run ends (another publisher, another kind of
        # ack, the end of the batch), not one write per message (pubacks.py)
        run_conn: Connection | None = None
        run: list[int] = []
        for conn, packet_id, msg in batch:
            if later and msg.device is not None and msg.offset >= 0:
                # refused to its publisher, but still in the log: routed if the mark passes it
                # later (nothing stored is lost to a subscriber; at least once, as a resend of
                # it is stored again)
                self.logs.committer.when_high_watermark(
                    msg.device, msg.offset, Watch(partial(self._committed_later, msg)))
            if conn is None and packet_id is not None:  # stored for a peer router
                self.remote.stored(packet_id, msg, exc)
                continue
            if conn is not None:
                conn.unsettled -= 1
                if not conn.unsettled:
                    self.publisher_settled(conn, settled)
                if msg.qos == 2 and conn.closing and conn.session is not None:
                    # its resumed session must not keep the id pending forever
                    self.remote.settle_resumed_qos2(conn.session, packet_id, exc, msg)
            try:
                if exc is not None:
                    self.not_stored(conn, packet_id, msg.qos, exc)
                    continue
                if msg.retain:
                    self.retain(msg)
                self.route(msg)
                if msg.qos and conn is not None and not conn.closing and conn.session is not None:
                    if msg.qos == 1 and not conn.ack_offsets:
                        if conn is not run_conn:
                            if run:
                                self.send_pubacks(run_conn, run)
                                run = []
                            run_conn = conn
                        run.append(packet_id)
                        continue
                    if run:  # what this publisher was owed before, first
                        self.send_pubacks(run_conn, run)
                        run = []
                    ack_props = ({Prop.USER_PROPERTY: msg.log_position()} if conn.ack_offsets
                                 else None)
                    self.ack_publish(conn, msg.qos, packet_id, 0, ack_props)
            except Exception as err:  # noqa: BLE001 - stored; its publisher closed, unacked,
                if run:  # (the acks before it were earned: out before the close)
                    self.send_pubacks(run_conn, run)
                    run = []
                fail_client(self.stats, conn, err)  # resends; the rest of the batch goes on
        if run:
            self.send_pubacks(run_conn, run)
        self.after_settle(settled)

    def after_settle(self, settled: list[Connection]) -> None:
        """A durable batch was settled: the held packets of its publishers that have nothing
        unsettled any more, and the publishers paused by HELD_LIMIT once it is half free."""
        for conn in settled:  # their held SUBSCRIBE/UNSUBSCRIBE, now after the acks above
            self.release_held(conn)
        if self._paused_publishers and self.logs is not None \
                and self.logs.held <= HELD_LIMIT // 2:
            for paused in list(self._paused_publishers):
                self._resume_publisher(paused)

    def _committed_later(self, msg: Message, exc: BaseException | None) -> None:
        """A record whose ack was refused (NotCommittedYet) is committed after all: routed now
        (its retained part too), in the log's order for that device (waiters fire in offset
        order). Truncated instead (``exc``): it was never committed, nothing to route."""
        if exc is not None:  # (never a refusal: a Watch outlives those, commitlog/waiters.py)
            return
        try:
            if msg.retain:
                self.retain(msg)
            self.route(msg)
        except Exception:  # noqa: BLE001 - one message's routing failure must not stop others
            log.exception("routing a record committed after its ack was refused failed",
                          extra={"device": msg.device, "offset": msg.offset})

    def _answer_resend(self, logs: DeviceLogs, key: str, msg: Message, conn: Connection,
                       pkt: Publish, offset: int, before_start: bool) -> None:
        """A resent publish found stored at ``offset``: acknowledged once that record is
        committed (as its first copy would have been), not appended again."""
        msg.device = key
        msg.offset = offset
        conn.unsettled += 1
        if pkt.qos == 2:
            conn.session.own_incoming_qos2()[pkt.packet_id] = False
        log.info("resent publish already stored: acknowledged with its offset, not stored "
                 "again (counted in meshmq_publish_dedupe_total{result=\"hit\"})",
                 extra={"client_id": conn.client_id, "device": key, "offset": offset,
                        "packet_id": pkt.packet_id})
        logs.dedupe.when_committed(key, offset, partial(
            self._resend_committed, conn, pkt.packet_id, msg, before_start))

    def _resend_committed(self, conn: Connection, packet_id: int, msg: Message,
                          route: bool, exc: BaseException | None) -> None:
        """Answer a resend found in the log. ``route``: its copy was stored by this router's
        previous run, which may have died before routing it: routed again (``route_again``:
        at least once for QoS 1/2 subscribers, whose position drops a copy they had; never a
        QoS 0 copy), as cluster/mesh.py does for a peer's resent APPEND. Stored in this run: it
        was routed when committed."""
        conn.unsettled -= 1
        if msg.qos == 2 and conn.closing and conn.session is not None:
            self.remote.settle_resumed_qos2(conn.session, packet_id, exc, msg)
        try:
            if exc is not None:
                self.not_stored(conn, packet_id, msg.qos, exc)
            else:
                if route:
                    self.route_again(msg)
                if not conn.closing and conn.session is not None:
                    ack_props = ({Prop.USER_PROPERTY: msg.log_position()} if conn.ack_offsets
                                 else None)
                    self.ack_publish(conn, msg.qos, packet_id, 0, ack_props)
        except Exception as err:  # noqa: BLE001 - as in _on_durable: its publisher closed,
            fail_client(self.stats, conn, err)  # unacked, resends
        if not conn.unsettled:
            if conn.pending is not None:
                self.release_held(conn)
            if conn in self._paused_publishers:
                self._resume_publisher(conn)

    def _resume_publisher(self, conn: Connection) -> None:
        """Read a publisher paused by HELD_LIMIT again."""
        self._paused_publishers.discard(conn)
        if not conn.closing:
            conn.partial_since = None  # packet_timeout counts from the resume
            conn.transport.resume_reading()

    def not_stored(self, conn: Connection | None, packet_id: int | None, qos: int,
                    err: BaseException) -> None:
        """Never acknowledge what was not stored: v5 gets a failure reason, 3.x a closed socket."""
        self.stats.dropped(DropReason.NOT_STORED)
        # at another router (its log's owner): its text says which and why, not our disk
        remote = isinstance(err, OwnerNotStored)
        text = _TRUNCATED if isinstance(err, LogTruncatedError) else None
        self._log_not_stored("%s: %s (counted in meshmq_messages_dropped_total"
                             "{reason=\"not_stored\"})", "message not stored" if remote
                             else text or _NOT_STORED, err)
        if qos == 2 and conn is not None and conn.session is not None:
            # the id is the client's again, whatever its level: a 3.x client (closed below)
            # resends after reconnecting, and a pending id would swallow that resend for good
            conn.session.incoming_qos2.pop(packet_id, None)
        if conn is None or conn.closing or qos == 0:
            return
        if conn.level == 5:
            conn.inbound_unacked -= 1
            why = {Prop.REASON_STRING: str(err) if remote else
                   f"{text}: {err}" if text else _NOT_STORED}
            if qos == 1:
                conn.send(PubAck(packet_id, Reason.UNSPECIFIED_ERROR, why))
            else:
                conn.send(PubRec(packet_id, Reason.UNSPECIFIED_ERROR, why))
        else:
            conn.close()  # 3.x has no negative PUBACK: the client retries after reconnecting

    def _send_ack(self, conn: Connection, ptype: int, packet_id: int) -> None:
        """A success ack without properties: 4 fixed bytes, no encoder call on the hot path."""
        self.stats.packets_out[ptype] += 1
        conn.write(_ACK_HEAD[ptype] + packet_id.to_bytes(2, "big"))

    def send_pubacks(self, conn: Connection, packet_ids: list[int]) -> None:
        """``ack_publish(conn, 1, pid, 0)`` for each of ``packet_ids``, in order, in one write
        of the same bytes (a durable batch's QoS 1 acks to one publisher: broker/pubacks.py)."""
        n = len(packet_ids)
        if conn.level == 5:
            conn.inbound_unacked -= n
        self.stats.packets_out[_PUBACK] += n
        conn.write(pubacks(packet_ids))

    def ack_publish(self, conn: Connection, qos: int, packet_id: int | None, reason: int,
                     props: dict | None = None) -> None:
        """Answer an inbound QoS 1/2 PUBLISH. [MQTT-3.3.4-7]: QoS 1 frees its receive-maximum
        slot at PUBACK, QoS 2 only at PUBCOMP (see _on_pubrel) unless refused here."""
        if qos == 1:
            conn.inbound_unacked -= conn.level == 5
            if reason or props:
                conn.send(PubAck(packet_id, reason, props))
            else:
                self._send_ack(conn, _PUBACK, packet_id)
        elif qos == 2:
            if reason < 0x80:
                conn.session.own_incoming_qos2()[packet_id] = True
            else:
                conn.inbound_unacked -= conn.level == 5
            if reason or props:  # once the session owning the packet id is stored
                self.persist.stored(conn.session, conn.send, PubRec(packet_id, reason, props))
            else:
                self.persist.stored(conn.session, self._send_ack, conn, _PUBREC, packet_id)

    def publish_internal(self, msg: Message) -> None:
        """A message the broker itself publishes ($SYS): retained if flagged, routed, not
        logged (``$`` topics never are)."""
        if msg.retain:
            self.retain(msg)
        self.route(msg)

    def retain(self, msg: Message) -> None:
        self.remote.keep_retained(msg)  # already in #retained with its publish (devicelogs)
        if self.forwarder is not None:
            self.forwarder.retained(msg)

    def publish_will(self, will: Will) -> None:
        props = will.properties or {}
        interval = props.get(Prop.MESSAGE_EXPIRY_INTERVAL)
        expiry_at = time.monotonic() + interval if interval is not None else None
        msg = Message(will.topic, will.payload, will.qos, will.retain,
                      forwarded_properties(props), expiry_at, None)
        logs = self.logs
        if logs is not None:
            key = logs.key_for(will.topic, will.retain)
            owner = self.forwarder.owner_of(key) if self.forwarder and key else None
            if owner is not None:
                self.remote.append_at_owner(owner, key, msg, None, None, interval)
                return
            if key is not None:
                # stored first, like any logged publish: _on_durable routes it once committed
                try:
                    logs.append(key, msg, None, None, interval)
                except LogWriteError as err:
                    self.not_stored(None, None, will.qos, err)
                return
        if will.retain:
            self.retain(msg)
        self.route(msg)
