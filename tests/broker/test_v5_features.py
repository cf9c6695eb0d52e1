"""MQTT 5 features: topic aliases, maximum packet size, message expiry, no local, properties."""

import time

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import V5, SubscribeOptions, props, unique

pytestmark = pytest.mark.timeout(60)


def _raw_sub(broker, raw, topic, qos=1, **connect_kw):
    c = raw(broker, version=5)
    c.connect(unique("s5"), **connect_kw)
    assert c.subscribe(topic, qos).reason_codes == [qos]
    return c


# --------------------------------------------------------------------------------------------
# Topic aliases
# --------------------------------------------------------------------------------------------


def test_inbound_topic_alias(broker, raw, clients):
    """[MQTT-3.3.2-12]: the server accepts Topic Alias values 1..Topic Alias Maximum (10 by
    default): PUBLISH(topic, alias 1) sets the mapping, PUBLISH("", alias 1) uses it."""
    topic = unique("alias") + "/t"
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(topic, 1)
    c = raw(broker, version=5)
    ack = c.connect(unique("al"))
    assert ack.properties.get(R.TOPIC_ALIAS_MAXIMUM) == 10
    c.publish(topic, b"first", 1, packet_id=1, properties={R.TOPIC_ALIAS: 1})
    c.publish("", b"second", 1, packet_id=2, properties={R.TOPIC_ALIAS: 1})
    c.publish("", b"third", 1, packet_id=3, properties={R.TOPIC_ALIAS: 1})
    got = [(m.topic, m.payload) for m in sub.expect_messages(3)]
    assert got == [(topic, b"first"), (topic, b"second"), (topic, b"third")]


def test_inbound_topic_alias_remap(broker, raw, clients):
    """MQTT 5.0 3.3.2.3.4: a PUBLISH with a non-empty topic and an alias already in use replaces
    the mapping."""
    p = unique("remap")
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(f"{p}/#", 1)
    c = raw(broker, version=5)
    c.connect(unique("rm"))
    c.publish(f"{p}/a", b"1", 1, packet_id=1, properties={R.TOPIC_ALIAS: 2})
    c.publish(f"{p}/b", b"2", 1, packet_id=2, properties={R.TOPIC_ALIAS: 2})
    c.publish("", b"3", 1, packet_id=3, properties={R.TOPIC_ALIAS: 2})
    got = [(m.topic, m.payload) for m in sub.expect_messages(3)]
    assert got == [(f"{p}/a", b"1"), (f"{p}/b", b"2"), (f"{p}/b", b"3")]


@pytest.mark.parametrize("alias", [11, 0, 65535])
def test_inbound_topic_alias_out_of_range_0x94(broker, raw, alias):
    """[MQTT-3.3.2-9]/[MQTT-3.3.2-8] + 3.3.2.3.4: a Topic Alias of 0 or above the server's Topic
    Alias Maximum is a protocol error: DISCONNECT 0x94 (Topic Alias invalid), then close."""
    c = raw(broker, version=5)
    c.connect(unique("alx"))
    c.send(R.publish(unique("alx") + "/t", b"x", qos=1, packet_id=1, version=5,
                     properties={R.TOPIC_ALIAS: alias}))
    got = c.wait_closed()
    assert [p.reason_code for p in got if p.type == R.DISCONNECT] == [0x94], got
    assert not [p for p in got if p.type == R.PUBACK], got


def test_inbound_unknown_alias_with_empty_topic_is_error(broker, raw):
    """3.3.2.3.4: an empty topic with an alias that has no mapping on this connection is a
    protocol error (DISCONNECT 0x82 or 0x94, then close)."""
    c = raw(broker, version=5)
    c.connect(unique("alu"))
    c.send(R.publish("", b"x", qos=1, packet_id=1, version=5, properties={R.TOPIC_ALIAS: 3}))
    got = c.wait_closed()
    codes = [p.reason_code for p in got if p.type == R.DISCONNECT]
    assert codes and codes[0] in (0x82, 0x94), got


