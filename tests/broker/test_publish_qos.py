"""QoS 0/1/2 flows end to end, QoS downgrade, packet identifiers, redelivery with DUP."""

import pytest
from helpers import raw as R
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)


def _sub_raw(broker, raw, topic, qos, *, version=4, client_id=None, clean=True, **kw):
    c = raw(broker, version=version)
    c.connect(client_id or unique("sub"), clean=clean, **kw)
    ack = c.subscribe(topic, qos)
    assert ack.reason_codes == [qos], ack
    return c


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_end_to_end_each_qos(broker, clients, protocol, qos):
    """[MQTT-3.3.4-1] / [MQTT-4.3.x]: a message published at QoS n to a subscription granted
    QoS n arrives once, with its topic, payload and QoS."""
    topic = unique("e2e") + "/x"
    sub = clients.connected(broker, protocol=protocol)
    assert sub.subscribe(topic, qos) == [qos]
    pub = clients.connected(broker, protocol=protocol)
    pub.publish(topic, f"payload-{qos}".encode(), qos)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (
        topic, f"payload-{qos}".encode(), qos, False
    )
    sub.expect_no_message(0.5)


def test_qos1_puback_wire(broker, raw):
    """[MQTT-4.3.2-4] / [MQTT-2.2.1-5]: the PUBACK carries the PUBLISH's Packet Identifier
    (3.1.1: exactly 40 02 <pid>)."""
    c = raw(broker, version=4)
    c.connect(unique("p1"))
    c.send(R.publish(unique("p1") + "/t", b"x", qos=1, packet_id=0x1234))
    ack = c.expect(R.PUBACK)
    assert ack.raw == b"\x40\x02\x12\x34"


def test_qos2_inbound_flow_wire(broker, raw):
    """[MQTT-4.3.3-8]/[MQTT-4.3.3-11]: PUBLISH QoS 2 -> PUBREC(pid); PUBREL(pid) -> PUBCOMP(pid);
    the subscriber gets the message exactly once."""
    topic = unique("q2") + "/t"
    sub = _sub_raw(broker, raw, topic, 2)
    c = raw(broker, version=4)
    c.connect(unique("q2pub"))
    c.send(R.publish(topic, b"once", qos=2, packet_id=77))
    rec = c.expect(R.PUBREC)
    assert rec.raw == b"\x50\x02\x00\x4d"
    c.send(R.pubrel(77))
    comp = c.expect(R.PUBCOMP)
    assert comp.raw == b"\x70\x02\x00\x4d"
    msg = sub.expect(R.PUBLISH)
    assert (msg.topic, msg.payload, msg.qos, msg.dup) == (topic, b"once", 2, False)
    sub.complete_qos2(msg)
    sub.expect_none(1.0)


def test_qos2_duplicate_publish_before_pubrel_delivered_once(broker, raw):
    """[MQTT-4.3.3-10]: until PUBREL, a re-sent PUBLISH with the same Packet Identifier (DUP=1)
    is answered with PUBREC again and does not cause a second delivery."""
    topic = unique("q2dup") + "/t"
    sub = _sub_raw(broker, raw, topic, 2)
    c = raw(broker, version=4)
    c.connect(unique("q2duppub"))
    c.send(R.publish(topic, b"one", qos=2, packet_id=9))
    assert c.expect(R.PUBREC).packet_id == 9
    c.send(R.publish(topic, b"one", qos=2, packet_id=9, dup=True))
    assert c.expect(R.PUBREC).packet_id == 9
    c.send(R.pubrel(9))
    assert c.expect(R.PUBCOMP).packet_id == 9
    first = sub.expect(R.PUBLISH)
    assert first.payload == b"one"
    sub.complete_qos2(first)
    sub.expect_none(1.0)


def test_packet_id_reuse_after_pubcomp_is_new_message(broker, raw):
    """[MQTT-4.3.3-12]: after PUBCOMP a PUBLISH with the same Packet Identifier is a new
    publication and is delivered again."""
    topic = unique("q2re") + "/t"
    sub = _sub_raw(broker, raw, topic, 2)
    c = raw(broker, version=4)
    c.connect(unique("q2repub"))
    for payload in (b"first", b"second"):
        c.publish(topic, payload, 2, packet_id=5)
    got = []
    for _ in range(2):
        m = sub.expect(R.PUBLISH)
        sub.complete_qos2(m)
        got.append(m.payload)
    assert got == [b"first", b"second"]


