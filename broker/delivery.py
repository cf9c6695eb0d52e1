"""Delivery: route a message to the matching sessions, deliver to one (ACL, QoS, positions,
lag), and run each session's window and queue down to the bytes written. A room of the router.

Why this cut: rumqttd's router keeps routing (the subscription match) apart from its scheduler
(who may be sent what, per connection window) and its iobufs (the writes); the three are one
flow here, short enough to read in one file: ``route`` merges overlapping subscriptions into one
copy per session, ``deliver`` decides between the window, the queue and the log
(``broker/catchup.py``: a slow session reads from the commit log instead of growing a queue),
``_pump`` moves the queue into the window as acks free it. ``DeliveryRoom`` is a mixin of
``Router`` (its methods run with the router as ``self``); it is the lowest room: it calls only
the engines (catch-up, shared groups, the forwarder) and the connections.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from broker.connection import Connection
from broker.message import Delivery, Message, aliased_parts, new_delivery
from broker.protocol import codec
from broker.protocol.packets import PacketType, PubRel
from broker.protocol.reasons import Reason
from broker.session import NO_ENTRIES, Session, delivery_bytes
from broker.settings import QueueFullPolicy
from broker.stats import DropReason
from broker.trie import SharedGroup

log = logging.getLogger("broker.router")  # the router's log lines keep the router's name

_PUBLISH = PacketType.PUBLISH


class DeliveryRoom:
    """Route, deliver, queue, window, write (a mixin of ``Router``; see the module docstring)."""

    def route(self, msg: Message, forward: bool = True) -> None:
        """Deliver to every matching session: one copy per session, at the best granted QoS;
        then to peer routers (``forward``: False for a message that came from one)."""
        match = self.trie.match(msg.topic)
        subs = match.subs
        sessions = self.sessions
        if len(subs) == 1:
            cid, sub = subs[0]
            replay = sub.replay
            if not (sub.no_local and cid == msg.origin) and (
                    replay is None or replay.accept_live(msg)):
                session = sessions[cid]
                ids = (sub.sub_id,) if sub.sub_id else None
                # (positional: a keyword call costs more, on every message)
                self.deliver(session, msg, sub.qos, sub.retain_as_published and msg.retain, ids,
                             None, replay is not None, True)
        elif subs:
            for cid, (qos, rap, ids, position) in merge(subs, msg).items():
                sub_ids = tuple(i for i in ids if i) or None
                self.deliver(sessions[cid], msg, qos, rap and msg.retain, sub_ids, None,
                             position, True)
        groups = match.groups
        if self.forwarder is not None:  # the first router to route a message picks the members
            groups = self.forwarder.share(msg, groups) if forward else ()
        for group in groups:
            self.shared.deliver(group, msg)
        if forward and self.forwarder is not None:
            self.forwarder.forward(msg)

    def route_again(self, msg: Message, forward: bool = True) -> None:
        """``route`` for a record this router found stored by its previous run: a publisher's
        resend after a restart (broker/ingest.py ``_resend_committed``), a peer's resent
        APPEND (cluster/mesh.py), or a peer's DELIVER of either (marked ``frames.AGAIN``).
        That run may have died before routing it, or after: only the copies a session can
        tell from one it had go, at QoS 1/2 (its position in the device log drops a copy
        below it, ``deliver``). A QoS 0 copy never goes: the subscriber may have had it, and
        newer messages of the device since; QoS 0 is at most once, which allows the loss, not
        a duplicate out of order. Shared groups get it as ``route`` gives it."""
        match = self.trie.match(msg.topic)
        sessions = self.sessions
        if msg.qos:
            for cid, (qos, rap, ids, position) in merge(match.subs, msg).items():
                if qos:
                    self.deliver(sessions[cid], msg, qos, rap and msg.retain,
                                 tuple(i for i in ids if i) or None, None, position, True)
        groups = match.groups
        forwarder = self.forwarder
        if forwarder is not None:
            groups = forwarder.share(msg, groups) if forward else ()
        for group in groups:
            self.shared.deliver(group, msg)
        if forward and forwarder is not None:
            forwarder.forward_again(msg)

    def deliver(
        self,
        session: Session,
        msg: Message,
        granted: int,
        retain: bool,
        sub_ids: tuple[int, ...] | None,
        group: SharedGroup | None = None,
        position: bool = False,
        live: bool = False,
    ) -> None:
        """``live``: routed from a just-stored (or unlogged) publish; a logged one may then be
        left to the log when the session is behind (broker/catchup.py)."""
        acl = self._acl
        if acl is not None and not self._allowed(
                "deliver", acl.can_deliver(session.username, session.client_id, msg.topic)):
            # A wildcard subscription may cover a topic whose read is denied (Mosquitto checks
            # read access per message for the same reason).
            self.stats.dropped(DropReason.NOT_AUTHORIZED)
            return
        qos = msg.qos if msg.qos < granted else granted  # [MQTT-3.3.5-1]
        if live and session.lag and group is None and msg.device is not None \
                and self.catchup.divert(session, msg, qos):
            return
        conn = session.conn
        if qos == 0:
            if conn is None:
                return  # QoS 0 is not queued for offline sessions (Mosquitto's default too)
            if conn.congested:
                self.stats.dropped(DropReason.SLOW_CONSUMER)
                return
            self._write_qos0(session, conn, msg, retain, sub_ids, position)
            return
        if group is None and msg.device is not None and not position:
            positions = session.positions  # where a restart or move resumes (broker/positions)
            if positions is NO_ENTRIES:  # its first logged delivery (broker/session.py)
                positions = session.own_positions()
            at = positions.get(msg.device)
            if at is None:
                if len(positions) >= self.positions.max_devices:
                    self.positions.full(session)
                positions[msg.device] = msg.offset + 1
            elif msg.offset >= at:  # never back: a retained message sent on SUBSCRIBE is old
                positions[msg.device] = msg.offset + 1
            elif live:
                # routed again, below what this session was handed of that device: a copy it
                # had (a restarted or new leader routes what it cannot know was routed, from
                # its checkpointed high-water mark), or one its read from the log gave it
                # already (cluster/deliverfence.py). Handed on now it would come after newer
                # messages of the device: per-device order holds per session, as a Kafka
                # consumer never goes back below its position.
                return
        delivery = new_delivery(msg, qos, retain, sub_ids, group, position)
        if conn is not None and not session.queue and len(session.inflight) < session.window:
            self._send_inflight(session, conn, delivery)
            return
        if live and group is None and msg.device is not None and self.catchup is not None:
            # (no commit log here, in a cluster: a peer's logged message is queued as a copy)
            catchup = self.catchup
            if catchup.must_fall_behind(session) and catchup.fall_behind(session, msg):
                return  # the log holds it: the session reads it from there, no copy kept
            delivery.live = True
        self._enqueue(session, delivery)

    def _forwarder(self) -> Any:
        """The mesh in a cluster (set by the node wiring after the router is made), for the
        log reader (broker/cursors.py): logs other routers lead are read from them."""
        return self.forwarder

    def _enqueue(self, session: Session, delivery: Delivery) -> None:
        queue = session.own_queue()  # (made here on first use: broker/session.py NO_QUEUE)
        mqtt = self.mqtt
        size = delivery_bytes(delivery)
        over_bytes = self.limits.queue_bytes_full(session, size)
        if len(queue) >= mqtt.max_queued_messages or over_bytes:
            policy = mqtt.queue_full_policy
            if not over_bytes:
                self.limits.queue_full(session)  # (the bytes bound logs in queue_bytes_full)
            self.stats.dropped(DropReason.QUEUE_FULL)
            if policy is QueueFullPolicy.DROP_OLDEST:
                if not queue.make_room(size, mqtt.max_queued_bytes, self.stats):
                    return  # larger than the whole bound: only the new one can go
            elif policy is QueueFullPolicy.DROP_NEW:
                return
            else:
                if session.conn is not None:
                    log.warning("disconnecting client: queue full",
                                extra={"client_id": session.client_id})
                    session.conn.close(Reason.QUOTA_EXCEEDED)
                return
        queue.append(delivery)

    def _send_inflight(self, session: Session, conn: Connection, delivery: Delivery) -> None:
        delivery.pid = session.allocate_pid()
        delivery.state = Delivery.SENT
        inflight = session.inflight
        if inflight is NO_ENTRIES:  # its first delivery in flight (broker/session.py)
            inflight = session.own_inflight()
        inflight[delivery.pid] = delivery
        if not self._write_publish(session, conn, delivery):
            # too large for this client: "treated as if sent" [MQTT-3.1.2-25], never retried
            del session.inflight[delivery.pid]

    def _write_publish(self, session: Session, conn: Connection, d: Delivery,
                       dup: bool = False) -> bool:
        msg = d.msg
        v5 = conn.level == 5
        aliases = conn.out_aliases
        qos = d.qos
        if qos and not v5 and not dup and aliases is None:
            # a v3.x QoS 1/2 copy: the whole packet, packet id in place, in one C call (no
            # shape key, no (head, tail), no two concatenations; issue 25, logged QoS 1)
            encode = codec.c_publish_packet_pid  # (looked up here: tests switch it off)
            if encode is not None:
                data = encode(msg.topic, msg.payload,
                              0x30 | (qos << 1) | (1 if d.retain else 0), d.pid)
                limit = session.max_packet_size
                if limit and len(data) > limit:
                    self.stats.dropped(DropReason.TOO_LARGE)
                    return False
                conn.write(data)
                stats = self.stats
                stats.packets_out[_PUBLISH] += 1
                stats.messages_out += 1
                stats.messages_out_qos[qos] += 1
                return True
        if aliases is not None:
            head, tail = aliased_parts(d, aliases, session.alias_max)
        else:
            head, tail = msg.parts(v5, d.qos, d.retain, d.sub_ids, d.position)
        size = len(head) + len(tail) + (2 if d.qos else 0)
        if session.max_packet_size and size > session.max_packet_size:
            self.stats.dropped(DropReason.TOO_LARGE)
            return False
        if dup:
            head = bytes((head[0] | 0x08,)) + head[1:]
        if d.qos:
            conn.write(head + d.pid.to_bytes(2, "big") + tail)
        else:
            conn.write(head + tail)
        self.stats.packets_out[_PUBLISH] += 1
        self.stats.messages_out += 1
        self.stats.messages_out_qos[d.qos] += 1
        return True

    def _write_qos0(self, session: Session, conn: Connection, msg: Message, retain: bool,
                    sub_ids: tuple[int, ...] | None, position: bool) -> None:
        """``_write_publish`` for a live QoS 0 copy: nothing is kept of it (no ``Delivery``,
        no packet id), and the shape's whole packet is one shared bytes object (issue 25:
        the QoS 0 path's per-copy object and concatenation)."""
        aliases = conn.out_aliases
        if aliases is not None:
            head, tail = aliased_parts(Delivery(msg, 0, retain, sub_ids, None, position),
                                       aliases, session.alias_max)
            data = head + tail
        else:
            data = msg.packet0(conn.level == 5, retain, sub_ids, position)
        limit = session.max_packet_size
        if limit and len(data) > limit:
            self.stats.dropped(DropReason.TOO_LARGE)
            return
        conn.write(data)
        stats = self.stats
        stats.packets_out[_PUBLISH] += 1
        stats.messages_out += 1
        stats.messages_out_qos[0] += 1

    def _pump(self, session: Session) -> None:
        """Move queued deliveries into the window while the client can take them."""
        conn = session.conn
        if conn is None:
            return
        queue = session.queue
        if not queue:
            return
        inflight = session.own_inflight()  # filled below: not the shared empty map
        window = session.window
        now = time.monotonic()
        while queue and len(inflight) < window and not conn.congested:
            delivery = queue.popleft()
            if delivery.msg.expiry_at is not None and delivery.msg.expired(now):
                self.stats.dropped(DropReason.EXPIRED)
                continue
            self._send_inflight(session, conn, delivery)

    def _resend_inflight(self, session: Session, conn: Connection) -> None:
        """[MQTT-4.4.0-1]: on a resumed session, resend unacked PUBLISH (DUP=1) and PUBREL."""
        for delivery in list(session.inflight.values()):
            if delivery.state == Delivery.RELEASED:
                conn.send(PubRel(delivery.pid))
            elif not self._write_publish(session, conn, delivery, dup=True):
                del session.inflight[delivery.pid]

    def _window_freed(self, session: Session) -> None:
        """An ack ended a flow: refill the window from the queue, then from replay cursors."""
        if session.queue:
            self._pump(session)
        # max(1, ...): with Receive Maximum 1, window // 2 is 0 and replay never resumed.
        if session in self._replaying and len(session.queue) < max(1, session.window // 2):
            self._pump_replays(session)
        if session.lag_behind:
            self.catchup.pump(session)
        if session in self._retained_owed:
            self.retained_pacer.pump(session)


def merge(subs: list, msg: Message) -> dict[str, list]:
    """The subscriptions matching ``msg`` per session: one copy each, at the highest granted
    QoS, with every subscription identifier once [MQTT-3.3.4-3], retain-as-published if any
    asks, offsets if any replays; a No Local one of its publisher and a replay that has not
    reached live delivery yet left out. ``cid -> [qos, retain as published, ids, position]``."""
    merged: dict[str, list] = {}
    for cid, sub in subs:
        if sub.no_local and cid == msg.origin:
            continue
        if sub.replay is not None and not sub.replay.accept_live(msg):
            continue
        entry = merged.get(cid)
        if entry is None:
            merged[cid] = [sub.qos, sub.retain_as_published, [sub.sub_id],
                           sub.replay is not None]
        else:  # overlapping filters: one copy, max QoS, every subscription id
            if sub.qos > entry[0]:
                entry[0] = sub.qos
            entry[1] = entry[1] or sub.retain_as_published
            if sub.sub_id not in entry[2]:  # each identifier once [MQTT-3.3.4-3]
                entry[2].append(sub.sub_id)
            entry[3] = entry[3] or sub.replay is not None
    return merged
