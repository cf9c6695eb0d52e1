"""Review of the catch-up read's per-pump topic memo (issue 25, broker/catchup.py): what a
lagging session is fed from its device log must be what live routing would have sent it.

Real broker processes, raw MQTT clients (tests/helpers/devicelog.py): a subscriber that stops
reading falls behind onto the log (window and queue full), then reads it back.
- Overlapping subscriptions that carry one Subscription Identifier (one SUBSCRIBE with two
  filters shares its identifier): live routing sends it once [MQTT-3.3.4-3]
  (``DeliveryRoom.route``); the catch-up read sent it once per subscription.
- A subscription made while the session is behind takes only what was stored after it, and
  everything after it, through a pump that reads across that point (the memo is only for
  records no subscription is newer than).
"""

from __future__ import annotations

import time

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.devicelog import Publisher, Subscriber

pytestmark = pytest.mark.timeout(240)

# A small window and queue: a subscriber that stops reading is behind on the log after a few
# dozen messages, so the bursts below stay short on a loaded box.
MQTT = {"max_inflight": 8, "max_queued_messages": 10}


@pytest.fixture(scope="module")
def cbroker(module_broker_factory):
    return module_broker_factory(mqtt=MQTT)


def _publish(b, items: list[tuple[str, bytes]]) -> None:
    pub = Publisher(b.host, b.port, unique("r9pub"), window=64)
    try:
        pub.publish_all(items, timeout=120)
    finally:
        pub.close()


def _ids(pkt: R.Packet) -> list[int]:
    return list(pkt.properties.get(R.SUBSCRIPTION_IDENTIFIER, []))


def test_lagging_session_gets_each_subscription_identifier_once(cbroker):
    """Three subscriptions of one v5 session take every message of a device: devices/<d>/# and
    devices/<d>/t in one SUBSCRIBE (identifier 7, shared by both), devices/+/t in another
    (identifier 9). Live or read back from the log after the session stalled, each message
    carries 7 and 9 once each, as ``Router.route`` merges them [MQTT-3.3.4-3]; the catch-up
    read's merge (match_record) listed 7 twice."""
    b = cbroker
    device = unique("sids")
    n = 600
    slow = Subscriber(b.host, b.port, unique("sidsub"), version=5)
    try:
        slow.client.send(R.subscribe(1, [(f"devices/{device}/#", R.sub_options(1)),
                                         (f"devices/{device}/t", R.sub_options(1))],
                                     version=5, properties={R.SUBSCRIPTION_IDENTIFIER: 7}))
        ack = slow.client.expect(R.SUBACK)
        assert ack.reason_codes == [1, 1], ack
        slow.client.send(R.subscribe(2, [("devices/+/t", R.sub_options(1))], version=5,
                                     properties={R.SUBSCRIPTION_IDENTIFIER: 9}))
        ack = slow.client.expect(R.SUBACK)
        assert ack.reason_codes == [1], ack
        lagged = b.metric("meshmq_sessions_lagging")
        _publish(b, [(f"devices/{device}/t", str(i).encode()) for i in range(n)])
        wait_for(lambda: b.metric("meshmq_sessions_lagging") > lagged, timeout=30,
                 message="the stalled session to fall behind onto the log")
        got = slow.collect(n, timeout=50)  # (within the 60 s keepalive: no PINGREQ sent)
        slow.expect_quiet(0.5)
        assert [int(m.payload) for m in got] == list(range(n))
        bad = [(int(m.payload), _ids(m)) for m in got if sorted(_ids(m)) != [7, 9]]
        assert not bad, (f"{len(bad)} of {n} messages with other subscription identifiers "
                         f"than [7, 9] once each, e.g. {bad[:3]}")
    finally:
        slow.close()


