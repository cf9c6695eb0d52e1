"""Subscriptions: matching, $-topics, overlapping subscriptions, unsubscribe, invalid filters."""

import pytest
from helpers import raw as R
from helpers.clients import V5, V311, props, unique

pytestmark = pytest.mark.timeout(60)


def _deliveries(broker, clients, filters, topics, protocol=V311):
    """Subscribe one client to ``filters`` (QoS 1), publish one message per topic, and return
    the set of topics received (after a final marker on the first filter's exact topic)."""
    sub = clients.connected(broker, protocol=protocol)
    for f in filters:
        sub.subscribe(f, 1)
    pub = clients.connected(broker, protocol=protocol)
    for t in topics:
        pub.publish(t, t.encode(), 1)
    return sub


@pytest.mark.parametrize(
    ("flt", "matching", "not_matching"),
    [
        ("{p}/a/b", ["{p}/a/b"], ["{p}/a", "{p}/a/b/c", "{p}/A/b", "{p}/a/b/"]),
        ("{p}/+/c", ["{p}/a/c", "{p}/b/c", "{p}//c"], ["{p}/a/b/c", "{p}/c", "{p}/a/c/d"]),
        ("{p}/a/+", ["{p}/a/x", "{p}/a/"], ["{p}/a", "{p}/a/x/y"]),
        ("{p}/#", ["{p}", "{p}/a", "{p}/a/b/c"], ["{p}x", "other/{p}"]),
        ("{p}/a/#", ["{p}/a", "{p}/a/b", "{p}/a/b/c"], ["{p}/b", "{p}/ab"]),
        ("{p}/+/+", ["{p}/a/b"], ["{p}/a", "{p}/a/b/c"]),
        ("+/{p}/#", ["x/{p}", "y/{p}/z"], ["{p}/x"]),
    ],
    ids=["exact", "plus-middle", "plus-last", "hash-root", "hash-sub", "plus-plus", "plus-first"],
)
def test_topic_matching(broker, clients, flt, matching, not_matching):
    """[MQTT-4.7.1-1]/[MQTT-4.7.1-2] and 4.7.1: '+' matches exactly one level (also an empty
    one), '#' matches the parent level and any number of child levels; matching is exact and
    case-sensitive ([MQTT-4.7.3-4])."""
    p = unique("m")
    flt = flt.format(p=p)
    matching = [t.format(p=p) for t in matching]
    not_matching = [t.format(p=p) for t in not_matching]
    sub = clients.connected(broker, protocol=V311)
    assert sub.subscribe(flt, 1) == [1]
    pub = clients.connected(broker, protocol=V311)
    for t in not_matching + matching:
        pub.publish(t, t.encode(), 1)
    got = sorted(m.topic for m in sub.expect_messages(len(matching)))
    assert got == sorted(matching)
    sub.expect_no_message(0.7)


def test_dollar_topics_not_matched_by_leading_wildcards(broker, clients):
    """[MQTT-4.7.2-1]: filters starting with '#' or '+' do not match topic names starting with
    '$'; a filter that names the '$' level explicitly does."""
    p = unique("d")
    topic = f"$meshtest/{p}/x"
    hash_sub = clients.connected(broker, protocol=V5)
    assert hash_sub.subscribe("#", 0) == [0]
    plus_sub = clients.connected(broker, protocol=V5)
    assert plus_sub.subscribe(f"+/{p}/x", 0) == [0]
    explicit = clients.connected(broker, protocol=V5)
    assert explicit.subscribe(f"$meshtest/{p}/#", 0) == [0]
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"dollar", 1)
    pub.publish(f"plain/{p}/x", b"plain", 1)
    msg = explicit.expect_message()
    assert msg.topic == topic
    # The plain topic proves the '#' and '+' subscriptions were live.
    assert plus_sub.expect_message().topic == f"plain/{p}/x"
    plus_sub.expect_no_message(0.7)
    seen = [m.topic for m in hash_sub.drain()]
    more = []
    try:
        while True:
            more.append(hash_sub.expect_message(0.7).topic)
    except AssertionError:
        pass
    seen += more
    assert f"plain/{p}/x" in seen
    assert not [t for t in seen if t.startswith("$")], seen


