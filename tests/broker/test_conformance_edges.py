"""MQTT conformance edges found with third-party clients (issue 12), each from its normative
statement: session reuse after a takeover, UNSUBSCRIBE/SUBSCRIBE filter validation, the will at
the edge of its delay, MQTT 3.1's DUP on a resent PUBREL, 4-byte acks by default, a client's own
packets taking effect in the order it sent them, and "ready" logged when clients are served."""

from __future__ import annotations

import time

import pytest
from helpers import raw as R
from helpers.broker import BrokerProc
from helpers.clients import V5, unique

pytestmark = pytest.mark.timeout(90)


# -- [MQTT-3.1.2-6], [MQTT-3.2.2-2], v5 3.1.2.11.2: a session that must end is not resumed ------

@pytest.mark.parametrize("version", [4, 5])
def test_takeover_of_clean_session_does_not_resume_it(broker, raw, version):
    """A CleanSession=1 (v5: Session Expiry 0) connection taken over by a CleanSession=0 one with
    the same client id: Session Present 0 and none of the old state (its subscription is gone)."""
    cid = unique("tko")
    topic = unique("tko") + "/t"
    first = raw(broker, version=version)
    first.connect(cid, clean=True)
    first.subscribe(topic, 1)
    second = raw(broker, version=version)
    props = {R.SESSION_EXPIRY_INTERVAL: 60} if version == 5 else None
    ack = second.connect(cid, clean=False, properties=props)
    assert not ack.session_present, "the ended session was resumed"
    pub = raw(broker, version=4)
    pub.connect(unique("tkop"))
    pub.send(R.publish(topic, b"x", qos=1, packet_id=1))
    pub.expect(R.PUBACK)
    second.expect_none(1.0)  # the old subscription did not survive


# -- [MQTT-4.7.3-1], [MQTT-4.7.1-2], [MQTT-4.8.0-1]: UNSUBSCRIBE filters are validated ---------

@pytest.mark.parametrize("flt", ["", "#/test/topic", "a/b#"])
@pytest.mark.parametrize("version", [4, 5])
def test_unsubscribe_invalid_filter_closes(broker, raw, flt, version):
    """3.1.1 closes the connection; v5 sends DISCONNECT 0x82 (Protocol Error) and closes."""
    c = raw(broker, version=version)
    c.connect(unique("unsv"))
    c.send(R.unsubscribe(3, [flt], version=version))
    got = c.wait_closed()
    assert not [p for p in got if p.type == R.UNSUBACK], got
    if version == 5:
        assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x82], got


def test_v5_subscribe_empty_filter_is_a_protocol_error(broker, raw):
    """An empty filter is malformed [MQTT-4.7.3-1], not merely not allowed: DISCONNECT 0x82, no
    SUBACK 0x8F."""
    c = raw(broker, version=5)
    c.connect(unique("sube"))
    c.send(R.subscribe(5, [("", 1)], version=5))
    got = c.wait_closed()
    assert not [p for p in got if p.type == R.SUBACK], got
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x82], got


# -- [MQTT-3.1.2-8]: the will is due once its delay has passed --------------------------------

def test_reconnect_after_will_delay_but_before_the_sweep_publishes_the_will(broker, clients, raw):
    """Will Delay 1 s; the client reconnects ~1.15 s after dropping, which is after the delay but
    usually before the broker's 0.5 s sweep has fired the will: the will is due and must be
    published, not cancelled. Repeated, so that a run where the sweep came first cannot hide a
    regression."""
    for attempt in range(4):
        topic = unique("wedge") + "/t"
        cid = unique("wedge")
        watcher = clients(broker, protocol=V5)
        watcher.connect()
        watcher.subscribe(topic, 1)
        c = raw(broker, version=5)
        c.connect(cid, clean=True, properties={R.SESSION_EXPIRY_INTERVAL: 60},
                  will=R.Will(topic, f"will-{attempt}".encode(),
                              properties={R.WILL_DELAY_INTERVAL: 1}))
        c.abort()
        time.sleep(1.15)
        again = raw(broker, version=5)
        assert again.connect(cid, clean=False,
                             properties={R.SESSION_EXPIRY_INTERVAL: 60}).session_present
        m = watcher.expect_message(timeout=10)
        assert m.payload == f"will-{attempt}".encode()
        again.send(R.disconnect(0))
        watcher.disconnect()


# -- MQTT 3.1: DUP on a resent PUBREL ---------------------------------------------------------

def test_v31_resent_pubrel_with_dup_is_accepted(broker, raw):
    """MQTT 3.1 resends PUBREL with DUP=1 (0x6A); [MQTT-2.2.2-2]'s fixed flags are 3.1.1's. The
    3.1 client gets its PUBCOMP and stays connected; 3.1.1 still refuses 0x6A."""
    c = raw(broker, version=3)
    c.connect(unique("v31"))
    topic = unique("v31") + "/t"
    c.send(R.publish(topic, b"q2", qos=2, packet_id=9, version=3))
    assert c.expect(R.PUBREC).packet_id == 9
    c.send(bytes([0x6A, 0x02, 0x00, 0x09]))  # PUBREL, DUP=1
    assert c.expect(R.PUBCOMP).packet_id == 9
    assert c.is_open()
    d = raw(broker, version=4)
    d.connect(unique("v311"))
    d.send(bytes([0x6A, 0x02, 0x00, 0x09]))
    d.wait_closed()