def test_subscription_made_while_behind_takes_what_is_stored_after_it(cbroker):
    """A v5 session on devices/<d>/a stalls while 200 ``a`` then 300 ``b`` are stored; still
    behind, it subscribes to devices/<d>/b too; then 300 more ``b`` and 100 more ``a``. Read
    back from the log it gets every ``a`` once in order, and exactly the ``b`` stored after its
    second SUBSCRIBE, in order: none of the older ones (live routing never sent them), none of
    the newer ones lost. The older ``b`` take no window, so the pump that reads them reads on
    into the newer ones: an answer the per-pump memo kept for an older record (no
    subscription to ``b`` yet) must not be used for a newer one."""
    b = cbroker
    device = unique("newsub")
    n_a, n_b = 200, 300
    slow = Subscriber(b.host, b.port, unique("newsubsub"), version=5)
    try:
        slow.subscribe(f"devices/{device}/a", 1)
        lagged = b.metric("meshmq_sessions_lagging")
        _publish(b, [(f"devices/{device}/a", f"a{i}".encode()) for i in range(n_a)]
                 + [(f"devices/{device}/b", f"b{i}".encode()) for i in range(n_b)])
        wait_for(lambda: b.metric("meshmq_sessions_lagging") > lagged, timeout=30,
                 message="the stalled session to fall behind onto the log")
        # (subscribe() acks the PUBLISHes ahead of its SUBACK: the session reads on a little,
        # far from the older b's)
        slow.subscribe(f"devices/{device}/b", 1)
        _publish(b, [(f"devices/{device}/b", f"b{i}".encode()) for i in range(n_b, 2 * n_b)]
                 + [(f"devices/{device}/a", f"a{i}".encode()) for i in range(n_a, 2 * n_a)])
        want = 2 * n_a + n_b
        # read until everything came, or the session caught up and nothing more comes (a
        # lost message fails here at once, not at a timeout); 50 s: within the 60 s keepalive
        # of a client that sends no PINGREQ meanwhile
        deadline = time.monotonic() + 50
        while len(slow.messages) < want and time.monotonic() < deadline:
            before = len(slow.messages)
            slow.pump(0.5)
            if len(slow.messages) == before and \
                    b.metric("meshmq_sessions_lagging") <= lagged:
                break
        slow.expect_quiet(0.5)
        got = [m.payload.decode() for m in slow.messages]
        a = [int(p[1:]) for p in got if p[0] == "a"]
        bs = [int(p[1:]) for p in got if p[0] == "b"]
        assert a == list(range(2 * n_a)), (
            f"{len(a)} of {2 * n_a} 'a', first out of place at "
            f"{next((i for i, v in enumerate(a) if v != i), None)}")
        assert bs == list(range(n_b, 2 * n_b)), (
            f"{len(bs)} 'b' (want the {n_b} stored after the SUBSCRIBE): "
            f"older ones {[v for v in bs if v < n_b][:5]}, "
            f"missing {sorted(set(range(n_b, 2 * n_b)) - set(bs))[:5]}")
    finally:
        slow.close()


def test_lagging_v311_session_gets_the_highest_granted_qos_of_overlapping_filters(cbroker):
    """A v3.1.1 session subscribes devices/<d>/t at QoS 2, then devices/<d>/# at QoS 1, and
    stalls while 300 QoS 2 messages are stored. Read back from the log every one arrives once,
    in order, at QoS 2: the highest QoS granted by the overlapping subscriptions, as live
    routing merges them [MQTT-3.3.4-2], whichever subscription comes last."""
    b = cbroker
    device = unique("qosmerge")
    n = 300
    slow = Subscriber(b.host, b.port, unique("qossub"), version=4)
    try:
        slow.subscribe(f"devices/{device}/t", 2)
        slow.subscribe(f"devices/{device}/#", 1)
        lagged = b.metric("meshmq_sessions_lagging")
        pub = Publisher(b.host, b.port, unique("r9pub2"), window=64)
        try:
            pub.publish_all([(f"devices/{device}/t", str(i).encode()) for i in range(n)],
                            qos=2, timeout=120)
        finally:
            pub.close()
        wait_for(lambda: b.metric("meshmq_sessions_lagging") > lagged, timeout=30,
                 message="the stalled session to fall behind onto the log")
        got = slow.collect(n, timeout=50)  # (within the 60 s keepalive: no PINGREQ sent)
        slow.expect_quiet(0.5)
        assert [int(m.payload) for m in got] == list(range(n))
        low = [(int(m.payload), m.qos) for m in got if m.qos != 2]
        assert not low, f"{len(low)} of {n} messages below QoS 2, e.g. {low[:3]}"
    finally:
        slow.close()


PROPS = [(R.CONTENT_TYPE, "text/plain; charset=utf-8"), (R.RESPONSE_TOPIC, "replies/r9"),
         (R.CORRELATION_DATA, b"\x00\x01corr\xff"), (R.PAYLOAD_FORMAT_INDICATOR, 1),
         (R.USER_PROPERTY, ("k", "v1")), (R.USER_PROPERTY, ("k", "v2")),
         (R.USER_PROPERTY, ("clé", "été")), (R.MESSAGE_EXPIRY_INTERVAL, 600)]