def test_overlapping_subscriptions_one_copy_max_qos_v311(broker, raw):
    """[MQTT-3.3.5-1] (3.1.1): overlapping subscriptions deliver respecting the maximum QoS of
    the matching subscriptions; meshmq sends exactly ONE copy (like Mosquitto 2 / EMQX)."""
    p = unique("ov")
    sub = raw(broker, version=4)
    sub.connect(unique("ov"))
    assert sub.subscribe([(f"{p}/#", 0), (f"{p}/a", 2), (f"{p}/+", 1)], packet_id=2
                         ).reason_codes == [0, 2, 1]
    pub = raw(broker, version=4)
    pub.connect(unique("ovpub"))
    pub.publish(f"{p}/a", b"one", 2, packet_id=1)
    m = sub.expect(R.PUBLISH)
    assert (m.payload, m.qos) == (b"one", 2)
    sub.complete_qos2(m)
    sub.expect_none(1.0)


def test_overlapping_subscriptions_v5_all_subscription_identifiers(broker, raw):
    """[MQTT-3.3.4-2]/[MQTT-3.3.4-4] (5.0): one copy at the max granted QoS carrying the
    Subscription Identifiers of all matching subscriptions (order not significant)."""
    p = unique("ovid")
    sub = raw(broker, version=5)
    sub.connect(unique("ovid"))
    sub.subscribe([(f"{p}/#", 1)], packet_id=1, properties={R.SUBSCRIPTION_IDENTIFIER: 11})
    sub.subscribe([(f"{p}/a", 2)], packet_id=2, properties={R.SUBSCRIPTION_IDENTIFIER: 22})
    sub.subscribe([(f"{p}/+", 0)], packet_id=3)  # no identifier
    pub = raw(broker, version=5)
    pub.connect(unique("ovidpub"))
    pub.publish(f"{p}/a", b"ids", 2, packet_id=1)
    m = sub.expect(R.PUBLISH)
    assert (m.payload, m.qos) == (b"ids", 2)
    assert sorted(m.properties.get(R.SUBSCRIPTION_IDENTIFIER, [])) == [11, 22], m
    sub.complete_qos2(m)
    sub.expect_none(1.0)


def test_resubscribe_replaces_subscription(broker, clients):
    """[MQTT-3.8.4-3]: SUBSCRIBE with an identical filter replaces the subscription (new QoS),
    it does not add a second one (one copy delivered, at the new QoS)."""
    topic = unique("resub") + "/t"
    sub = clients.connected(broker, protocol=V311)
    assert sub.subscribe(topic, 2) == [2]
    assert sub.subscribe(topic, 0) == [0]
    pub = clients.connected(broker, protocol=V311)
    pub.publish(topic, b"r", 2)
    msg = sub.expect_message()
    assert msg.qos == 0
    sub.expect_no_message(0.7)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["v311", "v5"])
def test_unsubscribe_stops_delivery(broker, clients, protocol):
    """[MQTT-3.10.4-1]/[MQTT-3.10.4-2]: after UNSUBACK no new messages for that filter arrive;
    other subscriptions of the client are untouched."""
    p = unique("unsub")
    sub = clients.connected(broker, protocol=protocol)
    sub.subscribe(f"{p}/a", 1)
    sub.subscribe(f"{p}/b", 1)
    codes = sub.unsubscribe(f"{p}/a")
    if protocol == V5:
        assert codes == [0]
    pub = clients.connected(broker, protocol=protocol)
    pub.publish(f"{p}/a", b"gone", 1)
    pub.publish(f"{p}/b", b"kept", 1)
    msg = sub.expect_message()
    assert (msg.topic, msg.payload) == (f"{p}/b", b"kept")
    sub.expect_no_message(0.7)


def test_v5_unsubscribe_unknown_filter_0x11(broker, raw):
    """MQTT 5.0 3.11.3 / [MQTT-3.10.4-5]: UNSUBSCRIBE of a filter the client does not have is
    answered with UNSUBACK 0x11 (No subscription existed), in filter order."""
    p = unique("unk")
    c = raw(broker, version=5)
    c.connect(unique("unk"))
    c.subscribe(f"{p}/yes", 0)
    c.send(R.unsubscribe(9, [f"{p}/no", f"{p}/yes"], version=5))
    ack = c.expect(R.UNSUBACK)
    assert ack.packet_id == 9 and ack.reason_codes == [0x11, 0x00]


