"""CONNECT, and the other packets that open, keep or close a connection (PINGREQ, AUTH,
DISCONNECT): a room of the router (``broker/router.py``).

Why this cut: Mosquitto keeps one file per packet kind (``handle_connect.c``,
``handle_disconnect.c``, ...) so that a reader looking for what a packet does opens one file;
CONNECT is the longest of them here (auth off the loop, clientid rules, the cluster claim,
takeover, session resume, CONNACK properties) and deserves its own. ``ConnectRoom`` is a mixin of
``Router``: its methods run with the router as ``self`` and are part of the router's own
implementation (they may use its private names; nothing outside the router's files may, see
``broker/port.py``). It calls down only: into the delivery room (resend, pump) and the session
end room (``end_session``), the ingest room (``publish_will``) and the engines.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from broker.authgate import THROTTLED, THROTTLED_WHY, refusal_text
from broker.connection import Connection, guarded
from broker.devicelogs import wants_ack_offsets
from broker.limits import too_many_levels
from broker.protocol.errors import ProtocolError
from broker.protocol.packets import Connack, Connect, Disconnect, Packet, PingResp
from broker.protocol.properties import Prop
from broker.protocol.reasons import Reason, v3_connack_code
from broker.pubdedupe import new_session_epoch
from broker.session import NEVER, Session

log = logging.getLogger("broker.router")  # the router's log lines keep the router's name


class ConnectRoom:
    """CONNECT, PINGREQ, AUTH and DISCONNECT (a mixin of ``Router``; see the module docstring)."""

    def _on_connect(self, conn: Connection, pkt: Connect, rest: list[Packet]) -> None:
        conn.level = pkt.protocol_level
        conn.username = pkt.username
        conn.client_id = pkt.client_id or None  # for log lines about a refused CONNECT
        if not self.accepting:
            self._refuse(conn, Reason.SERVER_UNAVAILABLE, "server is shutting down")
            return
        gate = self._gate
        if conn.trusted:  # the node's own bridge session (broker/connection.py): no password
            gate = None
        if gate is not None and pkt.password is not None:
            # scrypt (~50 ms) off the loop, through the gate (bounded, lockouts: authgate.py)
            conn.pending = list(rest)
            conn.transport.pause_reading()
            code = gate.submit(conn.peer_host, pkt.username, pkt.password,
                               lambda c: guarded(self.stats, conn, self._connect_authenticated,
                                                 conn, pkt, c),
                               lambda: not conn.closing)
            if code is not None:  # locked out: refused without a password check
                conn.pending = None
                self.finish_connect(conn, pkt, code)
            return
        code = self.auth.authenticate(pkt.username, pkt.password) if (
            self.auth and not conn.trusted) else 0
        if self.registry is not None and not code and self.registry.claim(conn, pkt, rest):
            return  # the CONNACK waits for the claim's commit in Raft (broker/registry.py)
        if self.forwarder is not None and not code and self.sessions_remote.claim(conn, pkt, rest):
            return  # the client id's other routers answer first (broker/forwarding.py)
        self.finish_connect(conn, pkt, code)
        if rest and conn.session is not None:
            self.handle_packets(conn, rest)

    def _connect_authenticated(self, conn: Connection, pkt: Connect, code: int) -> None:
        if conn.closing:
            return
        pending, conn.pending = conn.pending or [], None
        if self.registry is not None and not code and self.registry.claim(conn, pkt, pending):
            return
        if self.forwarder is not None and not code and self.sessions_remote.claim(conn, pkt,
                                                                                 pending):
            return
        self.finish_connect(conn, pkt, code)
        if conn.session is not None and not conn.closing:
            conn.transport.resume_reading()
            if pending:
                self.handle_packets(conn, pending)

    def _refuse(self, conn: Connection, reason: int, why: str) -> None:
        conn.listener.rejected += 1
        # what was tried, never the password
        log.info("connection refused: %s", why,
                 extra={"client_id": conn.client_id, "username": conn.username,
                        "peer": conn.peer, "reason_code": reason})
        if conn.level == 5:
            conn.send(Connack(reason_code=reason, properties={Prop.REASON_STRING: why}))
        else:
            conn.send(Connack(reason_code=v3_connack_code(reason)))
        conn.close()

    def finish_connect(self, conn: Connection, pkt: Connect, auth_code: int) -> None:
        mqtt = self.mqtt
        v5 = pkt.protocol_level == 5
        props = pkt.properties or {}
        if auth_code:
            self.stats.auth_failures += 1
            if auth_code == THROTTLED:
                self.limits.hit("max_failures", THROTTLED_WHY, peer=conn.peer,
                                username=pkt.username)
            self._refuse(conn, auth_code, refusal_text(auth_code))
            return
        if Prop.AUTHENTICATION_METHOD in props:
            self._refuse(conn, Reason.BAD_AUTHENTICATION_METHOD,
                         "enhanced authentication is not supported")
            return
        will = pkt.will
        if will is not None and will.qos > mqtt.max_qos:
            # [MQTT-3.2.2-12]
            self._refuse(conn, Reason.QOS_NOT_SUPPORTED,
                         f"will QoS {will.qos} is above the server maximum {mqtt.max_qos}")
            return
        if will is not None and will.retain and not mqtt.retain_available:
            # [MQTT-3.2.2-13]
            self._refuse(conn, Reason.RETAIN_NOT_SUPPORTED, "retained wills are not available")
            return
        if will is not None and too_many_levels(will.topic, mqtt.max_topic_levels):
            self._refuse(conn, Reason.TOPIC_NAME_INVALID,
                         "will " + self.limits.deep_topic(conn, will.topic))
            return
        client_id = pkt.client_id
        ack_props: dict[int, Any] = {}
        if not client_id and (named := self.clientids.default_id(pkt.username)):
            client_id = named
            if v5:
                ack_props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        if not client_id:
            if not mqtt.allow_zero_length_client_id or (not v5 and not pkt.clean_start):
                # [MQTT-3.1.3-8]: 3.1.1 empty id with clean session 0 → return code 2
                self._refuse(conn, Reason.CLIENT_IDENTIFIER_NOT_VALID,
                             "an empty client id needs clean start")
                return
            client_id = "auto-" + uuid.uuid4().hex
            if v5:
                ack_props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        conn.client_id = client_id
        # auth.clientid_rule; with passwords, a session is taken only by its own user (clientid.py)
        refused = self.clientids.connect_refusal(client_id, pkt.username, self.sessions,
                                                 self._slow_auth)
        if refused is None and client_id.startswith("$bridge/") and not conn.trusted:
            # the node's bridges' own sessions (their outbound positions): no client takes one
            refused = (Reason.CLIENT_IDENTIFIER_NOT_VALID,
                       "client ids starting with $bridge/ are reserved for the broker's bridges")
        if refused is None and will is not None and self._acl is not None \
                and not self._acl.can_publish(pkt.username, client_id, will.topic):
            # A will is a PUBLISH made on the client's behalf later: authorised now, as Mosquitto
            # does, so a refused will fails the CONNECT instead of vanishing when it is due.
            refused = (Reason.NOT_AUTHORIZED, f"not authorised to publish the will topic "
                                              f"{will.topic!r}")
        if refused is not None:
            self.stats.auth_failures += 1
            self._refuse(conn, *refused)
            return

        # Session expiry: v5 property (default 0); 3.1.1 clean session 0 means "keep forever".
        if v5:
            expiry = props.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
        else:
            expiry = 0 if pkt.clean_start else NEVER
        if mqtt.max_session_expiry and (expiry == NEVER or expiry > mqtt.max_session_expiry):
            expiry = mqtt.max_session_expiry
            if v5:
                ack_props[Prop.SESSION_EXPIRY_INTERVAL] = expiry

        keepalive = pkt.keepalive
        if mqtt.max_keepalive and (keepalive == 0 or keepalive > mqtt.max_keepalive):
            keepalive = mqtt.max_keepalive
            if v5:
                ack_props[Prop.SERVER_KEEP_ALIVE] = keepalive
        conn.keepalive = keepalive

        # Takeover [MQTT-3.1.4-3]: the old connection is told (v5 0x8E) and closed.
        session = self.sessions.get(client_id)
        # A session whose expiry is 0 (3.1.1 CleanSession=1) ends with its connection: a takeover
        # must not resume it [MQTT-3.1.2-6], [MQTT-3.2.2-2], v5 3.1.2.11.2.
        ends = session is not None and (pkt.clean_start or session.expiry_interval == 0)
        if session is not None and session.conn is not None:
            old = session.conn
            session.conn = None
            log.info("session taken over", extra={"client_id": client_id, "peer": conn.peer,
                                                    "old_peer": old.peer})
            old.close_reason = f"session taken over by {conn.peer}"
            if old.will is not None and (old.will_delay == 0 or ends):
                self.publish_will(old.will)
            old.will = None
            old.close(Reason.SESSION_TAKEN_OVER)

        session_present = False
        if ends:
            self.end_session(session)
            session = None
        if session is None:
            session = Session(client_id, pkt.protocol_level)
            if pkt.clean_start:  # a new incarnation: its resends never match an older one's
                session.epoch = new_session_epoch()  # (broker/pubdedupe.py)
            self.sessions[client_id] = session
        else:
            session_present = True
            # within the will delay: cancelled; after it (not swept yet): published
            if (due := session.resume_will(time.monotonic())) is not None:
                self.publish_will(due)
        session.level = pkt.protocol_level
        session.username = pkt.username
        session.expiry_interval = expiry
        session.expires_at = None
        session.window = min(mqtt.max_inflight, props.get(Prop.RECEIVE_MAXIMUM, 65535))
        session.max_packet_size = props.get(Prop.MAXIMUM_PACKET_SIZE, 0)
        session.alias_max = props.get(Prop.TOPIC_ALIAS_MAXIMUM, 0)
        conn.out_aliases = {} if session.alias_max else None
        if pkt.will is not None:
            conn.will = pkt.will
            conn.will_delay = (pkt.will.properties or {}).get(Prop.WILL_DELAY_INTERVAL, 0)
        conn.session = session
        session.conn = conn
        conn.proto.forget_connect()  # what is kept of it is above; the packet is not
        self._connected += 1
        if self._connected > self.stats.clients_connected_max:
            self.stats.clients_connected_max = self._connected
        conn.ack_offsets = v5 and wants_ack_offsets(props, mqtt.ack_offsets)
        self.limits.offline.back(session)
        self.persist.connected(session)

        if v5:
            ack_props[Prop.RECEIVE_MAXIMUM] = mqtt.receive_maximum
            ack_props[Prop.MAXIMUM_PACKET_SIZE] = mqtt.max_packet_size
            ack_props[Prop.TOPIC_ALIAS_MAXIMUM] = mqtt.topic_alias_maximum
            if mqtt.max_qos < 2:
                ack_props[Prop.MAXIMUM_QOS] = mqtt.max_qos
            if not mqtt.retain_available:
                ack_props[Prop.RETAIN_AVAILABLE] = 0
            if not mqtt.wildcard_subscriptions:
                ack_props[Prop.WILDCARD_SUBSCRIPTION_AVAILABLE] = 0
            if not mqtt.shared_subscriptions:
                ack_props[Prop.SHARED_SUBSCRIPTION_AVAILABLE] = 0
        conn.send(Connack(session_present=session_present, reason_code=0,
                          properties=ack_props or None))
        # INFO like Mosquitto's "New client connected": who, from where, how. "protocol_level",
        # not "level": JSON logs use that key for the log level.
        log.info("client connected", extra={
            "client_id": client_id, "username": pkt.username, "peer": conn.peer,
            "protocol_level": pkt.protocol_level, "keepalive": keepalive,
            "clean_start": pkt.clean_start, "session_present": session_present})
        if session_present:
            self._resend_inflight(session, conn)
            self._pump(session)
            self._pump_replays(session)
            if session.lag_behind:
                self.catchup.pump(session)
            self.retained_pacer.pump(session)  # retained messages still owed on SUBSCRIBE

    def _on_pingreq(self, conn: Connection, _pkt: Packet) -> None:
        conn.send(PingResp())

    def _on_auth(self, conn: Connection, _pkt: Packet) -> None:
        self.protocol_error(conn, ProtocolError(Reason.PROTOCOL_ERROR,
                                                "AUTH without enhanced authentication"))

    def _on_disconnect(self, conn: Connection, pkt: Disconnect) -> None:
        session = conn.session
        if session is None:
            return
        if conn.level == 5 and pkt.properties:
            expiry = pkt.properties.get(Prop.SESSION_EXPIRY_INTERVAL)
            if expiry is not None:
                if session.expiry_interval == 0 and expiry != 0:
                    # [MQTT-3.14.2-2]
                    self.protocol_error(conn, ProtocolError(
                        Reason.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0"))
                    return
                if self.mqtt.max_session_expiry and expiry > self.mqtt.max_session_expiry:
                    expiry = self.mqtt.max_session_expiry
                session.expiry_interval = expiry
        # 0x04 "disconnect with will message" keeps the will; anything else discards it.
        conn.clean_disconnect = pkt.reason_code != Reason.DISCONNECT_WITH_WILL
        conn.close_reason = f"client sent DISCONNECT (reason 0x{pkt.reason_code:02X})"
        if conn.clean_disconnect:
            conn.will = None
        conn.close()