def test_topic_alias_mapping_not_carried_across_connections(broker, raw):
    """[MQTT-3.3.2-7]: aliases are per network connection: after reconnecting, using alias 1
    with an empty topic is an error."""
    cid = unique("alc")
    c = raw(broker, version=5)
    c.connect(cid)
    c.publish(unique("alc") + "/t", b"x", 1, packet_id=1, properties={R.TOPIC_ALIAS: 1})
    c.disconnect(0)
    c2 = raw(broker, version=5)
    c2.connect(cid)
    c2.send(R.publish("", b"y", qos=1, packet_id=2, version=5, properties={R.TOPIC_ALIAS: 1}))
    got = c2.wait_closed()
    assert [p for p in got if p.type == R.DISCONNECT and p.reason_code >= 0x80], got


def test_outbound_topic_alias_respects_client_maximum(broker, raw, clients):
    """[MQTT-3.1.2-29]/[MQTT-3.3.2-11]: if the server uses topic aliases towards a client that
    announced Topic Alias Maximum 2, every alias is 1..2 and each message resolves to its real
    topic (an empty topic only with an alias the server set before)."""
    p = unique("outal")
    sub = raw(broker, version=5)
    sub.connect(unique("oa"), properties={R.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe(f"{p}/#", 0)
    pub = clients.connected(broker, protocol=V5)
    topics = [f"{p}/{i % 3}" for i in range(12)]
    for i, t in enumerate(topics):
        pub.publish(t, str(i), 0 if i % 2 else 1)
    mapping: dict[int, str] = {}
    resolved = []
    alias_only = 0
    for _ in topics:
        m = sub.expect(R.PUBLISH)
        alias = m.properties.get(R.TOPIC_ALIAS)
        if alias is not None:
            assert 1 <= alias <= 2, f"alias {alias} above the client's maximum 2"
            if m.topic:
                mapping[alias] = m.topic
            else:
                assert alias in mapping, f"empty topic with unmapped alias {alias}"
                alias_only += 1
        else:
            assert m.topic, "empty topic without a topic alias"
        resolved.append(m.topic or mapping[alias])
        if m.qos:
            sub.ack(m)
    assert resolved == topics
    # meshmq does alias outbound (the issue asks for both directions): the two topics that got
    # an alias (of 3) are sent alias-only after their first time: 6 of the 12 messages.
    assert alias_only == 6, f"{alias_only} alias-only messages; expected 6"


def test_no_outbound_alias_when_client_maximum_absent(broker, raw, clients):
    """[MQTT-3.1.2-30]: a client that sent no Topic Alias Maximum never gets a Topic Alias."""
    topic = unique("noal") + "/t"
    sub = _raw_sub(broker, raw, topic, 0)
    pub = clients.connected(broker, protocol=V5)
    for i in range(5):
        pub.publish(topic, str(i), 0)
    for _ in range(5):
        m = sub.expect(R.PUBLISH)
        assert m.topic == topic and R.TOPIC_ALIAS not in m.properties, m


# --------------------------------------------------------------------------------------------
# Maximum packet size, receive maximum (client side)
# --------------------------------------------------------------------------------------------


def test_client_maximum_packet_size_respected(broker, raw, clients):
    """[MQTT-3.1.2-27]/[MQTT-3.1.2-28]: the server does not send a packet larger than the
    client's Maximum Packet Size; it discards it (counted as too_large) and goes on."""
    topic = unique("mps") + "/t"
    sub = _raw_sub(broker, raw, topic, 1, properties={R.MAXIMUM_PACKET_SIZE: 256})
    before = broker.metric("meshmq_messages_dropped_total", reason="too_large")
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"B" * 1000, 1)
    pub.publish(topic, b"small", 1)
    m = sub.expect(R.PUBLISH)
    assert m.payload == b"small"
    assert len(m.raw) <= 256
    sub.ack(m)
    sub.expect_none(1.0)
    wait_for(lambda: broker.metric("meshmq_messages_dropped_total", reason="too_large") > before,
             timeout=5, message='meshmq_messages_dropped_total{reason="too_large"} to increase')


def test_client_receive_maximum_limits_server_window(broker, raw, clients):
    """[MQTT-3.3.4-9]/[MQTT-4.9.0-2]: the server never has more unacknowledged QoS 1 PUBLISH
    packets outstanding than the client's Receive Maximum (2 here)."""
    topic = unique("rm") + "/t"
    sub = _raw_sub(broker, raw, topic, 1, properties={R.RECEIVE_MAXIMUM: 2})
    pub = clients.connected(broker, protocol=V5)
    for i in range(6):
        pub.publish(topic, str(i), 1)
    first = [sub.expect(R.PUBLISH) for _ in range(2)]
    sub.expect_none(1.0)
    got = [m.payload for m in first]
    for _ in range(4):
        sub.ack(first.pop(0))
        nxt = sub.expect(R.PUBLISH)
        first.append(nxt)
        got.append(nxt.payload)
        sub.expect_none(0.3)
    assert got == [str(i).encode() for i in range(6)]


# --------------------------------------------------------------------------------------------
# Message expiry
# --------------------------------------------------------------------------------------------


def test_message_expiry_in_offline_queue(broker, raw, clients):
    """[MQTT-3.3.2-5]/[MQTT-3.3.2-6]: a queued message whose expiry passed is not delivered;
    one still valid is delivered with the remaining interval (less than sent)."""
    cid = unique("mexp")
    topic = unique("mexp") + "/t"
    c = raw(broker, version=5)
    c.connect(cid, properties={R.SESSION_EXPIRY_INTERVAL: 120})
    c.subscribe(topic, 1)
    c.disconnect(0)
    before = broker.metric("meshmq_messages_dropped_total", reason="expired")
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"short", 1, properties=props(MessageExpiryInterval=1))
    pub.publish(topic, b"long", 1, properties=props(MessageExpiryInterval=60))
    pub.publish(topic, b"forever", 1)
    time.sleep(2.5)
    c2 = raw(broker, version=5)
    assert c2.connect(cid, clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 120}
                      ).session_present
    m1 = c2.expect(R.PUBLISH)
    c2.ack(m1)
    m2 = c2.expect(R.PUBLISH)
    c2.ack(m2)
    assert [m1.payload, m2.payload] == [b"long", b"forever"]
    remaining = m1.properties.get(R.MESSAGE_EXPIRY_INTERVAL)
    assert remaining is not None and 1 <= remaining <= 58, m1
    assert R.MESSAGE_EXPIRY_INTERVAL not in m2.properties, m2
    c2.expect_none(1.0)
    wait_for(lambda: broker.metric("meshmq_messages_dropped_total", reason="expired") > before,
             timeout=5, message='meshmq_messages_dropped_total{reason="expired"} to increase')


