"""A QoS 2 publish whose owner's outcome arrives after its connection closed (review of the
merged ``outcomes`` branch, issue 28).

A v5 client with a persistent session publishes QoS 2 on a device log another router owns, and
its connection dies before the owner answers (the owner frozen: SIGSTOP). The session keeps the
packet id as "pending" (``incoming_qos2[pid] = False``), and the client, reconnected, resends the
PUBLISH with the same packet id [MQTT-4.4.0-1]. Whatever the outcome (refused at
``cluster.append_timeout``, or stored once the owner wakes up), the resend must be answered with
a PUBREC: before the fix the outcome went to the closed connection only, the packet id stayed
pending in the session forever, and every resend of it was swallowed without an answer (the
client hung on that packet id; the receive maximum leaked one slot per occurrence).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all

pytestmark = pytest.mark.timeout(240)
PERSISTENT = {R.SESSION_EXPIRY_INTERVAL: 300}


def _resumed(raw, node, client_id: str) -> R.RawClient:
    c = raw(node, version=5)
    ack = c.connect(client_id, clean=False, properties=PERSISTENT)
    assert ack.session_present, f"the session was not resumed: {ack!r}"
    return c


def _first_publish(raw, node, client_id: str, topic: str) -> None:
    """Connect with a persistent session, publish QoS 2 pid 7, and drop the connection
    without waiting for its PUBREC (the owner is frozen)."""
    first = raw(node, version=5)
    first.connect(client_id, clean=False, properties=PERSISTENT)
    first.send(R.publish(topic, b"q2", qos=2, packet_id=7, version=5))
    first.abort()


@pytest.mark.parametrize("timeout", [1.0, 600.0], ids=["refused", "stored-late"])
def test_a_qos2_resend_after_reconnect_is_answered_whatever_the_owner_says(
        tmp_path: Path, raw, timeout: float) -> None:
    mesh = Cluster(tmp_path, n=2, overrides={"cluster": {"append_timeout": timeout}}).start()
    try:
        n0, n1 = mesh.nodes
        device = mesh.device_owned_by(1, unique("q2r"))
        topic = f"devices/{device}/t"
        client_id = unique("q2resume")
        warm = raw(n0, version=5)
        warm.connect(unique("warm"))
        warm.send(R.publish(topic, b"before", qos=1, packet_id=1, version=5))
        assert warm.expect(R.PUBACK, timeout=30).reason_code == 0
        owner = mesh.router_pid(1)
        os.kill(owner, signal.SIGSTOP)
        try:
            _first_publish(raw, n0, client_id, topic)
            wait_for(lambda: mesh.link(0, 1)["awaiting_outcome"] >= 1, 30,
                     message="the APPEND sent to the frozen owner")
            if timeout < 10:
                wait_for(lambda: n0.metric("meshmq_link_append_timeouts_total",
                                           peer="n1/0") >= 1, 60,
                         message="the publish refused at cluster.append_timeout")
            again = _resumed(raw, n0, client_id)
            again.send(R.publish(topic, b"q2", qos=2, dup=True, packet_id=7, version=5))
            if timeout > 10:  # the resend waits on the first one's outcome: wake the owner
                os.kill(owner, signal.SIGCONT)
            rec = again.expect(R.PUBREC, timeout=60)
        finally:
            os.kill(owner, signal.SIGCONT)
        assert rec.packet_id == 7, rec
        if timeout > 10:
            assert rec.reason_code == 0, f"stored, yet refused: {rec!r}"
        else:
            assert rec.reason_code == 0x80, f"refused (owner frozen), yet: {rec!r}"
        # the flow completes, and the packet id is free for a new message
        if rec.reason_code == 0:
            again.send(R.pubrel(7))
            assert again.expect(R.PUBCOMP, timeout=30).reason_code == 0
        again.send(R.publish(topic, b"next", qos=2, packet_id=7, version=5))
        rec2 = again.expect(R.PUBREC, timeout=60)
        assert rec2.reason_code == 0, rec2
        again.send(R.pubrel(7))
        assert again.expect(R.PUBCOMP, timeout=30).reason_code == 0
        stored = [bytes(r.payload) for r in fetch_all(n1, device)]
        assert stored[0] == b"before" and stored[-1] == b"next", stored
        if timeout > 10:
            assert stored.count(b"q2") == 1, f"acknowledged once, stored: {stored}"
    finally:
        mesh.stop()


def test_a_311_qos2_publish_refused_by_disconnect_can_be_resent(tmp_path: Path, raw) -> None:
    """3.1.1 has no negative PUBREC: a QoS 2 publish the owner did not confirm within
    cluster.append_timeout closes the connection, and the client resends it after reconnecting
    with its session. Before the fix the refusal closed the connection but left the packet id
    pending in the session, so that resend was swallowed for good: never stored, never
    answered."""
    mesh = Cluster(tmp_path, n=2, overrides={"cluster": {"append_timeout": 1.0}}).start()
    try:
        n0, n1 = mesh.nodes
        device = mesh.device_owned_by(1, unique("q2v4"))
        topic = f"devices/{device}/t"
        client_id = unique("q2v4pub")
        first = raw(n0, version=4)
        first.connect(client_id, clean=False)
        first.send(R.publish(topic, b"warm", qos=1, packet_id=1))
        assert first.expect(R.PUBACK, timeout=30).packet_id == 1
        owner = mesh.router_pid(1)
        os.kill(owner, signal.SIGSTOP)
        try:
            first.send(R.publish(topic, b"q2", qos=2, packet_id=7))
            got = first.wait_closed(timeout=60)
            assert not [p for p in got if p.type == R.PUBREC], f"a refused publish: {got}"
        finally:
            os.kill(owner, signal.SIGCONT)
        again = raw(n0, version=4)
        ack = again.connect(client_id, clean=False)
        assert ack.session_present, ack
        again.send(R.publish(topic, b"q2", qos=2, dup=True, packet_id=7))
        rec = again.expect(R.PUBREC, timeout=60)
        assert rec.packet_id == 7, rec
        again.send(R.pubrel(7))
        assert again.expect(R.PUBCOMP, timeout=30).packet_id == 7
        stored = [bytes(r.payload) for r in fetch_all(n1, device)]
        assert stored[0] == b"warm" and b"q2" in stored, stored
    finally:
        mesh.stop()