def test_lagging_v5_session_gets_every_property_back_from_the_log(cbroker):
    """300 v5 publishes with every forwarded property (content type, response topic,
    correlation data, payload format, three user properties, one key twice, non-ASCII, and a
    600 s expiry), then 300 with none, while a v5 subscriber is stalled: read back from the log
    (broker/devicelogs.py record_message, which now skips the header parse for a record
    without headers) each message carries what the publisher sent, in order, and the plain
    ones carry nothing; the same as the first ones that went live."""
    b = cbroker
    device = unique("props")
    n = 300
    topic = f"devices/{device}/t"
    slow = Subscriber(b.host, b.port, unique("propsub"), version=5)
    try:
        slow.subscribe(f"devices/{device}/#", 1)
        lagged = b.metric("meshmq_sessions_lagging")
        pub = Publisher(b.host, b.port, unique("r9pub3"), window=64)
        try:
            pub.publish_all([(topic, f"p{i}".encode()) for i in range(n)], properties=PROPS,
                            timeout=120)
            pub.publish_all([(topic, f"q{i}".encode()) for i in range(n)], timeout=120)
        finally:
            pub.close()
        wait_for(lambda: b.metric("meshmq_sessions_lagging") > lagged, timeout=30,
                 message="the stalled session to fall behind onto the log")
        got = slow.collect(2 * n, timeout=50)  # (within the 60 s keepalive: no PINGREQ sent)
        slow.expect_quiet(0.5)
        assert [m.payload.decode() for m in got] == (
            [f"p{i}" for i in range(n)] + [f"q{i}" for i in range(n)])
        want = {R.CONTENT_TYPE: "text/plain; charset=utf-8", R.RESPONSE_TOPIC: "replies/r9",
                R.CORRELATION_DATA: b"\x00\x01corr\xff", R.PAYLOAD_FORMAT_INDICATOR: 1,
                R.USER_PROPERTY: [("k", "v1"), ("k", "v2"), ("clé", "été")]}
        bad = []
        for i, m in enumerate(got[:n]):
            props = dict(m.properties)
            expiry = props.pop(R.MESSAGE_EXPIRY_INTERVAL, None)
            if props != want or expiry is None or not 0 < expiry <= 600:
                bad.append((i, props, expiry))
        assert not bad, f"{len(bad)} of {n} messages with other properties, e.g. {bad[:2]}"
        plain = [(i, m.properties) for i, m in enumerate(got[n:]) if m.properties]
        assert not plain, f"{len(plain)} plain messages with properties, e.g. {plain[:2]}"
    finally:
        slow.close()


def test_lagging_session_is_not_fed_expired_messages_from_the_log(cbroker):
    """200 v5 publishes with a 1 s Message Expiry Interval, then 50 with none, to a stalled v5
    subscriber; 2.5 s later it reads again. From the log it gets none of the expired ones (only
    those its window took before it stalled) and every plain one, in order, and each expired
    one it did not get is counted as dropped, reason ``expired`` [MQTT-3.3.2-5]: the expiry is
    checked per record, the catch-up memo or not."""
    b = cbroker
    device = unique("expiry")
    topic = f"devices/{device}/t"
    n, plain = 200, 50
    slow = Subscriber(b.host, b.port, unique("expsub"), version=5)
    try:
        slow.subscribe(f"devices/{device}/#", 1)
        lagged = b.metric("meshmq_sessions_lagging")
        expired_before = b.metric("meshmq_messages_dropped_total", reason="expired")
        pub = Publisher(b.host, b.port, unique("r9pub4"), window=64)
        try:
            pub.publish_all([(topic, f"e{i}".encode()) for i in range(n)],
                            properties=[(R.MESSAGE_EXPIRY_INTERVAL, 1)], timeout=120)
            pub.publish_all([(topic, f"p{i}".encode()) for i in range(plain)], timeout=120)
        finally:
            pub.close()
        wait_for(lambda: b.metric("meshmq_sessions_lagging") > lagged, timeout=30,
                 message="the stalled session to fall behind onto the log")
        time.sleep(2.5)  # every expiring one is now past its interval
        window = MQTT["max_inflight"]
        # the window's (sent before they expired) and the plain ones; nothing else may come
        deadline = time.monotonic() + 50  # (within the 60 s keepalive: no PINGREQ sent)
        last = f"p{plain - 1}".encode()
        while time.monotonic() < deadline and not (
                slow.messages and slow.messages[-1].payload == last):
            slow.pump(0.5)
        slow.expect_quiet(0.5)
        got = [m.payload.decode() for m in slow.messages]
        early = [p for p in got if p[0] == "e"]
        assert early == [f"e{i}" for i in range(len(early))] and len(early) <= window, (
            f"{len(early)} expiring messages delivered (at most the window, {window}, sent "
            f"before they expired), e.g. {early[window:window + 3]}")
        assert [p for p in got if p[0] == "p"] == [f"p{i}" for i in range(plain)]
        wait_for(lambda: b.metric("meshmq_messages_dropped_total", reason="expired")
                 - expired_before >= n - len(early), timeout=10,
                 message=f"{n - len(early)} expired messages counted as dropped")
    finally:
        slow.close()
