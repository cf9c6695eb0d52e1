"""The write gate: a router may be told to refuse QoS>=1 publishes to device logs for a while
(a cluster router whose leader lease ran out: cluster/lease.py), and how it refuses them.

``broker/`` never imports ``cluster/``: the node wiring sets ``Router.write_gate`` to a
callable answering None (publish as usual) or a refusal with ``reason`` (str) and
``server_reference`` (str or None). The publish room asks it for every QoS>=1 publish that
goes to a device log (the ones a PUBACK promises are committed), before anything is stored.

How a refusal reaches the client: MQTT 5 has no PUBACK reason "use another server" (0x9C is
valid in CONNACK and DISCONNECT only), so a v5 client gets DISCONNECT 0x9C Use another server
with the reason string and, when the cluster knows one, a Server Reference (MQTT 5, 4.11);
a 3.x client has its connection closed (its only "not stored" signal). Nothing is stored or
acknowledged, so the client's resend after reconnecting is the only copy.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.connection import Connection
from broker.lograte import RateLimitedLog
from broker.protocol.packets import Disconnect
from broker.protocol.properties import Prop
from broker.protocol.reasons import Reason

log = logging.getLogger("broker.router")
_log_refused = RateLimitedLog(log, logging.WARNING, "publishes refused by the write gate",
                              burst=5, window=5.0)


def refuse(conn: Connection, refusal: Any) -> None:
    """Close ``conn`` for ``refusal`` (see the module docstring); the publish is dropped."""
    reason: str = refusal.reason
    reference: str | None = refusal.server_reference
    counted = getattr(refusal, "on_refused", None)
    if counted is not None:
        counted()
    conn.close_reason = f"publish refused: {reason}"
    _log_refused("QoS>=1 publish refused, connection closed: %s", reason,
                     extra={"client_id": conn.client_id, "peer": conn.peer,
                            "server_reference": reference})
    if conn.level == 5 and conn.session is not None and not conn.closing:
        props: dict = {Prop.REASON_STRING: reason}
        if reference:
            props[Prop.SERVER_REFERENCE] = reference
        conn.send(Disconnect(reason_code=Reason.USE_ANOTHER_SERVER, properties=props))
    conn.close(None, drain=True)
