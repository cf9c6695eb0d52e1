"""The QoS acks: PUBACK, PUBREC, PUBCOMP from subscribers and PUBREL from publishers; a room
of the router.

Why this cut: Mosquitto's ``handle_pubackcomp.c``, ``handle_pubrec.c`` and ``handle_pubrel.c``,
in one small file: each ends or advances one flow of a session's window and, when a flow ends,
refills the window through the delivery room (``_window_freed``). ``AckRoom`` is a mixin of
``Router`` (its methods run with the router as ``self``). The hottest of them, PUBACK, is
settled inline by the router's dispatch loop (``Router._handle_packets``: no call per ack; issue
25) and the window refilled once per read, not once per ack.
"""

from __future__ import annotations

from broker.connection import Connection
from broker.message import Delivery
from broker.protocol.packets import PacketType, PubComp, PubRec, PubRel
from broker.protocol.reasons import Reason

_PUBCOMP = PacketType.PUBCOMP


class AckRoom:
    """PUBACK, PUBREC, PUBREL, PUBCOMP (a mixin of ``Router``; see the module docstring)."""

    def _on_pubrec(self, conn: Connection, pkt: PubRec) -> None:
        session = conn.session
        if session is None:
            return
        delivery = session.inflight.get(pkt.packet_id)
        if delivery is None or delivery.qos != 2:
            if conn.level == 5:
                conn.send(PubRel(pkt.packet_id, Reason.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if pkt.reason_code >= 0x80:  # the subscriber refused it: the flow ends here
            del session.inflight[pkt.packet_id]
            self._window_freed(session)
            return
        delivery.state = Delivery.RELEASED
        conn.send(PubRel(pkt.packet_id))

    def _on_pubrel(self, conn: Connection, pkt: PubRel) -> None:
        session = conn.session
        if session is None:
            return
        if session.incoming_qos2.get(pkt.packet_id):
            del session.incoming_qos2[pkt.packet_id]
            conn.inbound_unacked -= conn.level == 5
            self.persist.stored(session, self._send_ack, conn, _PUBCOMP, pkt.packet_id)
        else:
            conn.send(PubComp(pkt.packet_id,
                              Reason.PACKET_IDENTIFIER_NOT_FOUND if conn.level == 5 else 0))

    def _on_pubcomp(self, conn: Connection, pkt: PubComp) -> None:
        session = conn.session
        if session is None:
            return
        delivery = session.inflight.get(pkt.packet_id)
        if delivery is not None and delivery.state == Delivery.RELEASED:
            del session.inflight[pkt.packet_id]
            self._window_freed(session)