def test_311_unsuback_wire(broker, raw):
    """[MQTT-3.10.4-5] (3.1.1): UNSUBACK even when nothing was subscribed; exactly B0 02 <pid>."""
    c = raw(broker, version=4)
    c.connect(unique("unsack"))
    c.send(R.unsubscribe(0x0102, "never/subscribed"))
    ack = c.expect(R.UNSUBACK)
    assert ack.raw == b"\xb0\x02\x01\x02"


def test_suback_codes_in_order_multi_filter(broker, raw):
    """[MQTT-3.8.4-5]/[MQTT-3.9.3-1]: one SUBACK for a multi-filter SUBSCRIBE, one code per
    filter, in order, each the granted QoS."""
    p = unique("multi")
    c = raw(broker, version=4)
    c.connect(unique("multi"))
    ack = c.subscribe([(f"{p}/2", 2), (f"{p}/0", 0), (f"{p}/1", 1)], packet_id=0x0A0B)
    assert ack.raw == b"\x90\x05\x0a\x0b\x02\x00\x01"


INVALID_FILTERS = ["a/#/b", "a#", "a/b#", "a/+b", "+a/b", ""]


@pytest.mark.parametrize("flt", INVALID_FILTERS[:-1])
def test_v5_invalid_filter_suback_0x8f(broker, raw, flt):
    """[MQTT-4.7.1-1]/[MQTT-4.7.1-2]/[MQTT-4.7.3-1]: an invalid topic filter is refused; meshmq
    answers v5 with SUBACK 0x8F (Topic Filter invalid) for that filter while the valid filter
    in the same SUBSCRIBE is granted, and keeps the connection."""
    p = unique("inv")
    c = raw(broker, version=5)
    c.connect(unique("inv"))
    ack = c.subscribe([(f"{p}/ok", 1), (flt, 1)], packet_id=4)
    assert ack.reason_codes == [1, 0x8F], ack
    assert c.is_open()


@pytest.mark.parametrize("flt", INVALID_FILTERS)
def test_311_invalid_filter_disconnects(broker, raw, flt):
    """[MQTT-4.7.1-1]/[MQTT-4.7.1-2]/[MQTT-4.7.3-1] + [MQTT-4.8.0-1] (3.1.1): an invalid filter
    is a protocol violation and the server closes the connection (no SUBACK granting it)."""
    c = raw(broker, version=4)
    c.connect(unique("inv4"))
    c.send(R.subscribe(4, flt, 1))
    got = c.wait_closed()
    granted = [p for p in got if p.type == R.SUBACK and any(rc < 0x80 for rc in p.reason_codes)]
    assert not granted, got


def test_subscription_identifier_on_delivery(broker, clients):
    """MQTT 5.0 3.8.2.1.2 / [MQTT-3.3.4-3]: a subscription made with Subscription Identifier 7
    delivers with that identifier; a subscription without one delivers none."""
    p = unique("sid")
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(f"{p}/with", 1, properties=props(8, SubscriptionIdentifier=7))
    sub.subscribe(f"{p}/without", 1)
    pub = clients.connected(broker, protocol=V5)
    pub.publish(f"{p}/with", b"1", 1)
    m = sub.expect_message()
    assert getattr(m.properties, "SubscriptionIdentifier", None) == [7]
    pub.publish(f"{p}/without", b"2", 1)
    m2 = sub.expect_message()
    assert not hasattr(m2.properties, "SubscriptionIdentifier")


def test_v5_subscribe_reserved_option_bits_malformed(broker, raw):
    """[MQTT-3.8.3-5]: reserved bits 6-7 of the Subscription Options must be 0; otherwise the
    SUBSCRIBE is malformed and the connection is closed."""
    c = raw(broker, version=5)
    c.connect(unique("rsvopt"))
    c.send(R.subscribe(1, [(unique("x"), 0xC1)], version=5))
    got = c.wait_closed()
    assert all(p.type == R.DISCONNECT and p.reason_code >= 0x80 for p in got), got
