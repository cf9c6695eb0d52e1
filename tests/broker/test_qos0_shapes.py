"""The QoS 0 copy's own write path (issue 25: ``DeliveryRoom._write_qos0`` and
``Message.packet0``: one shared whole-packet bytes per shape, no ``Delivery``): the flags and
limits a QoS 0 copy must still honour, seen on the wire by raw clients."""

import time

import pytest
from helpers import raw as R
from helpers.clients import unique

pytestmark = pytest.mark.timeout(60)


def _publishes(c, n: int, timeout: float = 10) -> list:
    """The next ``n`` PUBLISH packets, skipping SUBACKs (a retained copy may come first)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, got
        p = c.recv(timeout)
        if p.type == R.PUBLISH:
            got.append(p)
    return got


@pytest.mark.parametrize("version", [4, 5])
def test_qos0_copies_carry_the_retain_flag_only_for_what_was_sent_as_retained(
        broker, raw, version):
    """A retained message sent on SUBSCRIBE has RETAIN=1 [MQTT-3.3.1-8]; a live one, retained
    or not, has RETAIN=0 [MQTT-3.3.1-9]: the same message object is encoded in both shapes,
    and a v3.1.1 copy of the plain shape must never be handed out for the retained one."""
    topic = f"{unique('shape')}/t"
    pub = raw(broker, version=version)
    pub.connect(unique("p"))
    pub.publish(topic, b"kept", 1, retain=True)  # (QoS 1: stored before anyone subscribes)
    sub = raw(broker, version=version)
    sub.connect(unique("s"))
    sub.send(R.subscribe(1, [(topic, 0)], version=version))
    (first,) = _publishes(sub, 1)
    assert first.payload == b"kept" and first.retain and first.qos == 0, first
    pub.publish(topic, b"live-retained", retain=True)
    pub.publish(topic, b"live", retain=False)
    a, b = _publishes(sub, 2)
    assert (a.payload, a.retain) == (b"live-retained", False), a
    assert (b.payload, b.retain) == (b"live", False), b
    # a second subscriber gets the retained copy (RETAIN=1) of the message whose plain shape
    # the first subscriber was just written
    late = raw(broker, version=version)
    late.connect(unique("l"))
    late.send(R.subscribe(1, [(topic, 0)], version=version))
    (kept,) = _publishes(late, 1)
    assert (kept.payload, kept.retain) == (b"live-retained", True), kept
    pub.publish(topic, b"", retain=True)  # clear it


def test_a_qos0_copy_larger_than_the_clients_maximum_packet_size_is_not_sent(broker, raw):
    """[MQTT-3.1.2-24]: a QoS 0 copy over the subscriber's Maximum Packet Size is discarded
    (counted as too_large) and the next one is delivered."""
    topic = unique("mps0") + "/t"
    sub = raw(broker, version=5)
    sub.connect(unique("s"), properties={R.MAXIMUM_PACKET_SIZE: 256})
    assert sub.subscribe(topic, 0).reason_codes == [0]
    before = broker.metric("meshmq_messages_dropped_total", reason="too_large")
    pub = raw(broker, version=5)
    pub.connect(unique("p"))
    pub.publish(topic, b"B" * 1000)
    pub.publish(topic, b"small")
    (m,) = _publishes(sub, 1)
    assert m.payload == b"small" and len(m.raw) <= 256, m
    sub.expect_none(0.5)
    assert broker.metric("meshmq_messages_dropped_total", reason="too_large") == before + 1
