"""Runs of plain QoS 1 messages on one device topic, at the three steps of the logged path: a
room of the router.

Why: a device that publishes QoS 1 fast pipelines one topic (paho's max_inflight, MQTT.js, a
gateway), so one socket read holds a run of PUBLISH packets that differ only in packet id and
payload, one group commit settles a run of them, and a subscriber that lags reads a run of
them back from the log. Per message the logged path repeated the same checks (QoS and depth
allowed, the topic's log, the write gate, the log's owner), the same trie match and merge, the
same per-session decisions (lag, position, window) and one write per copy: ~970 bytecode
instructions a message and 1.24x Mosquitto where issue 25 asks 2x. Kafka moves record batches
for the same reason (the producer's batch is validated and appended as one; a fetch returns a
batch); rumqttd's router moves batches between connections. Here:

- **in** (``_logged_run``): a read's run of up to 64 is checked once (``_logged_run_plan``) and
  appended by ``DeviceLogs.append_run`` into the same group commit: one timestamp, the header
  made once; each record keeps its own offset and publisher id.
- **settled** (``_settle_run``, from ``IngestRoom._on_durable``): a device's durable publishes
  that are all plain and on one topic are routed as a run per publisher (``_route_run``: the
  trie matched once, each session handed the run, ``_deliver_run``: the part its window takes
  sent in one write and its position moved once), then acked in one write, in log order.
- **read back** (``catchup.LogCatchUp.pump`` -> ``_deliver_read``): a lagging session's plain
  records of one plan go to its window as one, as live ones do.

What does not change: the order of everything a client sees, what is counted, and every
decision the per-message path makes. Only the plain case takes these paths (QoS 1, not
retained, not DUP: a resend is looked up in the log first, broker/pubdedupe.py; no properties;
one topic; a log this router leads; the write gate open with nothing held; no ACL; no shared
group, offset replay or cluster peer among the subscribers; a v3.x subscriber for the one-write
encode). Anything else goes message by message through ``_on_publish``, ``route`` and
``deliver``, which stay the reference (tests/broker/test_logged_run.py compares the two). A
failed append refuses what it did not store, one message at a time. ``LoggedRunRoom`` is a
mixin of ``Router``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.connection import Connection, fail_client
from broker.delivery import merge
from broker.devicelogs import PendingPublish
from broker.ingest import HELD_LIMIT
from broker.message import Delivery, Message, new_delivery, new_message
from broker.protocol import codec
from broker.protocol.packets import PacketType, Publish
from broker.pubdedupe import publisher_id
from broker.publishrun import NO_RUN_SKIP, RUN_MAX, run_end
from commitlog.store import LogWriteError

if TYPE_CHECKING:
    from broker.session import Session

_PUBLISH = PacketType.PUBLISH
_SENT = Delivery.SENT


class LoggedRunRoom:
    """Runs of plain QoS 1 publishes to a device log (a mixin of ``Router``; see the module
    docstring)."""

    def _logged_run(self, conn: Connection, packets: list[Any], start: int) -> int:
        """Store ``packets[start:end]``, a run of plain QoS 1 publishes on one logged topic,
        and return ``end``; or ``-end`` when they must go packet by packet (``_publish_run``'s
        contract, broker/publishrun.py)."""
        first = packets[start]
        if first.retain or first.dup or first.properties is not None:
            return -(start + 1)  # (its QoS is 1: the dispatch loop looked)
        topic = first.topic
        end = run_end(packets, start, start + RUN_MAX, 1, topic)
        if end - start < 2:
            return -(start + NO_RUN_SKIP)
        key = self._logged_run_plan(conn, topic)
        if key is None:
            return -end
        run = packets[start:end]
        n = end - start
        stats = self.stats
        stats.packets_in[_PUBLISH] += n - 1  # the first was counted by the dispatch loop
        stats.messages_in += n
        stats.messages_in_qos[1] += n
        if conn.level == 5:  # as _on_publish counts each (freed by its PUBACK)
            conn.inbound_unacked += n
        client_id = conn.client_id
        msgs = [new_message(topic, p.payload, 1, False, None, None, client_id) for p in run]
        pids = [p.packet_id for p in run]
        logs = self.logs
        if logs.dedupe is not None:  # who published each, kept in its record (pubdedupe.py)
            session = conn.session
            for msg, pid in zip(msgs, pids, strict=True):
                msg.publisher = publisher_id(session, pid)
        try:
            logs.append_run(key, msgs, conn, pids)
        except LogWriteError as err:
            self._logged_run_failed(logs, key, msgs, conn, run, err)
            return end
        conn.unsettled += n
        if logs.held > HELD_LIMIT:  # (as _append)
            self.pause_if_holding(conn)
        return end

    def _logged_run_plan(self, conn: Connection, topic: str) -> str | None:
        """The device log a plain QoS 1 publish on ``topic`` from ``conn`` is appended to
        here, with every check ``_on_publish`` makes on it passed; None when some part of that
        path is not the plain one (the caller then takes it). (An ACL rules runs out before
        this is called.)"""
        if conn.session is None:
            return None
        mqtt = self.mqtt
        if mqtt.max_qos < 1 or topic.count("/") >= mqtt.max_topic_levels:
            return None
        logs = self.logs
        if logs is None:
            return None
        key = logs.key_for(topic, False)
        if key is None:
            return None
        gate = self.write_gate
        if gate is not None and (gate() is not None or self.gate_held.items):
            return None  # held or refused (broker/gatehold.py): each, as _gated decides
        forwarder = self.forwarder
        if forwarder is not None and forwarder.owner_of(key) is not None:
            return None  # another router leads the log: an APPEND each (forwarding.py)
        return key

    def _logged_run_failed(self, logs: Any, key: str, msgs: list[Any], conn: Connection,
                           run: list[Publish], err: LogWriteError) -> None:
        """``append_run`` stored a prefix of the run, then could not store the next: that
        prefix is settled as usual, the one that failed is refused, and each after it takes
        ``_append`` (stored if the log takes it now, else refused), as packet by packet.
        Once the connection is closing (a 3.x publisher is closed, not refused) the rest is
        not processed, as the dispatch loop stops there: nor counted (``_logged_run`` counted
        the whole run as received up front)."""
        stored = 0
        while stored < len(msgs) and msgs[stored].offset >= 0:
            stored += 1
        conn.unsettled += stored
        self.not_stored(conn, run[stored].packet_id, 1, err)
        rest = stored + 1
        for msg, pkt in zip(msgs[rest:], run[rest:], strict=True):
            if conn.closing:
                break
            self._append(logs, key, msg, conn, pkt, None)
            rest += 1
        left = len(run) - rest
        if left:  # never read, packet by packet: uncounted
            stats = self.stats
            stats.packets_in[_PUBLISH] -= left
            stats.messages_in -= left
            stats.messages_in_qos[1] -= left
            if conn.level == 5:
                conn.inbound_unacked -= left

    # -- the other end: a durable run routed and delivered as one -------------------------------
    def _settle_run(self, batch: list[PendingPublish]) -> bool:
        """``_on_durable`` for one device's durable publishes (``exc`` None) when every one is
        a plain QoS 1 message on one topic from a client here: the publishers' bookkeeping per
        message as there, then each publisher's stretch routed as a run (``_route_run``) and
        acked in one write, in log order. False, with nothing done, when one is not plain (a
        peer's append, retained, properties, another topic, an ``ack-offsets`` publisher):
        the caller settles the batch message by message."""
        topic = batch[0][2].topic
        for conn, _, msg in batch:
            if conn is None or msg.qos != 1 or msg.retain or msg.properties is not None \
                    or msg.topic != topic or conn.ack_offsets:
                return False
        settled: list[Connection] = []
        for conn, _, _ in batch:  # (as _on_durable, per message)
            conn.unsettled -= 1
            if not conn.unsettled:
                self.publisher_settled(conn, settled)
        start = 0
        n = len(batch)
        while start < n:  # a stretch per publisher: its messages, then its acks
            conn = batch[start][0]
            end = start + 1
            while end < n and batch[end][0] is conn:
                end += 1
            stretch = batch[start:end]
            start = end
            try:
                self._route_run([entry[2] for entry in stretch])
            except Exception as err:  # noqa: BLE001 - stored; its publisher closed, unacked
                fail_client(self.stats, conn, err)  # resends; the rest of the batch goes on
                continue
            if not conn.closing and conn.session is not None:
                self.send_pubacks(conn, [entry[1] for entry in stretch])
        self.after_settle(settled)
        return True

    def _route_run(self, msgs: list[Message]) -> None:
        """``route(msg)`` for each of a run of plain logged QoS 1 messages on one topic from one
        publisher: the trie matched once and each session handed the run
        (``_deliver_run``); message by message where a session's subscriptions need more
        than the plain merge (an offset replay), and in a cluster (the forwarder shares and
        forwards each)."""
        match = self.trie.match(msgs[0].topic)
        if self.forwarder is not None or match.groups:
            for msg in msgs:
                self.route(msg)
            return
        subs = match.subs
        origin = msgs[0].origin
        sessions = self.sessions
        if len(subs) == 1:
            cid, sub = subs[0]
            if sub.replay is not None:
                for msg in msgs:
                    self.route(msg)
            elif not (sub.no_local and cid == origin):
                self._deliver_run(sessions[cid], msgs, sub.qos,
                                  (sub.sub_id,) if sub.sub_id else None)
            return
        if any(sub.replay is not None for _, sub in subs):
            for msg in msgs:
                self.route(msg)
            return
        failed: Exception | None = None
        # route's merge (one copy a session, max QoS, every id once, No Local), the same
        # function; no replay among them, and a run is never retained
        for cid, (qos, _rap, ids, _position) in merge(subs, msgs[0]).items():
            try:
                self._deliver_run(sessions[cid], msgs, qos, tuple(i for i in ids if i) or None)
            except Exception as err:  # noqa: BLE001 - one session's failure must not cost
                failed = failed or err  # the others the run (route loses one message, not
                # a run, for the sessions after it); raised after: its publisher is failed
        if failed is not None:
            raise failed

    def _deliver_run(self, session: Session, msgs: list[Message], granted: int,
                     sub_ids: tuple[int, ...] | None) -> None:
        """``deliver(session, msg, granted, False, sub_ids, None, False, True)`` for each of a
        run: the part that fits the session's window is sent in one write, with the session's
        position in the device log moved once; the rest, and any session whose state needs
        ``deliver``'s per-message decisions, goes through ``deliver``."""
        take = 0
        lag = session.lag
        if self._acl is not None:
            pass  # (deliver checks each message's read access first)
        elif lag:
            c = lag.get(msgs[0].device)
            if c is not None and not c.live:
                return  # behind on this device: its cursor reads them (catchup.divert)
        elif granted:
            positions = session.positions
            at = positions.get(msgs[0].device)
            conn = session.conn
            if at is not None and msgs[0].offset >= at and conn is not None \
                    and not session.queue:
                take = session.window - len(session.inflight)
                if take > 0:
                    if take > len(msgs):
                        take = len(msgs)
                    positions[msgs[0].device] = msgs[take - 1].offset + 1
                    self._send_run(session, conn, msgs[:take] if take < len(msgs) else msgs,
                                   sub_ids)
                else:
                    take = 0
        deliver = self.deliver
        device = msgs[0].device
        for i in range(take, len(msgs)):
            deliver(session, msgs[i], granted, False, sub_ids, None, False, True)
            if session.lag_behind:
                c = session.lag.get(device)
                if c is not None and not c.live:
                    return  # it fell behind on this device: catchup.divert leaves the rest to
                    # its cursor, which reads them from the log

    def _deliver_read(self, session: Session, conn: Connection, msgs: list[Message],
                      sub_ids: tuple[int, ...] | None) -> None:
        """``deliver(session, msg, 1, False, sub_ids, None, False, False)`` for each of a run
        of plain QoS 1 messages a lagging session read from its device log, the window having
        room for all (broker/catchup.py ``pump``): the session's position moved once, the run
        sent in one write."""
        device = msgs[0].device
        at = session.positions.get(device)
        if at is None or msgs[0].offset < at or self._acl is not None or session.queue:
            deliver = self.deliver  # (a first position, below it, an ACL: deliver decides)
            for msg in msgs:
                deliver(session, msg, 1, False, sub_ids, None, False, False)
            return
        session.positions[device] = msgs[-1].offset + 1
        self._send_run(session, conn, msgs, sub_ids)

    def _send_run(self, session: Session, conn: Connection, msgs: list[Message],
                  sub_ids: tuple[int, ...] | None) -> None:
        """``_send_inflight`` for each of a run of QoS 1 copies, the window having room for
        all: a v3.x connection's packets are encoded whole (packet id in place) and written in
        one call."""
        encode = codec.c_publish_packet_pid  # (looked up here: tests switch it off)
        if conn.level == 5 or conn.out_aliases is not None or encode is None \
                or session.max_packet_size:
            for msg in msgs:
                self._send_inflight(session, conn, new_delivery(msg, 1, False, sub_ids, None,
                                                                False))
            return
        inflight = session.own_inflight()
        pid = session.next_pid
        datas = []
        for msg in msgs:
            while pid in inflight:  # (Session.allocate_pid, inline: the window has room)
                pid = pid + 1 if pid < 65535 else 1
            d = new_delivery(msg, 1, False, sub_ids, None, False)
            d.pid = pid
            d.state = _SENT
            inflight[pid] = d
            datas.append(encode(msg.topic, msg.payload, 0x32, pid))
            pid = pid + 1 if pid < 65535 else 1
        session.next_pid = pid
        conn.write(b"".join(datas))
        n = len(msgs)
        stats = self.stats
        stats.packets_out[_PUBLISH] += n
        stats.messages_out += n
        stats.messages_out_qos[1] += n