def test_message_expiry_forwarded_live(broker, clients):
    """[MQTT-3.3.2-6]: a live-forwarded message carries a Message Expiry Interval no greater
    than the one it was published with."""
    topic = unique("mexpl") + "/t"
    sub = clients.connected(broker, protocol=V5)
    sub.subscribe(topic, 1)
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"x", 1, properties=props(MessageExpiryInterval=30))
    m = sub.expect_message()
    assert 0 < m.properties.MessageExpiryInterval <= 30


# --------------------------------------------------------------------------------------------
# Subscription options, properties passed through
# --------------------------------------------------------------------------------------------


def test_no_local(broker, clients):
    """[MQTT-3.8.3-3]: with No Local 1 a client does not receive its own publications, but
    does receive other clients' publications on the same topic."""
    topic = unique("nolocal") + "/t"
    me = clients.connected(broker, protocol=V5)
    me.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True))
    me.publish(topic, b"mine", 1)
    other = clients.connected(broker, protocol=V5)
    other.publish(topic, b"theirs", 1)
    m = me.expect_message()
    assert m.payload == b"theirs"
    me.expect_no_message(0.7)


def test_no_local_off_receives_own(broker, clients):
    """No Local 0 (default): a client receives its own publications."""
    topic = unique("local") + "/t"
    me = clients.connected(broker, protocol=V5)
    me.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=False))
    me.publish(topic, b"mine", 1)
    assert me.expect_message().payload == b"mine"


