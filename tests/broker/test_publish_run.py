"""A run of QoS 0 publishes on one topic, routed once (broker/publishrun.py, issue 25): what
every kind of subscriber receives, seen on the wire, must be what the packet-by-packet path
gives it. The publisher sends its whole stream in one write, so the broker reads runs; the
stream mixes in what ends a run (another topic, a QoS 1 publish, one with properties) and payloads
over one subscriber's Maximum Packet Size, and the subscribers cover each case the run's plan
decides or hands back to the per-packet path (v3.1.1, v5, a subscription identifier, two
overlapping filters, No Local, an offline session)."""

import time

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique

pytestmark = pytest.mark.timeout(90)

N = 150
# Runs are for live pub/sub: a topic no rule marks unlogged is stored in its topic group's
# log and takes the logged path (broker/logrules.py), as the bench marks bench/# unlogged.
LIVE = {"commitlog": {"rules": [{"filter": "live/#", "log": False},
                                {"filter": "devices/{device}/#"}]}}


def _stream(topic: str, other: str) -> tuple[bytes, list[bytes]]:
    """The publisher's bytes, and the payloads published on ``topic`` in order."""
    out, on_topic = [], []
    for i in range(N):
        payload = (b"L%03d" % i) * 100 if i % 10 == 3 else b"m%03d" % i  # 400 bytes or 4
        if i == 50:
            out.append(R.publish(other, b"elsewhere", version=5))
        if i == 100:
            out.append(R.publish(topic, payload, qos=1, packet_id=7, version=5))
        elif i == 120:  # (a property: a run takes none)
            out.append(R.publish(topic, payload, version=5,
                                 properties={R.USER_PROPERTY: [("k", "v")]}))
        else:
            out.append(R.publish(topic, payload, version=5))
        on_topic.append(payload)
    return b"".join(out), on_topic


def _payloads(c: R.RawClient, n: int, timeout: float = 20) -> list[R.Packet]:
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n}: {got[-3:]}"
        p = c.recv(timeout)
        if p.type == R.PUBLISH:
            got.append(p)
    return got


def _retained_on_subscribe(broker, raw, topic: str) -> R.Packet:
    """The first PUBLISH a new v3.1.1 subscriber of ``topic`` gets: the retained message."""
    late = raw(broker, version=4)
    late.connect(unique("late"))
    late.send(R.subscribe(1, [(topic, 0)]))
    (kept,) = _payloads(late, 1)
    return kept


