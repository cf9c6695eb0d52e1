"""Limits: in-flight window, receive maximum, maximum QoS, feature switches, slow subscribers."""

import queue
import time

import pytest
from helpers import raw as R
from helpers.broker import metric_sum, wait_for
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def lim_broker(module_broker_factory):
    return module_broker_factory(mqtt={"max_inflight": 3, "receive_maximum": 4})


@pytest.fixture(scope="module")
def off_broker(module_broker_factory):
    return module_broker_factory(mqtt={
        "max_qos": 1, "wildcard_subscriptions": False, "shared_subscriptions": False,
        "retain_available": False,
    })


# --------------------------------------------------------------------------------------------
# Outgoing window (max_inflight) and incoming Receive Maximum
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_max_inflight_window(lim_broker, raw, clients, version):
    """max_inflight 3 (and [MQTT-4.9.0-2] for v5): never more than 3 unacknowledged QoS 1
    PUBLISH packets outstanding to one client; each PUBACK releases exactly one more; all 10
    arrive in order ([MQTT-4.6.0-6])."""
    topic = unique("win") + "/t"
    sub = raw(lim_broker, version=version)
    sub.connect(unique("win"))
    sub.subscribe(topic, 1)
    pub = clients.connected(lim_broker, protocol=V5)
    for i in range(10):
        pub.publish(topic, str(i), 1)
    outstanding = [sub.expect(R.PUBLISH) for _ in range(3)]
    sub.expect_none(1.0)
    got = [m.payload for m in outstanding]
    while len(got) < 10:
        sub.ack(outstanding.pop(0))
        nxt = sub.expect(R.PUBLISH)
        outstanding.append(nxt)
        got.append(nxt.payload)
        if len(got) < 10:
            sub.expect_none(0.3)
    assert got == [str(i).encode() for i in range(10)]
    assert len({m.packet_id for m in outstanding}) == len(outstanding)


@pytest.mark.parametrize("version", [4, 5])
def test_a_backlog_from_the_log_is_read_as_the_window_frees(start_broker, raw, version):
    """A persistent session that went offline before anything was ever sent to it (its maps
    and queue still the shared empty ones, broker/session.py) gets a 20-message logged backlog
    on its return through the window (max_inflight 3: 3 outstanding, each PUBACK releasing
    one more), in order, none dropped: the rest waits in the log, not in the 5-message queue
    (issue 25: the catch-up loop once read the window and queue through stale references to
    the shared empty ones, read the whole backlog into the queue and dropped past its bound)."""
    b = start_broker(mqtt={"max_inflight": 3, "max_queued_messages": 5})
    n = 20
    topic = f"devices/{unique('winlog')}/t"  # logged by the default rule
    cid = unique("winlog")
    expiry = {"properties": {R.SESSION_EXPIRY_INTERVAL: 300}} if version == 5 else {}
    sub = raw(b, version=version)
    sub.connect(cid, clean=False, **expiry)
    sub.subscribe(topic, 1)
    sub.disconnect()
    wait_for(lambda: metric_sum(b.metrics(), "meshmq_sessions_offline") == 1, timeout=30,
             message="the subscriber's session to go offline")
    pub = raw(b, version=version)
    pub.connect(unique("winlog-pub"))
    for i in range(n):  # each PUBACK: stored in the log
        pub.publish(topic, str(i), 1, packet_id=i + 1)
    sub = raw(b, version=version)
    assert sub.connect(cid, clean=False, **expiry).session_present
    outstanding = [sub.expect(R.PUBLISH) for _ in range(3)]
    sub.expect_none(1.0)
    got = [m.payload for m in outstanding]
    while len(got) < n:
        sub.ack(outstanding.pop(0))
        nxt = sub.expect(R.PUBLISH)
        outstanding.append(nxt)
        got.append(nxt.payload)
    assert got == [str(i).encode() for i in range(n)]
    assert metric_sum(b.metrics(), "meshmq_messages_dropped_total") == 0


def test_qos0_not_limited_by_window(lim_broker, raw, clients):
    """The window limits QoS 1/2 only ([MQTT-4.9.0-2]): QoS 0 messages flow while 3 QoS 1
    messages are unacknowledged."""
    topic = unique("win0") + "/t"
    sub = raw(lim_broker, version=5)
    sub.connect(unique("win0"))
    sub.subscribe(topic, 1)
    pub = clients.connected(lim_broker, protocol=V5)
    for i in range(3):
        pub.publish(topic, f"q1-{i}", 1)
    for _ in range(3):
        sub.expect(R.PUBLISH)
    for i in range(5):
        pub.publish(topic, f"q0-{i}", 0)
    got = [sub.expect(R.PUBLISH).payload for _ in range(5)]
    assert got == [f"q0-{i}".encode() for i in range(5)]


