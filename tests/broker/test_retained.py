"""Retained messages: delivery on subscribe, RETAIN flags, retain handling, clearing, expiry."""

import time

import pytest
from helpers import raw as R
from helpers.clients import V5, V311, SubscribeOptions, props, unique

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_retained_delivered_on_subscribe_with_retain_flag(broker, clients, protocol):
    """[MQTT-3.3.1-5]/[MQTT-3.3.1-6]/[MQTT-3.3.1-8] (3.1.1): a retained message is stored and
    sent to a new subscriber with RETAIN=1, at min(stored QoS, granted QoS)."""
    topic = unique("ret") + "/t"
    pub = clients.connected(broker, protocol=protocol)
    pub.publish(topic, b"kept", 1, retain=True)
    sub = clients.connected(broker, protocol=protocol)
    sub.subscribe(topic, 2)
    m = sub.expect_message()
    assert (m.topic, m.payload, m.retain, m.qos) == (topic, b"kept", True, 1)
    sub0 = clients.connected(broker, protocol=protocol)
    sub0.subscribe(topic, 0)
    m0 = sub0.expect_message()
    assert (m0.payload, m0.retain, m0.qos) == (b"kept", True, 0)


def test_retained_last_one_wins_and_wildcards(broker, clients):
    """[MQTT-3.3.1-5]: a new retained message replaces the old one for that topic; a wildcard
    subscription gets the retained message of every matching topic."""
    p = unique("retw")
    pub = clients.connected(broker, protocol=V311)
    pub.publish(f"{p}/a", b"old", 1, retain=True)
    pub.publish(f"{p}/a", b"new", 1, retain=True)
    pub.publish(f"{p}/b/c", b"bc", 1, retain=True)
    pub.publish(f"{p}/nonretained", b"nr", 1, retain=False)
    sub = clients.connected(broker, protocol=V311)
    sub.subscribe(f"{p}/#", 1)
    got = {m.topic: m.payload for m in sub.expect_messages(2)}
    assert got == {f"{p}/a": b"new", f"{p}/b/c": b"bc"}
    sub.expect_no_message(0.7)


def test_live_forward_clears_retain_flag_v311(broker, clients):
    """[MQTT-3.3.1-9] (3.1.1): a retained publication forwarded to an established subscription
    has RETAIN=0."""
    topic = unique("live") + "/t"
    sub = clients.connected(broker, protocol=V311)
    sub.subscribe(topic, 1)
    pub = clients.connected(broker, protocol=V311)
    pub.publish(topic, b"live", 1, retain=True)
    m = sub.expect_message()
    assert (m.payload, m.retain) == (b"live", False)


@pytest.mark.parametrize("rap", [False, True])
def test_v5_retain_as_published(broker, clients, rap):
    """[MQTT-3.3.1-12]/[MQTT-3.3.1-13] (5.0): with Retain As Published 0 the live-forwarded
    message has RETAIN=0; with 1 it keeps the RETAIN flag it was published with."""
    topic = unique("rap") + "/t"
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(topic, options=SubscribeOptions(qos=1, retainAsPublished=rap))
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"r1", 1, retain=True)
    pub.publish(topic, b"r0", 1, retain=False)
    m1, m2 = sub.expect_messages(2)
    assert (m1.payload, m1.retain) == (b"r1", rap)
    assert (m2.payload, m2.retain) == (b"r0", False)


