"""Will messages: abrupt close, normal DISCONNECT, v5 0x04, will delay, will retain, keepalive."""

import time

import pytest
from helpers import raw as R
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)


def _watcher(broker, clients, topic, protocol=V311, qos=1):
    w = clients.connected(broker, protocol=protocol)
    w.subscribe(topic, qos)
    return w


@pytest.mark.parametrize("version", [3, 4, 5])
def test_will_published_on_abrupt_close(broker, clients, raw, version):
    """[MQTT-3.1.2-8]: when the network connection closes without DISCONNECT the will message
    is published (topic, payload, QoS as given in CONNECT)."""
    topic = unique("will") + "/t"
    w = _watcher(broker, clients, topic)
    c = raw(broker, version=version)
    c.connect(unique("w"), will=R.Will(topic, b"gone", qos=1))
    c.abort()
    m = w.expect_message()
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"gone", 1, False)


def test_will_published_on_fin_close(broker, clients, raw):
    """[MQTT-3.1.2-8]: an orderly TCP close (FIN) without DISCONNECT also publishes the will."""
    topic = unique("willfin") + "/t"
    w = _watcher(broker, clients, topic)
    c = raw(broker, version=4)
    c.connect(unique("wf"), will=R.Will(topic, b"fin"))
    c.close()
    assert w.expect_message().payload == b"fin"


@pytest.mark.parametrize("version", [4, 5])
def test_will_not_published_on_normal_disconnect(broker, clients, raw, version):
    """[MQTT-3.1.2-10] (3.1.1) / [MQTT-3.14.4-3] (5.0): DISCONNECT (v5 reason 0x00) discards the
    will without publishing it."""
    topic = unique("nowill") + "/t"
    w = _watcher(broker, clients, topic)
    c = raw(broker, version=version)
    c.connect(unique("nw"), will=R.Will(topic, b"should-not"))
    c.send(R.disconnect(0x00 if version == 5 else None))
    c.wait_closed()
    w.expect_no_message(1.5)


def test_v5_disconnect_with_will_0x04(broker, clients, raw):
    """MQTT 5.0 3.14.2.1: DISCONNECT with reason 0x04 (Disconnect with Will Message) publishes
    the will."""
    topic = unique("will04") + "/t"
    w = _watcher(broker, clients, topic)
    c = raw(broker, version=5)
    c.connect(unique("w04"), will=R.Will(topic, b"asked-for"))
    c.send(R.disconnect(0x04))
    c.wait_closed()
    assert w.expect_message().payload == b"asked-for"


def test_will_retain(broker, clients, raw):
    """[MQTT-3.1.2-17]: a will with Will Retain 1 is published as a retained message: a later
    subscriber gets it with RETAIN=1."""
    topic = unique("willret") + "/t"
    c = raw(broker, version=4)
    c.connect(unique("wr"), will=R.Will(topic, b"retained-will", qos=1, retain=True))
    c.abort()
    deadline = time.monotonic() + 10
    while True:
        late = clients.connected(broker, protocol=V311)
        late.subscribe(topic, 1)
        try:
            m = late.expect_message(1.0)
            break
        except AssertionError:
            late.disconnect()
            if time.monotonic() >= deadline:
                pytest.fail("retained will never appeared")
    assert m.payload == b"retained-will"
    # On a logged topic the will is retained once stored; a subscriber that came in while it
    # was being stored got it live (RETAIN 0, [MQTT-3.3.1-9]). Once it has arrived, it is
    # retained: a new subscriber gets it from the retained store with RETAIN 1.
    later = clients.connected(broker, protocol=V311)
    later.subscribe(topic, 1)
    m = later.expect_message(10)
    assert (m.payload, m.retain) == (b"retained-will", True)