def test_receive_maximum_announced(lim_broker, raw):
    """3.2.2.3.3 (5.0): CONNACK carries Receive Maximum = receive_maximum (4)."""
    c = raw(lim_broker, version=5)
    ack = c.connect(unique("rma"))
    assert ack.properties.get(R.RECEIVE_MAXIMUM) == 4


def test_receive_maximum_exceeded_0x93(lim_broker, raw):
    """[MQTT-3.3.4-7] + 3.3.4 (5.0): with Receive Maximum 4, four unreleased QoS 2 PUBLISH
    packets are fine (PUBREC each); a fifth is answered with DISCONNECT 0x93 (Receive Maximum
    exceeded) and the connection is closed."""
    topic = unique("rmx") + "/t"
    c = raw(lim_broker, version=5)
    c.connect(unique("rmx"))
    for pid in range(1, 5):
        c.send(R.publish(topic, b"x", qos=2, packet_id=pid, version=5))
        rec = c.expect(R.PUBREC)
        assert rec.packet_id == pid and rec.reason_code < 0x80
    c.send(R.publish(topic, b"x", qos=2, packet_id=5, version=5))
    got = c.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x93], got


def test_receive_maximum_released_by_pubrel(lim_broker, raw):
    """[MQTT-4.9.0-1]: PUBCOMP releases a slot: after completing one QoS 2 flow, another QoS 2
    PUBLISH is accepted while four are pending."""
    topic = unique("rmr") + "/t"
    c = raw(lim_broker, version=5)
    c.connect(unique("rmr"))
    for pid in range(1, 5):
        c.send(R.publish(topic, b"x", qos=2, packet_id=pid, version=5))
        c.expect(R.PUBREC)
    c.send(R.pubrel(1))
    assert c.expect(R.PUBCOMP).packet_id == 1
    c.send(R.publish(topic, b"x", qos=2, packet_id=6, version=5))
    assert c.expect(R.PUBREC).packet_id == 6
    assert c.is_open()


# --------------------------------------------------------------------------------------------
# max_qos, wildcard/shared/retain switches
# --------------------------------------------------------------------------------------------


def test_max_qos_announced_and_suback_capped_v5(off_broker, raw):
    """[MQTT-3.2.2-9]/[MQTT-3.2.2-10]: with max_qos 1 CONNACK carries Maximum QoS 1, SUBSCRIBE
    with QoS 2 is accepted and granted QoS 1 ([MQTT-3.8.4-7])."""
    c = raw(off_broker, version=5)
    ack = c.connect(unique("mq"))
    assert ack.properties.get(R.MAXIMUM_QOS) == 1
    sack = c.subscribe([(unique("mq") + "/a", 2), (unique("mq") + "/b", 0)])
    assert sack.reason_codes == [1, 0]


def test_max_qos_suback_capped_v311(off_broker, raw, clients):
    """[MQTT-3.9.3-1..2] (3.1.1): the granted QoS may be lower than requested: QoS 2 -> 1 with
    max_qos 1, and a QoS 2 publication is delivered at QoS 1."""
    topic = unique("mq4") + "/t"
    c = raw(off_broker, version=4)
    c.connect(unique("mq4"))
    assert c.subscribe(topic, 2).reason_codes == [1]
    pub = raw(off_broker, version=4)
    pub.connect(unique("mq4p"))
    pub.publish(topic, b"x", 1, packet_id=1)
    m = c.expect(R.PUBLISH)
    assert m.qos == 1


def test_v5_publish_above_max_qos_0x9b(off_broker, raw):
    """[MQTT-3.2.2-11] + 3.2.2.3.4 (5.0): a PUBLISH with QoS above the announced Maximum QoS is
    a protocol error: DISCONNECT 0x9B (QoS not supported), then close."""
    c = raw(off_broker, version=5)
    c.connect(unique("mq9b"))
    c.send(R.publish(unique("mq9b"), b"x", qos=2, packet_id=1, version=5))
    got = c.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x9B], got


def test_v5_will_qos_above_max_refused_0x9b(off_broker, raw):
    """[MQTT-3.2.2-12]: a CONNECT whose Will QoS exceeds the server's maximum is refused
    (CONNACK 0x9B) and closed."""
    c = raw(off_broker, version=5)
    ack = c.connect(unique("wq"), will=R.Will("w/t", b"x", qos=2), expect_rc=None)
    assert ack.reason_code == 0x9B
    c.wait_closed()