@pytest.mark.parametrize("extra", ["runs", "sub-id", "overlap"])
def test_every_subscriber_gets_a_run_as_it_would_one_message_at_a_time(start_broker, raw,
                                                                        extra):
    """``sub-id`` and ``overlap`` add one subscriber a run's plan does not serve (a v5
    subscription identifier; two filters of one session that both match, whose copies are
    merged): every run then goes packet by packet (the reference path), and every other
    subscriber must get what it got with runs."""
    broker = start_broker(**LIVE)
    base = "live/" + unique("run")
    topic, other = f"{base}/t", f"{base}/u"
    subs = {}
    for name, version, props, filters in (
            ("v311", 4, None, [(topic, 0)]),
            ("v5", 5, None, [(topic, 0)]),
            ("v5-max", 5, None, [(topic, 0)]),
            *((("v5-id", 5, {R.SUBSCRIPTION_IDENTIFIER: 7}, [(topic, 0)]),)
              if extra == "sub-id" else ()),
            *((("overlap", 4, None, [(topic, 0), (f"{base}/+", 1)]),)
              if extra == "overlap" else ())):
        c = raw(broker, version=version)
        c.connect(unique(name), properties=({R.MAXIMUM_PACKET_SIZE: 256}
                                            if name == "v5-max" else None))
        c.send(R.subscribe(1, filters, version=version, properties=props))
        c.expect(R.SUBACK)
        subs[name] = c
    offline_id = unique("offline")
    off = raw(broker, version=4)
    off.connect(offline_id, clean=False)
    off.subscribe(topic, 0)
    off.disconnect()
    pub = raw(broker, version=5)
    pub.connect(unique("pub"))
    pub.send(R.subscribe(1, [(topic, R.sub_options(0, no_local=True))], version=5))
    pub.expect(R.SUBACK)
    too_large = broker.metric("meshmq_messages_dropped_total", reason="too_large")
    received = broker.metric("meshmq_messages_received_total")

    data, payloads = _stream(topic, other)
    pub.send(data)
    assert pub.expect(R.PUBACK).packet_id == 7

    for name in ("v311", "v5", "v5-id"):
        if name not in subs:
            continue
        got = _payloads(subs[name], N)
        assert [p.payload for p in got] == payloads, name
        assert all(p.topic == topic and p.qos == 0 and not p.retain for p in got), name
        if name == "v5":  # the message with a property, alone in its place
            assert [i for i, p in enumerate(got) if p.properties] == [120], got[120]
            assert got[120].properties[R.USER_PROPERTY] in ([("k", "v")], ("k", "v")), got[120]
        if name == "v5-id":
            assert all(p.properties.get(R.SUBSCRIPTION_IDENTIFIER) in (7, [7])
                       for p in got), got[:2]
        subs[name].expect_none(0.3)
    small = [p for p in payloads if len(p) < 256]
    got = _payloads(subs["v5-max"], len(small))
    assert [p.payload for p in got] == small
    subs["v5-max"].expect_none(0.3)
    if extra == "overlap":  # one copy each of the topic's messages, at the best granted
        # QoS (1: acked as they come), then the other topic's one
        over = subs["overlap"]
        got = _payloads(over, N + 1)
        for p in got:
            if p.qos:
                over.ack(p)
        on_topic = [p.payload for p in got if p.topic == topic]
        assert on_topic == payloads and [p.topic for p in got].count(other) == 1
    pub.expect_none(0.3)  # No Local: none of its own
    # (the node's metrics are its routers' counters as last reported: polled)
    wait_for(lambda: broker.metric("meshmq_messages_dropped_total", reason="too_large")
             == too_large + N - len(small), message="too_large drops counted once each")
    wait_for(lambda: broker.metric("meshmq_messages_received_total") == received + N + 1,
             message="every publish counted once")
    back = raw(broker, version=4)
    assert back.connect(offline_id, clean=False).session_present
    back.expect_none(0.5)  # QoS 0 is not queued for an offline session


def test_a_stalled_subscriber_of_runs_gets_an_ordered_prefix_then_what_follows(
        start_broker, raw):
    """Runs into a subscriber that stopped reading: its write buffer bound cuts each run at the
    message the per-packet congestion check would: what it reads once it reads again is in
    order, each message once, and every message it did not get is counted as a slow-consumer
    drop (never queued: QoS 0)."""
    b = start_broker(mqtt={"write_buffer_limit": 16384}, **LIVE)
    topic = "live/" + unique("stall")
    sub = raw(b, version=4, rcvbuf=4096)
    sub.connect(unique("stalled"))
    sub.subscribe(topic, 0)
    pub = raw(b, version=4)
    pub.connect(unique("pub"))
    n = 4000
    pub.send(b"".join(R.publish(topic, b"%06d" % i + b"x" * 200) for i in range(n)))
    pub.send(R.pingreq())
    pub.expect(R.PINGRESP, timeout=30)
    seen = []
    while True:
        try:
            p = sub.recv(1.0)
        except (TimeoutError, OSError):
            break
        if p.type == R.PUBLISH:
            seen.append(int(p.payload[:6]))
    assert seen and seen == sorted(seen) and len(set(seen)) == len(seen), seen[:20]
    # (the node's metrics are its routers' counters as last reported: polled, not read once)
    wait_for(lambda: len(seen) + b.metric("meshmq_messages_dropped_total",
                                          reason="slow_consumer") == n,
             timeout=10, message=f"{len(seen)} read + slow-consumer drops == {n}")
    assert len(seen) < n / 2  # the premise: the bound cut most of it