def test_packet_id_reuse_after_puback_is_new_message(broker, raw):
    """[MQTT-4.3.2-5]: after PUBACK a PUBLISH with the same Packet Identifier (even DUP=1) is a
    new publication and is delivered."""
    topic = unique("q1re") + "/t"
    sub = _sub_raw(broker, raw, topic, 1)
    c = raw(broker, version=4)
    c.connect(unique("q1repub"))
    c.publish(topic, b"a", 1, packet_id=3)
    c.send(R.publish(topic, b"b", qos=1, packet_id=3, dup=True))
    assert c.expect(R.PUBACK).packet_id == 3
    got = []
    for _ in range(2):
        m = sub.expect(R.PUBLISH)
        sub.ack(m)
        got.append(m.payload)
    assert got == [b"a", b"b"]


def test_outbound_qos2_flow_and_pubrel_flags(broker, raw):
    """Server as QoS 2 sender: PUBLISH(pid, DUP 0) -> our PUBREC -> PUBREL(pid) with fixed
    header flags 0010 [MQTT-3.6.1-1] -> our PUBCOMP; [MQTT-4.3.3-2] DUP 0 on first send."""
    topic = unique("out2") + "/t"
    sub = _sub_raw(broker, raw, topic, 2)
    pub = raw(broker, version=4)
    pub.connect(unique("out2pub"))
    pub.publish(topic, b"x", 2, packet_id=1)
    m = sub.expect(R.PUBLISH)
    assert m.qos == 2 and not m.dup and m.packet_id
    sub.send(R.pubrec(m.packet_id))
    rel = sub.expect(R.PUBREL)
    assert rel.raw[0] == 0x62, f"PUBREL fixed header 0x{rel.raw[0]:02x}, must be 0x62"
    assert rel.packet_id == m.packet_id
    sub.send(R.pubcomp(m.packet_id))
    assert sub.is_open()


def test_server_packet_ids_unique_while_in_flight(broker, raw):
    """[MQTT-2.2.1-4] / [MQTT-4.3.2-1]: each new QoS 1 PUBLISH the server sends while earlier
    ones are unacknowledged carries a distinct, non-zero Packet Identifier."""
    topic = unique("pids") + "/t"
    sub = _sub_raw(broker, raw, topic, 1)
    pub = raw(broker, version=4)
    pub.connect(unique("pidspub"))
    for i in range(10):
        pub.publish(topic, str(i), 1, packet_id=i + 1)
    got = [sub.expect(R.PUBLISH) for _ in range(10)]
    pids = [m.packet_id for m in got]
    assert 0 not in pids and None not in pids
    assert len(set(pids)) == 10, f"packet ids reused while in flight: {pids}"
    assert [m.payload for m in got] == [str(i).encode() for i in range(10)]


@pytest.mark.parametrize(("pub_qos", "sub_qos"), [(2, 0), (2, 1), (1, 0), (1, 2), (0, 2), (2, 2)])
def test_qos_downgrade_to_min(broker, clients, pub_qos, sub_qos):
    """[MQTT-3.8.4-8] (5.0) / [MQTT-3.8.4-6] (3.1.1): delivered QoS = min(published QoS,
    granted QoS)."""
    topic = unique("dg") + "/t"
    sub = clients.connected(broker, protocol=V311)
    assert sub.subscribe(topic, sub_qos) == [sub_qos]
    pub = clients.connected(broker, protocol=V311)
    pub.publish(topic, b"d", pub_qos)
    msg = sub.expect_message()
    assert msg.qos == min(pub_qos, sub_qos)


def test_qos1_order_preserved(broker, clients):
    """[MQTT-4.6.0-5]/[MQTT-4.6.0-6]: messages from one publisher on one topic arrive in the
    order they were published."""
    topic = unique("order") + "/t"
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(topic, 1)
    pub = clients.connected(broker, protocol=V5)
    for i in range(50):
        pub.publish(topic, str(i), 1, wait=False)
    got = [int(m.payload) for m in sub.expect_messages(50, timeout=20)]
    assert got == list(range(50))