def test_wildcard_subscriptions_disabled(off_broker, raw):
    """3.2.2.3.11/3.9.3 (5.0): with wildcard subscriptions off, CONNACK says Wildcard
    Subscription Available 0 and a wildcard filter gets SUBACK 0xA2; exact filters work."""
    c = raw(off_broker, version=5)
    ack = c.connect(unique("wc"))
    assert ack.properties.get(R.WILDCARD_SUBSCRIPTION_AVAILABLE) == 0
    p = unique("wc")
    sack = c.subscribe([(f"{p}/+", 1), (f"{p}/#", 1), (f"{p}/x", 1)])
    assert sack.reason_codes == [0xA2, 0xA2, 1]


def test_shared_subscriptions_disabled(off_broker, raw):
    """3.2.2.3.13/3.9.3 (5.0): with shared subscriptions off, CONNACK says Shared Subscription
    Available 0 and a $share filter gets SUBACK 0x9E."""
    c = raw(off_broker, version=5)
    ack = c.connect(unique("ss"))
    assert ack.properties.get(R.SHARED_SUBSCRIPTION_AVAILABLE) == 0
    assert c.subscribe(f"$share/g/{unique('ss')}", 1).reason_codes == [0x9E]


def test_retain_unavailable(off_broker, raw):
    """3.2.2.3.5 (5.0) / [MQTT-3.2.2-14]: with retain off, CONNACK says Retain Available 0; a
    PUBLISH with RETAIN 1 gets DISCONNECT 0x9A (Retain not supported); a will with Will Retain
    1 is refused with CONNACK 0x9A [MQTT-3.2.2-13]."""
    c = raw(off_broker, version=5)
    ack = c.connect(unique("ra"))
    assert ack.properties.get(R.RETAIN_AVAILABLE) == 0
    c.send(R.publish(unique("ra"), b"x", retain=True, version=5))
    got = c.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x9A], got
    w = raw(off_broker, version=5)
    ack2 = w.connect(unique("raw"), will=R.Will("w/t", b"x", retain=True), expect_rc=None)
    assert ack2.reason_code == 0x9A


# --------------------------------------------------------------------------------------------
# Slow subscriber: bounded memory, counted drops, others unaffected
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_slow_subscriber_bounded_memory_and_counted(start_broker, raw, clients):
    """A subscriber that never reads while a publisher floods QoS 0: the broker's RSS stays
    bounded (< +100 MB for ~40 MB published), drops are counted as
    meshmq_messages_dropped_total{reason="slow_consumer"}, and a healthy subscriber keeps
    receiving (anchors: emqx#860, mosquitto#2455)."""
    b = start_broker(mqtt={"write_buffer_limit": 65536})
    topic = unique("flood") + "/t"
    stalled = raw(b, version=4, rcvbuf=4096)
    stalled.connect(unique("stalled"))
    stalled.subscribe(topic, 0)
    healthy = clients.connected(b, protocol=V311)
    healthy.subscribe(topic, 0)
    healthy.subscribe(topic + "/marker", 1)
    rss_before = b.rss_kib()
    pub = raw(b, version=4)
    pub.connect(unique("flooder"))
    payload = b"F" * 2048
    batch = R.publish(topic, payload) * 200
    for _ in range(100):  # 20,000 messages, ~41 MB
        pub.send(batch)
    # The flood is written; make sure the broker has processed it (PINGRESP after the data).
    pub.send(R.pingreq())
    pub.expect(R.PINGRESP, timeout=60)
    rss_after = b.rss_kib()
    growth_mb = (rss_after - rss_before) / 1024
    assert growth_mb < 100, f"broker RSS grew by {growth_mb:.0f} MB with one stalled reader"
    wait_for(lambda: b.metric("meshmq_messages_dropped_total", reason="slow_consumer") > 0,
             timeout=10, message='dropped_total{reason="slow_consumer"} > 0')
    received = len(healthy.drain())
    marker_seen = False
    deadline = time.monotonic() + 30
    while not marker_seen:
        if time.monotonic() >= deadline:
            pytest.fail("healthy subscriber stopped receiving")
        pub.publish(topic + "/marker", b"marker", 1, packet_id=1)
        end = time.monotonic() + 1.0
        while time.monotonic() < end and not marker_seen:
            try:
                m = healthy.messages.get(timeout=0.1)
            except queue.Empty:
                continue
            if m.topic == topic + "/marker":
                marker_seen = True
            else:
                received += 1
    assert received > 0, "the healthy subscriber got none of the flood"
    assert b.alive
