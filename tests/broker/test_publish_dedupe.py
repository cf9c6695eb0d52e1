"""Publisher dedupe on one node (issue 24, broker/pubdedupe.py): a QoS 1/2 publish resent with
DUP=1 after its connection (or the broker) was lost before the PUBACK/PUBREC is stored once.

Each test makes the first copy be stored without its publisher hearing so: it sends the
PUBLISH, never reads the ack, waits until the fetch API shows the record (committed: the
condition, not a sleep), drops its socket, reconnects with clean_start = false and resends the
same packet id with DUP=1, as paho and every other client does. The log must then hold the
message once and the resend get its PUBACK (PUBREC/PUBCOMP). The guards against answering too
much from the log: a resend whose packet id was last used for another payload, and another
client's resend with the same packet id, topic and payload, are both stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc, wait_for
from helpers.clients import unique
from helpers.devicelog import fetch_all, log_list

pytestmark = pytest.mark.timeout(180)
HOLD_ENV = "MESHMQTEST_HWM_HOLD_FILE"  # test-only failpoint (meshmq/hwmhold.py)
ON = {"publisher_dedupe": "on"}  # a single node runs it only when asked (the default: cluster)


def _payloads(b: BrokerProc, device: str) -> list[bytes]:
    if device not in log_list(b):  # no record yet (the fetch API answers 404)
        return []
    return [bytes(r.payload) for r in fetch_all(b, device)]


def _stored_unanswered(b: BrokerProc, client: R.RawClient, device: str, topic: str,
                       payload: bytes, packet_id: int, qos: int = 1) -> None:
    """Send a publish, wait until its record is committed, then drop the socket unread."""
    client.send(R.publish(topic, payload, qos=qos, packet_id=packet_id, version=client.version))
    wait_for(lambda: payload in _payloads(b, device), timeout=30,
             message=f"{payload!r} committed in {device!r}")
    client.abort()


def _resend(b: BrokerProc, raw: Any, cid: str, topic: str, payload: bytes, packet_id: int,
            qos: int = 1, version: int = 4) -> R.Packet:
    """Reconnect with clean_start = false and resend with DUP=1; the final ack."""
    c = raw(b, version=version)
    c.connect(cid, clean=False)
    c.send(R.publish(topic, payload, qos=qos, dup=True, packet_id=packet_id, version=version))
    if qos == 1:
        ack = c.expect(R.PUBACK, skip=(R.PUBLISH,))
    else:
        rec = c.expect(R.PUBREC, skip=(R.PUBLISH,))
        assert rec.reason_code in (None, 0), rec
        c.send(R.pubrel(packet_id))
        ack = c.expect(R.PUBCOMP, skip=(R.PUBLISH,))
    assert ack.packet_id == packet_id and ack.reason_code in (None, 0), ack
    c.disconnect()
    return ack


def test_resend_after_lost_connection_and_restart_is_stored_once(start_broker, raw) -> None:
    # persistence off: after the kill -9 the client's session is gone, as after a failover to
    # another node (its resend then comes in a session this router has never seen)
    b = start_broker(mqtt={"persistence": False, **ON})
    device = unique("dd")
    topic = f"devices/{device}/t"
    cid = unique("ddpub")

    c = raw(b)
    c.connect(cid, clean=False)
    c.publish(topic, b"m0", 1, packet_id=1)
    _stored_unanswered(b, c, device, topic, b"m1", 2)
    _resend(b, raw, cid, topic, b"m1", 2)
    assert _payloads(b, device) == [b"m0", b"m1"]

    # the router killed between the store and the ack: found in the log it recovered
    c = raw(b)
    c.connect(cid, clean=False)
    _stored_unanswered(b, c, device, topic, b"m2", 3)
    b.kill()
    b.start()
    _resend(b, raw, cid, topic, b"m2", 3)
    # QoS 2 the same way: the PUBLISH resent before any PUBREC was read
    c = raw(b)
    c.connect(cid, clean=False)
    _stored_unanswered(b, c, device, topic, b"q2", 4, qos=2)
    b.kill()
    b.start()
    _resend(b, raw, cid, topic, b"q2", 4, qos=2)
    assert _payloads(b, device) == [b"m0", b"m1", b"m2", b"q2"]
    assert b.metric("meshmq_publish_dedupe_total", result="hit") == 1  # since the restart

    # packet id 2 reused after its ack for another message, lost before it was stored: its
    # resend is that message, not m1 again
    _resend(b, raw, cid, topic, b"m3", 2)
    assert _payloads(b, device)[-1] == b"m3"


def test_another_clients_resend_with_the_same_packet_id_is_stored(start_broker, raw) -> None:
    b = start_broker(mqtt=ON)
    device = unique("dd")
    topic = f"devices/{device}/t"
    first, second = unique("dda"), unique("ddb")

    c = raw(b)
    c.connect(first, clean=False)
    _stored_unanswered(b, c, device, topic, b"same", 7)
    # another publisher, same packet id, topic and payload: its own message, stored
    _resend(b, raw, second, topic, b"same", 7)
    assert _payloads(b, device) == [b"same", b"same"]
    # the first publisher's resend is the one already stored
    _resend(b, raw, first, topic, b"same", 7)
    assert _payloads(b, device) == [b"same", b"same"]
    assert b.metric("meshmq_publish_dedupe_total", result="hit") == 1


def test_message_id_property_dedupes_across_client_ids(start_broker, raw) -> None:
    """An MQTT 5 publisher that sets meshmq-message-id is deduplicated by it, whatever client id
    or packet id the resend comes with (an assigned client id changes at every connect)."""
    b = start_broker(mqtt=ON)
    device = unique("dd")
    topic = f"devices/{device}/t"
    props = {R.USER_PROPERTY: [("meshmq-message-id", "order-17")]}
    c = raw(b, version=5)
    c.connect(unique("ddm1"))
    c.send(R.publish(topic, b"order", qos=1, packet_id=1, version=5, properties=props))
    wait_for(lambda: b"order" in _payloads(b, device), timeout=30, message="first copy")
    c.abort()
    c = raw(b, version=5)
    c.connect(unique("ddm2"))
    ack = c.publish(topic, b"order", 1, packet_id=9, properties=props)
    assert ack.reason_code in (None, 0), ack
    c.publish(topic, b"other", 1, packet_id=10,
              properties={R.USER_PROPERTY: [("meshmq-message-id", "order-18")]})
    assert _payloads(b, device) == [b"order", b"other"]


def test_a_resend_of_a_copy_not_yet_committed_waits_for_it(start_broker, raw,
                                                            tmp_path: Path) -> None:
    """The first copy is durable but below no high-water mark yet (held by the test-only
    failpoint, as behind a lagging follower): the resend finds it all the same (the lookup
    reads up to the durable end), and its PUBACK waits until that copy is committed."""
    hold = tmp_path / "hwm-hold"
    b = start_broker(env={HOLD_ENV: str(hold)}, mqtt=ON)
    device, free = unique("dd"), unique("ddfree")
    topic, free_topic = f"devices/{device}/t", f"devices/{free}/t"
    cid = unique("ddpub")
    c = raw(b)
    c.connect(cid, clean=False)
    c.publish(topic, b"m0", 1, packet_id=1)
    hold.write_text(device + "\n")
    wait_for(lambda: f"high-water mark of {device!r} held" in b.log_text(), timeout=30,
             message="the failpoint to hold the mark")
    c.send(R.publish(topic, b"m1", qos=1, packet_id=2))
    # another device's ack from a later write: m1 is durable (group commits become durable
    # in write order), only not committed
    c.publish(free_topic, b"f1", 1, packet_id=3)
    c.abort()

    c = raw(b)
    c.connect(cid, clean=False)
    c.send(R.publish(topic, b"m1", qos=1, dup=True, packet_id=2))
    # sentinel: an ack of a later publish arrives first, so the resend's ack is held
    c.send(R.publish(free_topic, b"f2", qos=1, packet_id=4))
    first = c.expect(R.PUBACK, timeout=30)
    assert first.packet_id == 4, f"the resend was acknowledged before its copy committed: {first}"
    hold.write_text("")
    ack = c.expect(R.PUBACK, timeout=30)
    assert ack.packet_id == 2 and ack.reason_code in (None, 0), ack
    assert _payloads(b, device) == [b"m0", b"m1"]


def test_a_single_node_keeps_no_publisher_header_by_default(start_broker, raw) -> None:
    """mqtt.publisher_dedupe = "cluster" (default): a single node's records are as before, no
    ``:pub`` header (its cost stays off the single node's hot path), and a resend is stored
    again, as before (at least once)."""
    b = start_broker()
    device = unique("dd")
    topic = f"devices/{device}/t"
    c = raw(b)
    c.connect(unique("ddplain"), clean=False)
    c.publish(topic, b"m0", 1, packet_id=1)
    c.send(R.publish(topic, b"m0", qos=1, dup=True, packet_id=1))  # a resend: stored again
    assert c.expect(R.PUBACK, timeout=30).packet_id == 1
    recs = fetch_all(b, device)
    assert [(bytes(r.payload), list(r.headers)) for r in recs] == [(b"m0", []), (b"m0", [])]


def test_a_new_clean_session_is_another_publisher(start_broker, raw) -> None:
    """The session epoch is part of the key: a client that starts a clean session and sends
    DUP=1 with a packet id, topic and payload its previous session last stored is another
    session's message (a clean start discards the session [MQTT-3.1.2-4]): stored. Its own
    resend within that session is then matched (the latest record is its own)."""
    b = start_broker(mqtt=ON)
    device = unique("dd")
    topic = f"devices/{device}/t"
    cid = unique("ddclean")
    c = raw(b)
    c.connect(cid, clean=True)
    _stored_unanswered(b, c, device, topic, b"x", 5)
    c = raw(b)
    c.connect(cid, clean=True)
    c.send(R.publish(topic, b"x", qos=1, dup=True, packet_id=5))
    assert c.expect(R.PUBACK, timeout=30).packet_id == 5
    assert _payloads(b, device) == [b"x", b"x"]
    c.send(R.publish(topic, b"x", qos=1, dup=True, packet_id=5))  # same session: a resend
    assert c.expect(R.PUBACK, timeout=30).packet_id == 5
    assert _payloads(b, device) == [b"x", b"x"]


def test_a_copy_outside_the_windows_is_stored_again(start_broker, raw) -> None:
    """The two bounds: the client's in-flight window (its last mqtt.receive_maximum records in
    the log; a packet id older than that was acknowledged and may be reused) and
    mqtt.dedupe_window (how far back the log is read). A copy outside either is stored again
    (at least once), one inside both is found."""
    b = start_broker(mqtt={**ON, "receive_maximum": 2, "dedupe_window": 6})
    device = unique("dd")
    topic = f"devices/{device}/t"
    cid = unique("ddwin")
    c = raw(b)
    c.connect(cid, clean=False)
    _stored_unanswered(b, c, device, topic, b"a", 1)
    c = raw(b)
    c.connect(cid, clean=False)
    c.publish(topic, b"b", 1, packet_id=2)
    c.publish(topic, b"c", 1, packet_id=3)  # "a" is now 2 of this client's records back
    _resend(b, raw, cid, topic, b"a", 1)
    assert _payloads(b, device) == [b"a", b"b", b"c", b"a"]
    # in both windows: found
    _resend(b, raw, cid, topic, b"c", 3)
    assert _payloads(b, device) == [b"a", b"b", b"c", b"a"]
    # another client's records push "c" out of the device's last 6
    other = raw(b)
    other.connect(unique("ddother"))
    for pid in range(1, 6):
        other.publish(topic, b"o", 1, packet_id=pid)
    _resend(b, raw, cid, topic, b"c", 3)
    assert _payloads(b, device) == [b"a", b"b", b"c", b"a", *[b"o"] * 5, b"c"]