def test_a_retained_publish_that_would_start_a_run_is_kept_as_retained(start_broker, raw):
    """The first packet of a would-be run is checked like the rest: a retained publish (or one
    with properties) followed by plain ones on its topic is not routed as part of their run
    (the run path neither keeps nor flags retained messages)."""
    broker = start_broker(**LIVE)
    topic = "live/" + unique("kept")
    pub = raw(broker, version=4)
    pub.connect(unique("pub"))
    pub.send(R.publish(topic, b"kept", retain=True)
             + b"".join(R.publish(topic, b"p%d" % i) for i in range(20)))
    pub.send(R.pingreq())
    pub.expect(R.PINGRESP)
    kept = _retained_on_subscribe(broker, raw, topic)
    assert (kept.payload, kept.retain) == (b"kept", True), kept
    pub.publish(topic, b"", retain=True)


@pytest.mark.parametrize("runs", [False, True], ids=["per-packet", "run"])
def test_drops_of_a_congested_subscriber_with_a_size_limit_keep_their_reasons(
        start_broker, raw, runs):
    """A subscriber past its write buffer bound whose Maximum Packet Size some of a run's
    packets exceed: the per-packet path checks congestion before size, so a too-large message
    that comes while it is congested is a slow-consumer drop; a run must count the same
    (review13: runs counted every too-large one as too_large first)."""
    b = start_broker(mqtt={"write_buffer_limit": 1000}, **LIVE)
    topic, other = "live/" + unique("r"), "live/" + unique("nobody")
    sub = raw(b, version=5)
    sub.connect(unique("sub"), properties={R.MAXIMUM_PACKET_SIZE: 1100})
    sub.send(R.subscribe(1, [(topic, 0)], version=5))
    sub.expect(R.SUBACK)
    pub = raw(b, version=4)
    pub.connect(unique("pub"))

    def drops() -> tuple[float, float]:
        return (b.metric("meshmq_messages_dropped_total", reason="slow_consumer"),
                b.metric("meshmq_messages_dropped_total", reason="too_large"))

    before = drops()
    out = []
    for payload in (b"A" * 600, b"B" * 600, b"C" * 1500, b"D" * 600):
        out.append(R.publish(topic, payload))
        if not runs:  # a publish nobody gets between each: no run forms
            out.append(R.publish(other, b"x"))
    pub.send(b"".join(out))
    pub.send(R.pingreq())
    pub.expect(R.PINGRESP)
    assert [p.payload[:1] for p in _payloads(sub, 2)] == [b"A", b"B"]
    sub.expect_none(0.3)
    wait_for(lambda: tuple(a - z for a, z in zip(drops(), before, strict=True)) == (2, 0),
             timeout=10,
             message="C and D counted as slow-consumer drops (congested before C's size)")


@pytest.mark.parametrize("qos", [0, 1])
def test_a_retained_publish_keeps_its_place_among_the_live_ones(start_broker, raw, qos):
    """[MQTT-4.6.0-6]: one topic's messages reach a subscriber in the order their client sent
    them. A retained publish on an unlogged topic is routed once its retained record is
    durable; the plain ones its client sends after it (a run, here) wait behind it instead of
    overtaking it (they did, before and after the runs: found writing this file)."""
    broker = start_broker(**LIVE)
    topic = "live/" + unique("order")
    subs = []
    for version in (4, 5):
        c = raw(broker, version=version)
        c.connect(unique(f"s{version}"))
        c.send(R.subscribe(1, [(topic, 0)], version=version))
        c.expect(R.SUBACK)
        subs.append(c)
    pub = raw(broker, version=4)
    pub.connect(unique("pub"))
    out, payloads = [], []
    for i in range(60):
        payload = b"m%02d" % i
        if i in (20, 40):
            out.append(R.publish(topic, payload, qos=qos, retain=True,
                                 packet_id=i if qos else None))
        else:
            out.append(R.publish(topic, payload))
        payloads.append(payload)
    pub.send(b"".join(out))
    for c in subs:
        got = _payloads(c, len(payloads))
        assert [p.payload for p in got] == payloads
        assert not any(p.retain for p in got)  # live copies [MQTT-3.3.1-9]
    if qos:
        assert sorted(pub.expect(R.PUBACK).packet_id for _ in range(2)) == [20, 40]
    kept = _retained_on_subscribe(broker, raw, topic)
    assert (kept.payload, kept.retain) == (b"m40", True), kept
    pub.publish(topic, b"", retain=True)