# -- acks stay 4 bytes unless asked for ---------------------------------------------------------

def test_v5_puback_is_four_bytes_by_default(broker, raw):
    """A v5 PUBACK for a stored message is the short form (40 02 pid) unless the publisher asks
    for offsets with the CONNECT user property ack-offsets=true."""
    topic = f"devices/{unique('ack')}/t"
    c = raw(broker, version=5)
    c.connect(unique("ack4"))
    c.send(R.publish(topic, b"x", qos=1, packet_id=7, version=5))
    assert c.expect(R.PUBACK).raw == b"\x40\x02\x00\x07"
    c.send(R.publish(topic, b"y", qos=2, packet_id=8, version=5))
    assert c.expect(R.PUBREC).raw == b"\x50\x02\x00\x08"
    asks = raw(broker, version=5)
    asks.connect(unique("ackp"), properties={R.USER_PROPERTY: [("ack-offsets", "true")]})
    asks.send(R.publish(topic, b"z", qos=1, packet_id=1, version=5))
    ack = asks.expect(R.PUBACK)
    assert dict(ack.properties.get(R.USER_PROPERTY, [])).get("offset") == "2", ack


def test_ack_offsets_config_default(start_broker, raw):
    """mqtt.ack_offsets = true gives offsets to publishers that do not ask; one that says
    ack-offsets=false gets the short form."""
    b = start_broker(mqtt={"ack_offsets": True})
    topic = f"devices/{unique('ackc')}/t"
    c = raw(b, version=5)
    c.connect(unique("ackc"))
    c.send(R.publish(topic, b"x", qos=1, packet_id=1, version=5))
    ack = c.expect(R.PUBACK)
    assert dict(ack.properties.get(R.USER_PROPERTY, [])).get("offset") == "0", ack
    no = raw(b, version=5)
    no.connect(unique("ackn"), properties={R.USER_PROPERTY: [("ack-offsets", "false")]})
    no.send(R.publish(topic, b"y", qos=1, packet_id=2, version=5))
    assert no.expect(R.PUBACK).raw == b"\x40\x02\x00\x02"


# -- a client's packets take effect in the order it sent them ---------------------------------

@pytest.mark.parametrize("version", [4, 5])
def test_retained_publish_then_subscribe_delivers_it_as_retained(broker, raw, version):
    """A retained QoS 1 PUBLISH and a SUBSCRIBE to its topic in one write: the PUBACK comes
    before the SUBACK and the message arrives once, as a retained message (RETAIN=1), as on
    Mosquitto; before, the SUBSCRIBE overtook the publish still waiting for the disk."""
    topic = f"devices/{unique('ord')}/t"
    c = raw(broker, version=version)
    c.connect(unique("ord"))
    c.send(R.publish(topic, b"kept", qos=1, retain=True, packet_id=1, version=version)
           + R.subscribe(2, [(topic, 1)], version=version))
    order = []
    publishes = []
    deadline = time.monotonic() + 10
    while len(order) < 2 or not publishes:
        assert time.monotonic() < deadline, (order, publishes)
        p = c.recv(10)
        if p.type in (R.PUBACK, R.SUBACK):
            order.append(p.type)
        elif p.type == R.PUBLISH:
            publishes.append(p)
            c.send(R.puback(p.packet_id))
    assert order == [R.PUBACK, R.SUBACK]
    c.expect_none(0.5, ignore=(R.PINGRESP,))
    assert len(publishes) == 1 and publishes[0].retain, publishes
    c.send(R.publish(topic, b"", qos=1, retain=True, packet_id=3, version=version))  # clear it


# -- "ready" is logged when clients are served ------------------------------------------------

def test_listeners_open_after_start_up_work_and_ready_follows(tmp_path):
    """The listeners open only after the start-up work (the GC freeze, the fast-path check,
    whose warning BROKER_PURE_PYTHON=1 forces), and "meshmq node ready" follows them at once:
    before, clients were accepted ~50 ms before the node was ready and the first CONNECT
    waited. The log's order shows it; a CONNACK also implies the ready line is there."""
    b = BrokerProc(tmp_path / "rdy", extra_env={"BROKER_PURE_PYTHON": "1"})
    b.start()
    try:
        c = R.RawClient(b.host, b.port, version=4, timeout=5)
        c.connect(unique("rdy"))
        text = b.log_text()
        warned = text.index("running the pure-Python")
        listening = text.index("listening listener=tcp")
        ready = text.index("meshmq node ready")
        assert warned < listening < ready, text[-2000:]
        c.close()
    finally:
        b.stop()