def test_request_response_properties_pass_through(broker, raw, clients):
    """[MQTT-3.3.2-4]/[MQTT-3.3.2-15]/[MQTT-3.3.2-16]/[MQTT-3.3.2-17]/[MQTT-3.3.2-18]/
    [MQTT-3.3.2-20]: Payload Format Indicator, Response Topic, Correlation Data, Content Type and
    User Properties (order and duplicates kept) reach the subscriber unaltered."""
    topic = unique("rr") + "/req"
    sub = _raw_sub(broker, raw, topic, 1)
    pub = raw(broker, version=5)
    pub.connect(unique("rrp"))
    user = [("b", "2"), ("a", "1"), ("b", "3"), ("ünï", "çødé")]
    pub.publish(topic, "héllo".encode(), 1, packet_id=1, properties=[
        (R.PAYLOAD_FORMAT_INDICATOR, 1),
        (R.RESPONSE_TOPIC, "reply/to/me"),
        (R.CORRELATION_DATA, b"\x00\x01corr\xff"),
        (R.CONTENT_TYPE, "text/plain; charset=utf-8"),
        *[(R.USER_PROPERTY, kv) for kv in user],
    ])
    m = sub.expect(R.PUBLISH)
    assert m.payload == "héllo".encode()
    assert m.properties.get(R.PAYLOAD_FORMAT_INDICATOR) == 1
    assert m.properties.get(R.RESPONSE_TOPIC) == "reply/to/me"
    assert m.properties.get(R.CORRELATION_DATA) == b"\x00\x01corr\xff"
    assert m.properties.get(R.CONTENT_TYPE) == "text/plain; charset=utf-8"
    assert m.properties.get(R.USER_PROPERTY) == user


def test_request_response_round_trip_paho(broker, clients):
    """Request/response (MQTT 5.0 4.10): a responder answers on the Response Topic with the
    Correlation Data it received; the requester gets it back unaltered."""
    p = unique("rrt")
    responder = clients.connected(broker, protocol=V5)
    responder.subscribe(f"{p}/req", 1)
    requester = clients.connected(broker, protocol=V5)
    requester.subscribe(f"{p}/resp", 1)
    requester.publish(f"{p}/req", b"ping", 1,
                      properties=props(ResponseTopic=f"{p}/resp", CorrelationData=b"42"))
    req = responder.expect_message()
    responder.publish(req.properties.ResponseTopic, b"pong", 1,
                      properties=props(CorrelationData=req.properties.CorrelationData))
    resp = requester.expect_message()
    assert (resp.payload, resp.properties.CorrelationData) == (b"pong", b"42")


def test_request_problem_information_0_no_reason_string(broker, raw):
    """[MQTT-3.1.2-32]: with Request Problem Information 0 the server sends no Reason String or
    User Property on packets other than PUBLISH, CONNACK and DISCONNECT (here: UNSUBACK 0x11
    and SUBACK for an invalid filter)."""
    c = raw(broker, version=5)
    c.connect(unique("rpi"), properties={R.REQUEST_PROBLEM_INFORMATION: 0})
    c.send(R.unsubscribe(3, unique("never"), version=5))
    ack = c.expect(R.UNSUBACK)
    assert ack.reason_codes == [0x11]
    assert R.REASON_STRING not in ack.properties and R.USER_PROPERTY not in ack.properties, ack
    c.send(R.subscribe(4, [("bad/#/filter", 1)], version=5))
    sack = c.expect(R.SUBACK)
    assert R.REASON_STRING not in sack.properties and R.USER_PROPERTY not in sack.properties, sack


def test_publish_with_subscription_identifier_from_client_is_error(broker, raw):
    """[MQTT-3.3.4-6]: a PUBLISH from a client must not contain a Subscription Identifier; the
    server treats it as a protocol error (DISCONNECT >= 0x80, close)."""
    c = raw(broker, version=5)
    c.connect(unique("pubsid"))
    c.send(R.publish(unique("x"), b"x", qos=1, packet_id=1, version=5,
                     properties={R.SUBSCRIPTION_IDENTIFIER: [5]}))
    got = c.wait_closed()
    assert all(p.type == R.DISCONNECT and p.reason_code >= 0x80 for p in got), got


def test_no_local_on_shared_subscription_is_protocol_error(broker, raw):
    """[MQTT-3.8.3-4]: No Local 1 on a Shared Subscription is a protocol error."""
    c = raw(broker, version=5)
    c.connect(unique("nlshare"))
    c.send(R.subscribe(1, [(f"$share/g/{unique('x')}", R.sub_options(1, no_local=True))],
                       version=5))
    got = c.wait_closed()
    assert all(p.type == R.DISCONNECT and p.reason_code >= 0x80 for p in got), got
