"""Session edges no other test reached: expiry changed on DISCONNECT, the will of a connection
that is taken over, and a subscriber refusing a QoS 2 message with its PUBREC.

Each is a real broker and raw MQTT clients; waits are sentinels (a later message on the same
path proves an earlier one did not come), not timers.
"""

from __future__ import annotations

import time

import pytest
from helpers import raw as R
from helpers.clients import unique

pytestmark = pytest.mark.timeout(60)


def _v5(broker, raw, cid: str, *, expiry: int | None = None, clean: bool = True,
        will: R.Will | None = None) -> tuple[R.RawClient, R.Packet]:
    c = raw(broker, version=5)
    props = {R.SESSION_EXPIRY_INTERVAL: expiry} if expiry is not None else None
    ack = c.connect(cid, clean=clean, properties=props, will=will)
    return c, ack


# -- [MQTT-3.14.2-2] / 3.14.2.2.2: Session Expiry Interval on DISCONNECT -----------------------


def test_disconnect_with_expiry_zero_ends_a_kept_session(broker, raw):
    """CONNECT with expiry 60, DISCONNECT setting it to 0: the session ends with the
    connection (a reconnect gets Session Present 0)."""
    cid = unique("dexp0")
    c, _ = _v5(broker, raw, cid, expiry=60, clean=False)
    c.subscribe(unique("dexp") + "/t", 1)
    c.send(R.disconnect(0, {R.SESSION_EXPIRY_INTERVAL: 0}))
    c.wait_closed()
    _, ack = _v5(broker, raw, cid, expiry=60, clean=False)
    assert not ack.session_present, ack


def test_disconnect_can_lengthen_the_expiry(broker, raw):
    """CONNECT with expiry 1, DISCONNECT setting 60: the session outlives the first second
    (reconnect after 2.5 s: Session Present 1)."""
    cid = unique("dexp60")
    c, _ = _v5(broker, raw, cid, expiry=1, clean=False)
    c.subscribe(unique("dexp") + "/t", 1)
    c.send(R.disconnect(0, {R.SESSION_EXPIRY_INTERVAL: 60}))
    c.wait_closed()
    time.sleep(2.5)  # past the CONNECT's 1 s (+ the 0.5 s sweep), far inside the new 60 s
    _, ack = _v5(broker, raw, cid, expiry=60, clean=False)
    assert ack.session_present, "the DISCONNECT's Session Expiry Interval was ignored"


def test_disconnect_setting_expiry_after_zero_is_a_protocol_error(broker, raw):
    """[MQTT-3.14.2-2]: expiry 0 at CONNECT and non-zero at DISCONNECT is a Protocol Error:
    the server answers DISCONNECT 0x82 and the session is not kept."""
    cid = unique("dexperr")
    c, _ = _v5(broker, raw, cid, expiry=0, clean=False)
    c.subscribe(unique("dexp") + "/t", 1)
    c.send(R.disconnect(0, {R.SESSION_EXPIRY_INTERVAL: 60}))
    got = c.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x82], got
    _, ack = _v5(broker, raw, cid, expiry=60, clean=False)
    assert not ack.session_present, ack


# -- Takeover and the old connection's will ([MQTT-3.1.4-3], 3.1.3.2.2) ------------------------


def _watch(broker, raw, topic: str) -> R.RawClient:
    w = raw(broker, version=5)
    w.connect(unique("watch"))
    assert w.subscribe(topic, 1).reason_codes == [1]
    return w


def _next_payload(w: R.RawClient) -> bytes:
    pkt = w.expect(R.PUBLISH, timeout=15)
    w.ack(pkt)
    return pkt.payload


@pytest.mark.parametrize("version", [4, 5])
def test_takeover_publishes_the_old_connections_will(broker, raw, version):
    """The taken-over connection did not DISCONNECT: its will (no delay) is published."""
    topic = unique("tkwill") + "/w"
    w = _watch(broker, raw, topic)
    cid = unique("tk")
    old = raw(broker, version=version)
    old.connect(cid, clean=False, will=R.Will(topic, b"old-will", qos=1))
    new = raw(broker, version=version)
    new.connect(cid, clean=False)
    assert _next_payload(w) == b"old-will"
    old.wait_closed()


def test_takeover_inside_the_will_delay_keeps_the_will_back(broker, raw):
    """v5 with Will Delay 30 s and a takeover that continues the session (Clean Start 0): the
    will is not published; with Clean Start 1 (the session ends) it is."""
    topic = unique("tkdelay") + "/w"
    w = _watch(broker, raw, topic)
    cid = unique("tkd")
    delayed = R.Will(topic, b"delayed-will", qos=1, properties={R.WILL_DELAY_INTERVAL: 30})
    _v5(broker, raw, cid, expiry=60, clean=False, will=delayed)
    _v5(broker, raw, cid, expiry=60, clean=False)  # takeover, session continues
    sender, _ = _v5(broker, raw, unique("tksend"))
    sender.publish(topic, b"sentinel", qos=1)
    assert _next_payload(w) == b"sentinel", "the will was published though the session went on"

    cid2 = unique("tkd2")
    _v5(broker, raw, cid2, expiry=60, clean=False, will=R.Will(
        topic, b"ended-will", qos=1, properties={R.WILL_DELAY_INTERVAL: 30}))
    _v5(broker, raw, cid2, expiry=60, clean=True)  # takeover that ends the session
    assert _next_payload(w) == b"ended-will"


# -- A subscriber's PUBREC with an error code (MQTT 5 4.3.3, 3.5.2.1) ---------------------------


def test_subscriber_pubrec_error_ends_the_flow_and_frees_the_slot(broker, raw):
    """Receive Maximum 1: the subscriber refuses the first QoS 2 message with PUBREC 0x80. The
    server must send no PUBREL for it and must free the slot: the next thing it sends is the
    second message."""
    topic = unique("prerr") + "/t"
    sub = raw(broker, version=5)
    sub.connect(unique("prsub"), properties={R.RECEIVE_MAXIMUM: 1})
    assert sub.subscribe(topic, 2).reason_codes == [2]
    pub, _ = _v5(broker, raw, unique("prpub"))
    pub.publish(topic, b"first", qos=2)
    pub.publish(topic, b"second", qos=2)
    first = sub.expect(R.PUBLISH, timeout=15)
    assert first.payload == b"first" and first.qos == 2, first
    sub.send(R.pubrec(first.packet_id, 0x80))
    nxt = sub.recv(15)
    assert nxt.type == R.PUBLISH and nxt.payload == b"second", (
        f"after PUBREC 0x80 the server sent {nxt!r}, not the next message")
    sub.complete_qos2(nxt)
    sub.expect_none(0.3)  # and no late PUBREL for the refused one