def test_will_not_retained_when_will_retain_0(broker, clients, raw):
    """[MQTT-3.1.2-16]: Will Retain 0 publishes the will as a non-retained message."""
    topic = unique("willnr") + "/t"
    w = _watcher(broker, clients, topic)
    c = raw(broker, version=4)
    c.connect(unique("wnr"), will=R.Will(topic, b"nr"))
    c.abort()
    assert w.expect_message().payload == b"nr"
    late = clients.connected(broker, protocol=V311)
    late.subscribe(topic, 1)
    late.expect_no_message(1.0)


@pytest.mark.timeout(40)
def test_will_published_on_keepalive_timeout(broker, clients, raw):
    """3.1.2.5 / [MQTT-3.1.2-24]: a client silent past 1.5x keepalive is disconnected "as if the
    network had failed", so its will is published."""
    topic = unique("willka") + "/t"
    w = _watcher(broker, clients, topic)
    c = raw(broker, version=4)
    c.connect(unique("wka"), keepalive=1, will=R.Will(topic, b"timeout"))
    assert w.expect_message(timeout=20).payload == b"timeout"


def test_v5_will_delay_cancelled_by_reconnect(broker, clients, raw):
    """[MQTT-3.1.2-26] (5.0): if the client reconnects before the Will Delay Interval passes,
    the will is not sent."""
    topic = unique("wdelay") + "/t"
    cid = unique("wd")
    w = _watcher(broker, clients, topic, protocol=V5)
    c = raw(broker, version=5)
    c.connect(cid, clean=True, properties={R.SESSION_EXPIRY_INTERVAL: 60},
              will=R.Will(topic, b"late", properties={R.WILL_DELAY_INTERVAL: 3}))
    c.abort()
    again = raw(broker, version=5)
    again.connect(cid, clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 60})
    w.expect_no_message(4.5)
    again.send(R.disconnect(0))


def test_v5_will_delay_then_published(broker, clients, raw):
    """[MQTT-3.1.2-8] (5.0): with Will Delay Interval 2 s and no reconnect, the will is
    published after the delay (and not at the moment of the disconnect)."""
    topic = unique("wdelay2") + "/t"
    w = _watcher(broker, clients, topic, protocol=V5)
    c = raw(broker, version=5)
    c.connect(unique("wd2"), clean=True, properties={R.SESSION_EXPIRY_INTERVAL: 60},
              will=R.Will(topic, b"delayed", properties={R.WILL_DELAY_INTERVAL: 2}))
    c.abort()
    w.expect_no_message(1.0)
    m = w.expect_message(timeout=15)
    assert m.payload == b"delayed"


def test_v5_will_delay_longer_than_session_expiry(broker, clients, raw):
    """[MQTT-3.1.2-8] (5.0): the will is published when the Will Delay Interval passes *or the
    session ends*, whichever is first: delay 60 s, session expiry 1 s -> published after ~1 s."""
    topic = unique("wdexp") + "/t"
    w = _watcher(broker, clients, topic, protocol=V5)
    c = raw(broker, version=5)
    c.connect(unique("wde"), clean=True, properties={R.SESSION_EXPIRY_INTERVAL: 1},
              will=R.Will(topic, b"session-ended", properties={R.WILL_DELAY_INTERVAL: 60}))
    c.abort()
    assert w.expect_message(timeout=15).payload == b"session-ended"


def test_v5_will_properties_forwarded(broker, clients, raw):
    """[MQTT-3.3.2-15]/[MQTT-3.3.2-20]/[MQTT-3.3.2-17]: the will's Content Type, Response Topic
    and User Properties are forwarded with the will message."""
    topic = unique("wprops") + "/t"
    w = _watcher(broker, clients, topic, protocol=V5)
    c = raw(broker, version=5)
    c.connect(unique("wp"), will=R.Will(topic, b"{}", properties=[
        (R.CONTENT_TYPE, "application/json"), (R.RESPONSE_TOPIC, "reply/here"),
        (R.USER_PROPERTY, ("k", "v"))]))
    c.abort()
    m = w.expect_message()
    assert m.properties.ContentType == "application/json"
    assert m.properties.ResponseTopic == "reply/here"
    assert m.properties.UserProperty == [("k", "v")]
