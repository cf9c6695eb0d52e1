"""A client's PUBLISH: the checks before anything is stored or routed; a room of the router.

Why this cut: Mosquitto's ``handle_publish.c`` does the same (QoS and retain allowed, the QoS 2
duplicate, Receive Maximum, topic depth, ACL), then hands the message on; here it goes to the
ingest room (``broker/ingest.py``: log or route, append, ack once durable) or, for a device log
another router owns, to ``forwarding.RemotePublishes``. ``PublishRoom`` is a mixin of ``Router``
(its methods run with the router as ``self``; part of the router's own implementation).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from broker.connection import Connection
from broker.ingest import forwarded_properties
from broker.message import Message, new_message
from broker.protocol.errors import ProtocolError
from broker.protocol.packets import Publish, PubRec
from broker.protocol.properties import Prop
from broker.protocol.reasons import Reason
from broker.pubdedupe import message_id, publisher_id
from broker.stats import DropReason
from broker.writegate import refuse

log = logging.getLogger("broker.router")  # the router's log lines keep the router's name


class PublishRoom:
    """PUBLISH from a client (a mixin of ``Router``; see the module docstring)."""

    def _gated(self, gate: Any, logs: Any, key: str, msg: Message, conn: Connection,
               pkt: Publish, expiry: int | None) -> bool:
        """Whether the write gate took the publish: held (a Raft election: stored when the
        gate opens, broker/gatehold.py) or refused (cut off from the Raft majority)."""
        refusal = gate()
        held = self.gate_held
        if refusal is None:
            if held.items:  # the gate opened before its news came: the held ones first
                held.opened()
            return False
        if not held.hold(conn, refusal, lambda: self._store_publish(logs, key, msg, conn,
                                                                    pkt, expiry), bool(msg.qos)):
            if not msg.qos:
                return False  # QoS 0 is never refused by the gate: stored now
            refuse(conn, refusal)
        return True

    def _store_publish(self, logs: Any, key: str, msg: Message, conn: Connection,
                       pkt: Publish, expiry: int | None) -> None:
        """A publish to a device log, past every check: to its leader, or appended here."""
        owner = self.forwarder.owner_of(key) if self.forwarder is not None else None
        if owner is not None:
            self.remote.append_at_owner(owner, key, msg, conn, pkt.packet_id, expiry)
            return
        self._append(logs, key, msg, conn, pkt, expiry)

    def _on_publish(self, conn: Connection, pkt: Publish) -> None:
        session = conn.session
        if session is None:
            return
        qos = pkt.qos
        mqtt = self.mqtt
        if qos > mqtt.max_qos:
            self.protocol_error(conn, ProtocolError(Reason.QOS_NOT_SUPPORTED,
                                                    f"QoS {qos} above the server maximum"))
            return
        if pkt.retain and not mqtt.retain_available:
            self.protocol_error(conn, ProtocolError(Reason.RETAIN_NOT_SUPPORTED,
                                                    "retain is not available"))
            return
        if qos == 2 and pkt.packet_id in session.incoming_qos2:
            # a resent QoS 2 PUBLISH we already own: acknowledge again (once stored), deliver
            # nothing new [MQTT-4.3.3-10]
            if session.incoming_qos2[pkt.packet_id]:
                conn.send(PubRec(pkt.packet_id))
            return
        if qos and conn.level == 5:
            # Receive Maximum is enforced for QoS 2 only, whose state we keep until PUBREL. A
            # QoS 1 publisher that pipelines past it (MQTT.js, paho with a raised max_inflight)
            # is served, as by Mosquitto, which acks QoS 1 at once: our acks wait for fsync,
            # and memory stays bounded by HELD_LIMIT pausing publishers' sockets.
            conn.inbound_unacked += 1
            if qos == 2 and len(session.incoming_qos2) >= mqtt.receive_maximum:
                self.protocol_error(conn, ProtocolError(Reason.RECEIVE_MAXIMUM_EXCEEDED,
                                                        "receive maximum exceeded"))
                return
        if pkt.topic.count("/") >= mqtt.max_topic_levels:  # limits.too_many_levels, inline
            self._refuse_deep_publish(conn, pkt)
            return
        acl = self._acl
        if acl is not None and not self._allowed(
                "publish", acl.can_publish(conn.username, conn.client_id, pkt.topic)):
            self.stats.dropped(DropReason.NOT_AUTHORIZED)
            log.info("publish denied by ACL", extra={"client_id": conn.client_id,
                                                     "topic": pkt.topic})
            self.ack_publish(conn, pkt.qos, pkt.packet_id,
                             Reason.NOT_AUTHORIZED if conn.level == 5 else 0)
            return
        self.stats.messages_in += 1
        self.stats.messages_in_qos[qos] += 1
        props = pkt.properties
        expiry_at = None
        if props:
            interval = props.get(Prop.MESSAGE_EXPIRY_INTERVAL)
            if interval is not None:
                expiry_at = time.monotonic() + interval
            props = forwarded_properties(props)
        msg = new_message(pkt.topic, pkt.payload, qos, pkt.retain, props, expiry_at, conn.client_id)
        logs = self.logs
        if logs is not None:
            key = logs.key_for(pkt.topic, pkt.retain)
            if key is not None:
                if qos and logs.dedupe is not None:
                    # who published it, kept in its record, and whether its log's leader looks
                    # for an earlier copy first: a resend (broker/pubdedupe.py)
                    msg.publisher = publisher_id(session, pkt.packet_id)
                    if pkt.dup or (props and message_id(props) is not None):
                        msg.maybe_stored = True
                gate = self.write_gate
                # QoS 0 only behind this connection's held publishes (broker/gatehold.py):
                # ``per_conn`` is empty but for the moment an election takes
                if gate is not None and (qos or (self.gate_held.per_conn
                                                 and self.gate_held.holds(conn))) \
                        and self._gated(gate, logs, key, msg, conn, pkt,
                                        interval if expiry_at else None):
                    return
                # _store_publish, inline: the logged publish's hot path (cost guard)
                owner = self.forwarder.owner_of(key) if self.forwarder is not None else None
                if owner is not None:
                    self.remote.append_at_owner(owner, key, msg, conn, pkt.packet_id,
                                                interval if expiry_at else None)
                    return
                self._append(logs, key, msg, conn, pkt, interval if expiry_at else None)
                return
        if pkt.retain:
            self.retain(msg)
        self.route(msg)
        if qos:
            self.ack_publish(conn, qos, pkt.packet_id, 0)

    def _refuse_deep_publish(self, conn: Connection, pkt: Publish) -> None:
        """Over max_topic_levels: nothing stored or routed (codes: broker/limits.py)."""
        why = self.limits.deep_topic(conn, pkt.topic)
        self.stats.dropped(DropReason.TOPIC_LEVELS)
        if conn.level == 5 and pkt.qos:
            self.ack_publish(conn, pkt.qos, pkt.packet_id, Reason.TOPIC_NAME_INVALID,
                             {Prop.REASON_STRING: why})
            return
        self.protocol_error(conn, ProtocolError(Reason.TOPIC_NAME_INVALID, why))
