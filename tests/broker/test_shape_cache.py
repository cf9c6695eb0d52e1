"""A message's cached wire encodings (``Message.parts`` / ``Message.packet0``: one per
*shape*) must stay few: a shape key holds the subscription identifiers and the remaining
expiry, both chosen by subscribers, so a cache without a bound grows one whole copy of the
payload per distinct key. A retained message lives as long as its topic does: before the
bound, one client re-subscribing with a new Subscription Identifier each time grew the
broker by one payload per SUBSCRIBE, for good (review8, issue 25's review: 200 SUBSCRIBEs to
a 1 MB retained message took the broker from 51 MB to 248 MB of RSS)."""

import time

import pytest
from helpers import raw as R
from helpers.clients import unique

pytestmark = pytest.mark.timeout(120)

PAYLOAD = 1_000_000
SUBSCRIBES = 120


def _retained_copy(sub: R.RawClient, pid: int, topic: str, qos: int) -> R.Packet:
    """SUBSCRIBE at ``qos`` with Subscription Identifier ``pid``; the retained copy (acked)."""
    props = {R.SUBSCRIPTION_IDENTIFIER: pid}
    sub.send(R.subscribe(pid, [(topic, qos)], version=5, properties=props))
    got = None
    acked = False
    while got is None or not acked:
        p = sub.recv(30)
        if p.type == R.SUBACK:
            acked = True
        elif p.type == R.PUBLISH:
            got = p
            sub.ack(p)
    return got


@pytest.mark.parametrize("qos", [0, 1])  # Message.packet0 / Message.parts
def test_resubscribing_to_a_large_retained_message_does_not_grow_the_broker(broker, raw, qos):
    """Each SUBSCRIBE gets the retained copy with its own identifier (a new shape each time),
    and the broker's RSS grows by far less than one payload per SUBSCRIBE (the cache keeps a
    few shapes, then encodes per send)."""
    topic = unique("shapes") + "/big"
    pub = raw(broker, version=5)
    pub.connect(unique("p"))
    pub.publish(topic, b"R" * PAYLOAD, 1, retain=True)
    sub = raw(broker, version=5)
    sub.connect(unique("s"))
    first = _retained_copy(sub, 1, topic, qos)  # warm up: buffers, the first encodes
    assert first.retain and len(first.payload) == PAYLOAD, first
    before = broker.rss_kib()
    for pid in range(2, SUBSCRIBES + 2):
        p = _retained_copy(sub, pid, topic, qos)
        assert p.properties.get(R.SUBSCRIPTION_IDENTIFIER) in (pid, [pid]), p.properties
        assert p.retain and p.qos == qos and len(p.payload) == PAYLOAD
    grown_mib = (broker.rss_kib() - before) / 1024
    # unbounded: ~SUBSCRIBES MiB (one payload kept per identifier); bounded: a handful
    assert grown_mib < SUBSCRIBES * PAYLOAD / 2**20 / 3, (
        f"RSS grew {grown_mib:.0f} MiB over {SUBSCRIBES} SUBSCRIBEs of a "
        f"{PAYLOAD // 1000} kB retained message: a cached encoding per shape, unbounded")
    pub.publish(topic, b"", 1, retain=True)  # clear it (the module's broker is shared)


def _one_publish(c: R.RawClient) -> R.Packet:
    """The next PUBLISH (acked), skipping SUBACKs."""
    while True:
        p = c.recv(30)
        if p.type == R.PUBLISH:
            c.ack(p)
            return p


def test_each_qos0_copy_of_one_message_carries_its_own_ids_and_remaining_expiry(broker, raw):
    """One message, QoS 0 copies in several v5 shapes (``Message.packet0`` caches one whole
    packet per shape): every subscriber gets its own Subscription Identifiers (overlapping
    subscriptions: one copy with all of them [MQTT-3.3.4-3]), and a retained copy sent later
    carries the expiry left then, never the interval cached for an earlier copy
    [MQTT-3.3.2-6]. A v3.1.1 subscriber of the same message gets neither property."""
    topic = unique("shape-ids") + "/t"
    subs = []
    for ids in ((3,), (4,), (5, 6)):
        c = raw(broker, version=5)
        c.connect(unique("s"))
        for n, i in enumerate(ids):  # (5, 6): two overlapping filters, one copy
            flt = topic if n == 0 else topic.rsplit("/", 1)[0] + "/+"
            assert c.subscribe([(flt, 0)], packet_id=i,
                               properties={R.SUBSCRIPTION_IDENTIFIER: i}).reason_codes == [0]
        subs.append((ids, c))
    v3 = raw(broker, version=4)
    v3.connect(unique("s3"))
    v3.subscribe(topic, 0)
    pub = raw(broker, version=5)
    pub.connect(unique("p"))
    pub.publish(topic, b"m", 1, retain=True, properties={R.MESSAGE_EXPIRY_INTERVAL: 60})
    for ids, c in subs:
        p = _one_publish(c)
        got = p.properties.get(R.SUBSCRIPTION_IDENTIFIER)
        got = sorted(got) if isinstance(got, list) else [got]
        assert (p.qos, got) == (0, list(ids)), (ids, p)
        assert 55 <= p.properties[R.MESSAGE_EXPIRY_INTERVAL] <= 60, p
    p = _one_publish(v3)
    assert (p.payload, p.qos, p.retain, p.properties) == (b"m", 0, False, {}), p
    # retained copies on SUBSCRIBE: the same message object, the same shape but for the time
    late = []
    for wait in (0.0, 2.2):
        time.sleep(wait)  # (a loaded box only makes the gap larger)
        c = raw(broker, version=5)
        c.connect(unique("late"))
        c.send(R.subscribe(1, [(topic, 0)], version=5))
        p = _one_publish(c)
        assert p.retain and p.payload == b"m", p
        late.append(p.properties[R.MESSAGE_EXPIRY_INTERVAL])
    assert late[1] < late[0] <= 60, f"the later retained copy's expiry interval: {late}"
    pub.publish(topic, b"", 1, retain=True)
