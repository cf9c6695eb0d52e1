"""SUBSCRIBE and UNSUBSCRIBE; a room of the router.

Why this cut: Mosquitto's ``handle_subscribe.c`` / ``handle_unsubscribe.c``. A SUBSCRIBE here
checks each filter (validity, No Local on shares, depth, shared and wildcard support, ACL), adds
it to the session and the trie, opens offset replays (``broker/replay.py``; an owner router asked
first in a cluster), and answers once a persistent session's subscriptions are stored, then
sends retained messages through the delivery room. ``SubscribeRoom`` is a mixin of ``Router``
(its methods run with the router as ``self``).
"""

from __future__ import annotations

import logging

from broker.connection import Connection
from broker.devicelogs import offset_request
from broker.limits import too_many_levels
from broker.message import Message
from broker.protocol.errors import ProtocolError
from broker.protocol.packets import Suback, Subscribe, Unsuback, Unsubscribe
from broker.protocol.properties import Prop
from broker.protocol.reasons import SUBACK_FAILURE_V3, Reason
from broker.protocol.topics import has_wildcards, is_valid_topic_filter, parse_shared
from broker.session import Session, Subscription

log = logging.getLogger("broker.router")  # the router's log lines keep the router's name


class SubscribeRoom:
    """SUBSCRIBE and UNSUBSCRIBE (a mixin of ``Router``; see the module docstring)."""

    def _on_subscribe(self, conn: Connection, pkt: Subscribe) -> None:
        session = conn.session
        if session is None:
            return
        mqtt = self.mqtt
        v5 = conn.level == 5
        sub_id = None
        if pkt.properties:
            ids = pkt.properties.get(Prop.SUBSCRIPTION_IDENTIFIER)
            if ids:
                sub_id = ids[0]
        codes: list[int] = []
        retained_out: list[tuple[str, Subscription, list[Message]]] = []
        replays: list[Subscription] = []
        reasons: list[str] = []
        resolving: list[tuple[int, str, Subscription, Subscription | None]] = []
        offset_req, reset = offset_request(pkt.properties)
        for flt, opts in pkt.subscriptions:
            sub_offset = offset_req
            if flt.startswith("$replay/"):
                # 3.1.1 has no user properties: "$replay/{offset}/{filter}" asks the same thing
                _, sub_offset, flt = (flt.split("/", 2) + ["", ""])[:3]
                key_flt = "$replay/" + sub_offset + "/" + flt
            else:
                key_flt = flt
            group, real = parse_shared(flt)
            if not is_valid_topic_filter(flt):
                if not v5 or not flt:
                    # 3.1.1: a protocol violation closes the connection [MQTT-4.8.0-1]; an empty
                    # filter is malformed in v5 too [MQTT-4.7.3-1], not merely not allowed (0x8F)
                    self.protocol_error(conn, ProtocolError(
                        Reason.PROTOCOL_ERROR if v5 else Reason.TOPIC_FILTER_INVALID,
                        f"invalid topic filter {flt!r}"))
                    return
                codes.append(Reason.TOPIC_FILTER_INVALID)
                continue
            if group is not None and opts.no_local:
                # [MQTT-3.8.3-4]: No Local on a shared subscription is a protocol error
                self.protocol_error(conn, ProtocolError(Reason.PROTOCOL_ERROR,
                                                        "no local on a shared subscription"))
                return
            if too_many_levels(real, mqtt.max_topic_levels):
                reasons.append("filter: " + self.limits.deep_topic(conn, real))
                codes.append(Reason.TOPIC_FILTER_INVALID if v5 else SUBACK_FAILURE_V3)
                continue
            if group is not None and not mqtt.shared_subscriptions:
                codes.append(Reason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if v5 else SUBACK_FAILURE_V3)
                continue
            if not mqtt.wildcard_subscriptions and has_wildcards(real):
                codes.append(Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED if v5
                             else SUBACK_FAILURE_V3)
                continue
            acl = self._acl
            if acl is not None and not self._allowed(
                    "subscribe", acl.can_subscribe(conn.username, conn.client_id, real)):
                log.info("subscribe denied by ACL", extra={"client_id": conn.client_id,
                                                           "filter": flt})
                codes.append(Reason.NOT_AUTHORIZED if v5 else SUBACK_FAILURE_V3)
                continue
            granted = min(opts.qos, mqtt.max_qos)
            sub = Subscription(real, granted, opts.no_local, opts.retain_as_published,
                               opts.retain_handling, sub_id, group)
            if sub_offset is not None:
                cursor, why = (self.logs.open_cursor(real, group, sub_offset, reset)
                               if self.logs is not None else
                               (None, "offset replay needs the commit log, which is disabled"))
                if cursor is None:
                    reasons.append(why)
                    codes.append(Reason.IMPLEMENTATION_SPECIFIC_ERROR if v5
                                 else SUBACK_FAILURE_V3)
                    continue
                sub.replay = cursor
                replays.append(sub)
            old = session.subscriptions.get(key_flt)
            if sub.replay is not None and sub.replay.owner is not None:
                resolving.append((len(codes), key_flt, sub, old))
            is_new = old is None
            if old is not None:
                sub.since_us = old.since_us  # a resubscribe keeps what the session is owed
            session.has_no_local = session.has_no_local or opts.no_local
            session.own_subscriptions()[key_flt] = sub
            self.trie.add(real, session.client_id, sub, group)
            codes.append(granted)
            if sub.replay is not None:
                continue  # history comes from the log, not from the retained store
            # [MQTT-3.3.1-9..11]: retained messages on subscribe, per Retain Handling; never
            # for shared subscriptions [MQTT-3.8.4-? / v5 4.8.2].
            if group is None and (opts.retain_handling == 0
                                  or (opts.retain_handling == 1 and is_new)):
                found = self.retained.match(real)
                if found:
                    retained_out.append((key_flt, sub, found))
        if resolving:  # offset replays of logs other routers own: they say where each starts
            self.replays.resolve(conn, session, resolving, codes, reasons, replays,
                                        lambda: self._suback(conn, session, pkt.packet_id, codes,
                                                             reasons, retained_out, replays))
            return
        self._suback(conn, session, pkt.packet_id, codes, reasons, retained_out, replays)

    def _suback(self, conn: Connection, session: Session, packet_id: int, codes: list[int],
                reasons: list[str], retained_out: list[tuple[str, Subscription, list[Message]]],
                replays: list[Subscription]) -> None:
        props = ({Prop.REASON_STRING: "; ".join(reasons)} if reasons and conn.level == 5
                 else None)
        # a persistent session's subscriptions are committed in the cluster's session
        # registry too before the SUBACK (broker/registry.py): resumable on any node
        store = self.persist.stored if self.registry is None else self.registry.stored
        store(session, self._subscribed, conn, session, Suback(packet_id, codes, props),
              retained_out, replays)

    def _subscribed(self, conn: Connection, session: Session, suback: Suback,
                    retained_out: list[tuple[str, Subscription, list[Message]]],
                    replays: list[Subscription]) -> None:
        """SUBACK (once a persistent session's subscriptions are stored), then retained."""
        conn.send(suback)
        if retained_out:  # paced by the window, never dropped for room (broker/retainpace.py)
            pacer = self.retained_pacer
            for key, sub, messages in retained_out:
                pacer.add(session, key, sub.qos, (sub.sub_id,) if sub.sub_id else None,
                          messages)
            pacer.pump(session)
        if replays:
            self._replaying.add(session)
            self._pump_replays(session)

    def _on_unsubscribe(self, conn: Connection, pkt: Unsubscribe) -> None:
        session = conn.session
        if session is None:
            return
        for flt in pkt.topic_filters:
            if not is_valid_topic_filter(flt):
                # [MQTT-4.7.3-1], [MQTT-4.7.1-2]: malformed; 3.1.1 closes [MQTT-4.8.0-1], v5
                # sends DISCONNECT 0x82 (a well-formed filter is never refused here).
                self.protocol_error(conn, ProtocolError(
                    Reason.PROTOCOL_ERROR, f"invalid topic filter {flt!r} in UNSUBSCRIBE"))
                return
        codes = []
        for flt in pkt.topic_filters:
            sub = session.subscriptions.pop(flt, None)
            if sub is None:
                codes.append(Reason.NO_SUBSCRIPTION_EXISTED)
                continue
            self.trie.remove(sub.filter, session.client_id, sub.group)
            codes.append(Reason.SUCCESS)
            if sub.group is not None:
                self.shared.redispatch(session, only_group=sub)
        store = self.persist.stored if self.registry is None else self.registry.stored
        store(session, conn.send, Unsuback(pkt.packet_id, codes if conn.level == 5 else []))