def test_v5_retain_handling(broker, clients):
    """[MQTT-3.3.1-9]/[MQTT-3.3.1-10]/[MQTT-3.3.1-11] (5.0) and [MQTT-3.8.4-4]: Retain Handling
    0 sends retained messages on every SUBSCRIBE (also a re-subscribe); 1 only if the
    subscription did not exist; 2 never."""
    topic = unique("rh") + "/t"
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"stored", 1, retain=True)

    rh0 = clients.connected(broker, protocol=V5)
    rh0.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=0))
    assert rh0.expect_message().payload == b"stored"
    rh0.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=0))
    m = rh0.expect_message()
    assert (m.payload, m.retain) == (b"stored", True)

    rh1 = clients.connected(broker, protocol=V5)
    rh1.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=1))
    assert rh1.expect_message().payload == b"stored"
    rh1.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=1))
    rh1.expect_no_message(1.0)

    rh2 = clients.connected(broker, protocol=V5)
    rh2.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=2))
    rh2.expect_no_message(1.0)
    # ...but live messages still flow to the rh=2 subscription.
    pub.publish(topic, b"live", 1)
    assert rh2.expect_message().payload == b"live"


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_empty_retained_payload_clears(broker, clients, protocol):
    """[MQTT-3.3.1-10]/[MQTT-3.3.1-11] (3.1.1), [MQTT-3.3.1-6]/[MQTT-3.3.1-7] (5.0): a retained
    PUBLISH with an empty payload is forwarded to current subscribers but removes the retained
    message; later subscribers get nothing."""
    topic = unique("clr") + "/t"
    pub = clients.connected(broker, protocol=protocol)
    pub.publish(topic, b"x", 1, retain=True)
    current = clients.connected(broker, protocol=protocol)
    current.subscribe(topic, 1)
    assert current.expect_message().payload == b"x"
    pub.publish(topic, b"", 1, retain=True)
    m = current.expect_message()
    assert m.payload == b""
    later = clients.connected(broker, protocol=protocol)
    later.subscribe(topic, 1)
    later.expect_no_message(1.0)


def test_non_retained_publish_does_not_replace_retained(broker, clients):
    """[MQTT-3.3.1-12] (3.1.1) / [MQTT-3.3.1-8] (5.0): a PUBLISH with RETAIN=0 neither stores nor
    removes the retained message."""
    topic = unique("keep") + "/t"
    pub = clients.connected(broker, protocol=V311)
    pub.publish(topic, b"retained", 1, retain=True)
    pub.publish(topic, b"", 1, retain=False)
    pub.publish(topic, b"ordinary", 1, retain=False)
    sub = clients.connected(broker, protocol=V311)
    sub.subscribe(topic, 1)
    m = sub.expect_message()
    assert (m.payload, m.retain) == (b"retained", True)
    sub.expect_no_message(0.7)


def test_v5_retained_message_expiry(broker, clients):
    """[MQTT-3.3.2-5]/[MQTT-3.3.2-6] (5.0): a retained message whose Message Expiry Interval
    has passed is not sent to new subscribers; one that has not expired is sent with the
    remaining interval (strictly less than the original after waiting)."""
    p = unique("rexp")
    pub = clients.connected(broker, protocol=V5)
    pub.publish(f"{p}/short", b"short", 1, retain=True,
                properties=props(MessageExpiryInterval=1))
    pub.publish(f"{p}/long", b"long", 1, retain=True,
                properties=props(MessageExpiryInterval=60))
    time.sleep(2.5)
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(f"{p}/#", 1)
    m = sub.expect_message()
    assert m.topic == f"{p}/long"
    remaining = m.properties.MessageExpiryInterval
    assert 1 <= remaining <= 58, f"remaining expiry {remaining}, expected <= 58 after 2.5 s"
    sub.expect_no_message(1.0)


def test_retained_survives_publisher_session_end(broker, clients):
    """[MQTT-3.1.2-7] (3.1.1): retained messages are not part of session state and stay after
    the publishing client's session ends."""
    topic = unique("rsess") + "/t"
    pub = clients.connected(broker, protocol=V311)
    pub.publish(topic, b"stays", 1, retain=True)
    pub.disconnect()
    sub = clients.connected(broker, protocol=V311)
    sub.subscribe(topic, 1)
    assert sub.expect_message().payload == b"stays"


def test_retained_wire_flags(broker, raw):
    """Wire check of [MQTT-3.3.1-8]: the retained copy sent on SUBSCRIBE has the RETAIN bit set
    and DUP clear."""
    topic = unique("rwire") + "/t"
    pub = raw(broker, version=4)
    pub.connect(unique("rwp"))
    pub.publish(topic, b"w", 1, retain=True)
    sub = raw(broker, version=4)
    sub.connect(unique("rws"))
    sub.subscribe(topic, 1)
    m = sub.expect(R.PUBLISH)
    assert (m.retain, m.dup, m.qos, m.payload) == (True, False, 1, b"w")