@pytest.mark.parametrize("version", [4, 5])
def test_unacked_qos1_redelivered_with_dup_on_reconnect(broker, raw, version):
    """[MQTT-4.4.0-1] + [MQTT-3.3.1-1]: an unacknowledged QoS 1 PUBLISH is re-sent after a
    reconnect with a persistent session, with the original Packet Identifier and DUP=1."""
    topic = unique("redeliver") + "/t"
    cid = unique("rd")
    extra = {"properties": {R.SESSION_EXPIRY_INTERVAL: 300}} if version == 5 else {}
    sub = _sub_raw(broker, raw, topic, 1, version=version, client_id=cid, clean=False, **extra)
    pub = raw(broker, version=4)
    pub.connect(unique("rdpub"))
    pub.publish(topic, b"unacked", 1)
    first = sub.expect(R.PUBLISH)
    assert first.payload == b"unacked" and not first.dup
    sub.abort()
    again = raw(broker, version=version)
    ack = again.connect(cid, clean=False, **extra)
    assert ack.session_present
    m = again.expect(R.PUBLISH)
    assert (m.payload, m.packet_id, m.qos, m.dup) == (b"unacked", first.packet_id, 1, True), m
    again.ack(m)
    again.expect_none(1.0)


def test_unacked_qos2_publish_and_pubrel_redelivered(broker, raw):
    """[MQTT-4.4.0-1]: after reconnect the server re-sends an unacknowledged QoS 2 PUBLISH
    (DUP=1, same pid) and, for one already PUBREC'd, the PUBREL (not the PUBLISH again,
    [MQTT-4.3.3-6])."""
    topic = unique("rd2") + "/t"
    cid = unique("rd2")
    sub = _sub_raw(broker, raw, topic, 2, client_id=cid, clean=False)
    pub = raw(broker, version=4)
    pub.connect(unique("rd2pub"))
    pub.publish(topic, b"m1", 2, packet_id=1)
    pub.publish(topic, b"m2", 2, packet_id=2)
    m1 = sub.expect(R.PUBLISH)
    m2 = sub.expect(R.PUBLISH)
    assert [m1.payload, m2.payload] == [b"m1", b"m2"]
    sub.send(R.pubrec(m1.packet_id))
    rel = sub.expect(R.PUBREL)
    assert rel.packet_id == m1.packet_id
    sub.abort()
    again = raw(broker, version=4)
    assert again.connect(cid, clean=False).session_present
    seen = {}
    for _ in range(2):
        p = again.recv()
        seen[p.type] = p
    assert R.PUBREL in seen, f"PUBREL for m1 not re-sent: {seen}"
    assert seen[R.PUBREL].packet_id == m1.packet_id
    assert R.PUBLISH in seen, f"PUBLISH m2 not re-sent: {seen}"
    p2 = seen[R.PUBLISH]
    assert (p2.payload, p2.packet_id, p2.dup) == (b"m2", m2.packet_id, True)
    again.send(R.pubcomp(m1.packet_id))
    again.complete_qos2(p2)
    again.expect_none(1.0)


def test_v5_pubrel_unknown_packet_id(broker, raw):
    """MQTT 5.0 3.7.2.1: PUBREL for a Packet Identifier the server does not know is answered
    with PUBCOMP 0x92 (Packet Identifier not found); the connection stays up."""
    c = raw(broker, version=5)
    c.connect(unique("pubrel5"))
    c.send(R.pubrel(4242))
    comp = c.expect(R.PUBCOMP)
    assert comp.packet_id == 4242 and comp.reason_code == 0x92
    assert c.is_open()


def test_311_pubrel_unknown_packet_id(broker, raw):
    """3.1.1 4.3.3: the receiver answers PUBREL with PUBCOMP (same pid) even when it has no
    state for it; the connection stays up."""
    c = raw(broker, version=4)
    c.connect(unique("pubrel4"))
    c.send(R.pubrel(4243))
    comp = c.expect(R.PUBCOMP)
    assert comp.packet_id == 4243
    assert c.is_open()


def test_qos0_never_has_dup_or_packet_id(broker, raw):
    """[MQTT-3.3.1-2] / [MQTT-2.2.1-2]: QoS 0 messages are sent with DUP=0 and no packet id,
    even when published at QoS 2 and downgraded."""
    topic = unique("q0") + "/t"
    sub = _sub_raw(broker, raw, topic, 0)
    pub = raw(broker, version=4)
    pub.connect(unique("q0pub"))
    pub.publish(topic, b"z", 2, packet_id=3)
    m = sub.expect(R.PUBLISH)
    assert (m.qos, m.dup, m.packet_id) == (0, False, None)
    assert m.raw == R.publish(topic, b"z")
