"""Subscriber-held offsets: replay a device log from a point, then follow it live.

MQTT 5 subscribers ask with SUBSCRIBE user properties ``offset`` (``earliest`` | ``latest`` |
``<N>`` | ``@<unix ms>``) and ``offset-reset``; MQTT 3.1.1 subscribers with the filter
``$replay/<offset>/<filter>``. A logged message delivered to a v5 subscription that holds an
offset carries the user properties ``device`` and ``offset`` after the publisher's own (other
subscribers get the publisher's user properties unaltered). Checks use exact offset sequences:
no gap and no duplicate, also across the replay/live seam while a publisher runs.
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers import raw as R
from helpers.broker import metric_sum, wait_for
from helpers.clients import V5, V311, PacketTypes, props, unique
from helpers.devicelog import (
    RETENTION_CONFIG,
    BrokerGroup,
    Publisher,
    Subscriber,
    log_list,
    log_position,
    offsets_of,
    retained_log,
    user_props,
)

pytestmark = pytest.mark.timeout(90)

RULES = [
    {"filter": "devices/{device}/#", "log": True},
    {"filter": "live/#", "log": False},
]


@pytest.fixture(scope="module")
def lbroker(tmp_path_factory):
    """One broker for the module: default log rules plus a live-only ``live/#``."""
    group = BrokerGroup()
    try:  # (stopped also when the start fails: no broker left running)
        yield group.start(tmp_path_factory.mktemp("replay"), rules=RULES)
    finally:
        group.stop_all()


@pytest.fixture
def peers(lbroker):
    """Factory of raw publishers/subscribers on the module broker, closed at the end."""
    made = []

    class Peers:
        def pub(self, window: int = 16, broker=None) -> Publisher:
            b = broker or lbroker
            p = Publisher(b.host, b.port, unique("pub"), window=window)
            made.append(p)
            return p

        def sub(self, version: int = 5, broker=None, **kw) -> Subscriber:
            b = broker or lbroker
            s = Subscriber(b.host, b.port, unique("sub"), version=version, **kw)
            made.append(s)
            return s

    yield Peers()
    for p in made:
        p.close()


def _payload(device: str, i: int) -> bytes:
    return f"{device}-msg-{i:05d}".encode()


def _publish(pub: Publisher, device: str, first: int, n: int, topic: str | None = None,
             properties=None) -> list[int]:
    """Publish n QoS 1 messages to devices/<device>/t; check and return the acked offsets."""
    topic = topic or f"devices/{device}/t"
    acks = pub.publish_all([(topic, _payload(device, first + i)) for i in range(n)],
                           properties=properties)
    out = []
    for a in acks:
        assert a.device == device, f"PUBACK names device {a.device!r}: {a.packet!r}"
        assert a.offset is not None, f"PUBACK has no offset property: {a.packet!r}"
        out.append(a.offset)
    return out


def _reason_string(ack: R.Packet) -> str:
    return ack.properties.get(R.REASON_STRING, "")


# --------------------------------------------------------------------------------------------
# offset = earliest / <N> / latest / @<ms>
# --------------------------------------------------------------------------------------------


def test_puback_offsets_and_earliest_replay_then_live(peers):
    pub = peers.pub()
    offs = _publish(pub, "r1", 0, 20, properties=[(R.USER_PROPERTY, ("src", "tester"))])
    assert offs == list(range(20)), "offsets are dense per device from 0"

    sub = peers.sub()
    ack = sub.subscribe("devices/r1/#", 1, offset="earliest")
    assert ack.reason_codes == [1], f"SUBACK {ack!r}"
    msgs = sub.collect(20)
    assert offsets_of(msgs, "r1") == list(range(20))
    assert [m.payload for m in msgs] == [_payload("r1", i) for i in range(20)]
    assert {m.topic for m in msgs} == {"devices/r1/t"}
    for i, m in enumerate(msgs):
        assert user_props(m) == [("src", "tester"), ("device", "r1"), ("offset", str(i))], (
            f"message {i}: publisher's user properties first, then device and offset: "
            f"{user_props(m)}"
        )
        assert m.qos == 1

    # The live stream follows the replay.
    assert _publish(pub, "r1", 20, 3) == [20, 21, 22]
    msgs = sub.collect(23)
    assert offsets_of(msgs[20:], "r1") == [20, 21, 22]
    assert [m.payload for m in msgs[20:]] == [_payload("r1", i) for i in range(20, 23)]
    sub.expect_quiet(0.3)


def test_device_and_offset_properties_only_for_offset_subscribers(peers):
    """A subscription that holds an offset (here ``latest``) gets ``device``/``offset`` after
    the publisher's user properties; a plain subscription gets the publisher's user properties
    unaltered ([MQTT-3.3.2-17]; README "device/offset properties only for offset subscribers").
    The brief's first contract gave them to every v5 subscriber; the README changed that."""
    plain = peers.sub()
    assert plain.subscribe("devices/rlive/#", 1).reason_codes == [1]
    holder = peers.sub()
    assert holder.subscribe("devices/rlive/#", 1, offset="latest").reason_codes == [1]
    pub = peers.pub()
    offs = _publish(pub, "rlive", 0, 3, properties=[(R.USER_PROPERTY, ("a", "1")),
                                                    (R.USER_PROPERTY, ("b", "2"))])
    assert offs == [0, 1, 2]
    assert [user_props(m) for m in holder.collect(3)] == [
        [("a", "1"), ("b", "2"), ("device", "rlive"), ("offset", str(o))] for o in offs
    ]
    assert [user_props(m) for m in plain.collect(3)] == [[("a", "1"), ("b", "2")]] * 3


def test_replay_from_offset_n(peers):
    pub = peers.pub()
    assert _publish(pub, "r2", 0, 20) == list(range(20))
    sub = peers.sub()
    assert sub.subscribe("devices/r2/#", 1, offset="7").reason_codes == [1]
    msgs = sub.collect(13)
    assert offsets_of(msgs, "r2") == list(range(7, 20))
    assert [m.payload for m in msgs] == [_payload("r2", i) for i in range(7, 20)]
    assert _publish(pub, "r2", 20, 1) == [20]
    msgs = sub.collect(14)
    assert offsets_of(msgs[13:], "r2") == [20]
    sub.expect_quiet(0.3)


def test_replay_from_end_offset_is_live_only(peers):
    """offset == end is inside the range: nothing to replay, then live."""
    pub = peers.pub()
    assert _publish(pub, "r2e", 0, 5) == list(range(5))
    sub = peers.sub()
    assert sub.subscribe("devices/r2e/#", 1, offset="5").reason_codes == [1]
    assert _publish(pub, "r2e", 5, 2) == [5, 6]
    assert offsets_of(sub.collect(2), "r2e") == [5, 6]
    sub.expect_quiet(0.3)


def test_latest_gets_only_new_messages(peers):
    pub = peers.pub()
    assert _publish(pub, "r3", 0, 10) == list(range(10))
    sub = peers.sub()
    assert sub.subscribe("devices/r3/#", 1, offset="latest").reason_codes == [1]
    assert _publish(pub, "r3", 10, 3) == [10, 11, 12]
    msgs = sub.collect(3)
    assert offsets_of(msgs, "r3") == [10, 11, 12], "latest: no backlog, only new messages"
    assert [m.payload for m in msgs] == [_payload("r3", i) for i in range(10, 13)]
    sub.expect_quiet(0.3)


def test_timestamp_offset_starts_at_first_message_at_or_after(peers):
    pub = peers.pub()
    assert _publish(pub, "r4", 0, 6) == list(range(6))
    time.sleep(0.05)  # separates the two batches in time; not a timing assertion
    t_ms = int(time.time() * 1000)
    time.sleep(0.05)
    assert _publish(pub, "r4", 6, 4) == [6, 7, 8, 9]
    sub = peers.sub()
    assert sub.subscribe("devices/r4/#", 1, offset=f"@{t_ms}").reason_codes == [1]
    msgs = sub.collect(4)
    assert offsets_of(msgs, "r4") == [6, 7, 8, 9]
    sub.expect_quiet(0.3)
    # A time before everything starts at the log start.
    sub2 = peers.sub()
    assert sub2.subscribe("devices/r4/#", 1, offset="@1000").reason_codes == [1]
    assert offsets_of(sub2.collect(10), "r4") == list(range(10))


def test_replay_delivers_only_messages_matching_the_filter(peers):
    pub = peers.pub()
    items = [(f"devices/r12/{'a' if i % 2 == 0 else 'b'}", _payload("r12", i))
             for i in range(12)]
    acks = pub.publish_all(items)
    assert [a.offset for a in acks] == list(range(12))
    sub = peers.sub()
    assert sub.subscribe("devices/r12/a", 1, offset="earliest").reason_codes == [1]
    msgs = sub.collect(6)
    assert offsets_of(msgs, "r12") == [0, 2, 4, 6, 8, 10]
    assert {m.topic for m in msgs} == {"devices/r12/a"}
    sub.expect_quiet(0.3)


def test_first_level_log_replays(peers):
    pub = peers.pub()
    topics = ["sensors/x/y", "sensors/z", "sensors/x/y", "sensors/q/r/s", "sensors/z"]
    acks = pub.publish_all([(t, f"s{i}".encode()) for i, t in enumerate(topics)])
    assert [(a.device, a.offset) for a in acks] == [("sensors", i) for i in range(5)]
    sub = peers.sub()
    assert sub.subscribe("sensors/#", 1, offset="earliest").reason_codes == [1]
    msgs = sub.collect(5)
    assert offsets_of(msgs, "sensors") == list(range(5))
    assert [(m.topic, m.payload) for m in msgs] == [(t, f"s{i}".encode())
                                                    for i, t in enumerate(topics)]


# --------------------------------------------------------------------------------------------
# Errors and offset-reset
# --------------------------------------------------------------------------------------------


def test_out_of_range_offset_is_refused_with_the_range(peers):
    pub = peers.pub()
    assert _publish(pub, "r6", 0, 5) == list(range(5))
    sub = peers.sub()
    ack = sub.subscribe("devices/r6/#", 1, offset="50")
    assert ack.reason_codes == [0x83], f"expected SUBACK 0x83, got {ack!r}"
    reason = _reason_string(ack)
    assert reason, f"SUBACK 0x83 without a reason string: {ack!r}"
    assert "0" in reason and "5" in reason, f"reason string does not name the range [0, 5]: " \
                                            f"{reason!r}"
    # The refused subscription does not exist: a new publish is not delivered.
    assert _publish(pub, "r6", 5, 1) == [5]
    sub.expect_quiet(0.3)


def test_offset_reset_earliest_starts_at_the_start(peers):
    pub = peers.pub()
    assert _publish(pub, "r7", 0, 5) == list(range(5))
    sub = peers.sub()
    ack = sub.subscribe("devices/r7/#", 1, offset="999", reset="earliest")
    assert ack.reason_codes == [1], f"SUBACK {ack!r}"
    assert offsets_of(sub.collect(5), "r7") == list(range(5))
    sub.expect_quiet(0.3)


def test_offset_reset_latest_starts_at_the_end(peers):
    pub = peers.pub()
    assert _publish(pub, "r7l", 0, 5) == list(range(5))
    sub = peers.sub()
    ack = sub.subscribe("devices/r7l/#", 1, offset="999", reset="latest")
    assert ack.reason_codes == [1], f"SUBACK {ack!r}"
    assert _publish(pub, "r7l", 5, 2) == [5, 6]
    assert offsets_of(sub.collect(2), "r7l") == [5, 6]
    sub.expect_quiet(0.3)


def test_offset_below_retained_start(tmp_path):
    """An offset deleted by retention: 0x83 naming the range, or offset-reset=earliest."""
    group = BrokerGroup()
    made = []
    try:
        broker = group.start(tmp_path, commitlog=RETENTION_CONFIG)
        start, end, payloads = retained_log(broker, "ret")

        def sub() -> Subscriber:
            s = Subscriber(broker.host, broker.port, unique("retsub"))
            made.append(s)
            return s

        ack = sub().subscribe("devices/ret/#", 1, offset="0")
        assert ack.reason_codes == [0x83], f"offset 0 < start {start}: expected 0x83, {ack!r}"
        reason = _reason_string(ack)
        assert str(start) in reason and str(end) in reason, (
            f"reason string does not name the range [{start}, {end}]: {reason!r}")

        s = sub()
        assert s.subscribe("devices/ret/#", 1, offset="0", reset="earliest").reason_codes == [1]
        msgs = s.collect(end - start)
        assert offsets_of(msgs, "ret") == list(range(start, end))
        assert [m.payload for m in msgs] == payloads[start:end]

        s = sub()
        assert s.subscribe("devices/ret/#", 1, offset="earliest").reason_codes == [1]
        assert offsets_of(s.collect(end - start), "ret") == list(range(start, end))
    finally:
        for s in made:
            s.close()
        group.stop_all()


@pytest.mark.parametrize("flt", ["devices/+/t", "devices/#", "#"])
def test_filter_covering_several_devices_is_refused(peers, flt):
    pub = peers.pub()
    _publish(pub, "r9a", 0, 1)
    _publish(pub, "r9b", 0, 1)
    sub = peers.sub()
    ack = sub.subscribe(flt, 1, offset="earliest")
    assert ack.reason_codes == [0x83], f"{flt!r} with offset=earliest: expected 0x83, got {ack!r}"


# --------------------------------------------------------------------------------------------
# The seam between replay and live, with a publisher running
# --------------------------------------------------------------------------------------------


class BackgroundPublisher(threading.Thread):
    """Publishes devices/<device>/t QoS 1 continuously (window 8) until told to stop."""

    def __init__(self, broker, device: str) -> None:
        super().__init__(daemon=True)
        self.pub = Publisher(broker.host, broker.port, unique("bgpub"), window=8)
        self.device = device
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    @property
    def acked(self) -> int:
        return len(self.pub.acks)

    def run(self) -> None:
        try:
            seq = 0
            while not self.stop_event.is_set():
                if self.pub.has_room():
                    self.pub.send(f"devices/{self.device}/t", _payload(self.device, seq),
                                  tag=seq)
                    seq += 1
                self.pub.poll(0.001 if self.pub.has_room() else 0.05)
            self.pub.drain(30)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), "background publisher did not stop"
        self.pub.close()
        if self.error is not None:
            raise AssertionError(f"background publisher failed: {self.error!r}")


def test_seam_between_replay_and_live_has_no_gap_and_no_duplicate(peers, lbroker):
    bg = BackgroundPublisher(lbroker, "seam")
    bg.start()
    try:
        wait_for(lambda: bg.acked >= 150 or bg.error, 30, message="150 acked publishes")
        sub = peers.sub()
        ack = sub.subscribe("devices/seam/#", 1, offset="earliest")
        assert ack.reason_codes == [1], f"SUBACK {ack!r}"
        at_sub = bg.acked
        deadline = time.monotonic() + 60
        while bg.acked < at_sub + 200 and bg.error is None:
            if time.monotonic() >= deadline:
                pytest.fail(f"publisher stalled at {bg.acked} acks")
            sub.pump(0.05)
    finally:
        bg.finish()
    acks = bg.pub.acks
    total = len(acks)
    assert all(a.reason_code < 0x80 and a.device == "seam" for a in acks)
    assert sorted(a.offset for a in acks) == list(range(total)), "publisher offsets are dense"
    payload_at = {a.offset: a.sent.payload for a in acks}
    msgs = sub.collect(total, timeout=30)
    offs = offsets_of(msgs, "seam")
    if offs != list(range(total)):
        dups = sorted({o for o in offs if offs.count(o) > 1})[:10]
        gaps = sorted(set(range(total)) - set(offs))[:10]
        first_bad = next((i for i, o in enumerate(offs) if o != i), None)
        raise AssertionError(
            f"subscriber that joined at {at_sub} acked messages received {len(offs)} messages "
            f"with offsets not exactly 0..{total - 1}: first bad index {first_bad} "
            f"(around: {offs[max(0, (first_bad or 0) - 3):(first_bad or 0) + 4]}), "
            f"duplicates {dups}, missing {gaps}"
        )
    assert [m.payload for m in msgs] == [payload_at[i] for i in range(total)]
    # And it follows the live stream afterwards.
    pub = peers.pub()
    assert _publish(pub, "seam", total, 2) == [total, total + 1]
    more = sub.collect(total + 2)
    assert offsets_of(more[total:], "seam") == [total, total + 1]
    sub.expect_quiet(0.3)


# --------------------------------------------------------------------------------------------
# MQTT 3.1.1: $replay/<offset>/<filter>
# --------------------------------------------------------------------------------------------


def test_v311_replay_filter_earliest_and_from_offset(peers, lbroker, clients):
    pub = peers.pub()
    assert _publish(pub, "r8", 0, 10) == list(range(10))

    c = clients.connected(lbroker, protocol=V311)
    assert c.subscribe("$replay/earliest/devices/r8/#", 1) == [1]
    msgs = c.expect_messages(10)
    assert [m.payload for m in msgs] == [_payload("r8", i) for i in range(10)]
    assert {m.topic for m in msgs} == {"devices/r8/t"}
    # live after the replay
    _publish(pub, "r8", 10, 1)
    assert c.expect_message().payload == _payload("r8", 10)
    assert c.unsubscribe("$replay/earliest/devices/r8/#") == []
    _publish(pub, "r8", 11, 1)
    c.expect_no_message(0.3)

    c2 = clients.connected(lbroker, protocol=V311)
    assert c2.subscribe("$replay/5/devices/r8/#", 1) == [1]
    msgs = c2.expect_messages(7)
    assert [m.payload for m in msgs] == [_payload("r8", i) for i in range(5, 12)]
    c2.expect_no_message(0.3)


def test_v311_raw_replay_filter_qos0(peers, lbroker):
    """Same with a raw 3.1.1 client at QoS 0: the order is the log order."""
    pub = peers.pub()
    assert _publish(pub, "r8q0", 0, 6) == list(range(6))
    sub = peers.sub(version=4)
    ack = sub.subscribe("$replay/2/devices/r8q0/#", 0)
    assert ack.reason_codes == [0], f"SUBACK {ack!r}"
    msgs = sub.collect(4)
    assert [m.payload for m in msgs] == [_payload("r8q0", i) for i in range(2, 6)]
    ack = sub.unsubscribe("$replay/2/devices/r8q0/#")
    _publish(pub, "r8q0", 6, 1)
    sub.expect_quiet(0.3)


def test_paho_v5_subscriber_with_offset_property(peers, lbroker, clients):
    pub = peers.pub()
    assert _publish(pub, "r10", 0, 4) == list(range(4))
    c = clients.connected(lbroker, protocol=V5)
    sp = props(PacketTypes.SUBSCRIBE)
    sp.UserProperty = [("offset", "1")]
    assert c.subscribe("devices/r10/#", 1, properties=sp) == [1]
    msgs = c.expect_messages(3)
    assert [m.payload for m in msgs] == [_payload("r10", i) for i in range(1, 4)]
    assert [m.properties.UserProperty for m in msgs] == [
        [("device", "r10"), ("offset", str(i))] for i in range(1, 4)
    ]


# --------------------------------------------------------------------------------------------
# Unlogged topics
# --------------------------------------------------------------------------------------------


def test_log_false_topic_is_delivered_live_but_not_logged(peers, lbroker):
    sub = peers.sub()
    assert sub.subscribe("live/#", 1).reason_codes == [1]
    pub = peers.pub()
    acks = pub.publish_all([("live/x", b"live-1"), ("live/y/z", b"live-2")])
    for a in acks:
        assert a.offset is None and a.device is None, (
            f"PUBACK of an unlogged publish names a log position: {a.packet!r}"
        )
    msgs = sub.collect(2)
    assert [(m.topic, m.payload) for m in msgs] == [("live/x", b"live-1"),
                                                    ("live/y/z", b"live-2")]
    for m in msgs:
        assert log_position(m) == (None, None), f"unlogged message carries a position: {m!r}"
    logs = log_list(lbroker)
    assert "live" not in logs and "x" not in logs, f"an unlogged topic has a log: {logs}"


# --------------------------------------------------------------------------------------------
# A backlog much larger than the outgoing window
# --------------------------------------------------------------------------------------------


def test_qos1_backlog_larger_than_max_inflight_is_replayed_whole(tmp_path):
    group = BrokerGroup()
    try:
        # A small tail cache and small segments: most of the replay reads the segment files.
        broker = group.start(tmp_path, mqtt={"max_inflight": 10}, commitlog={
            "tail_cache_bytes_per_device": 4096, "segment_bytes": 32 * 1024})
        n = 2000
        pub = Publisher(broker.host, broker.port, unique("bigpub"), window=64)
        acks = pub.publish_all([("devices/big/t", _payload("big", i)) for i in range(n)],
                               timeout=60)
        pub.close()
        assert [a.offset for a in acks] == list(range(n))
        sub = Subscriber(broker.host, broker.port, unique("bigsub"))
        try:
            assert sub.subscribe("devices/big/#", 1, offset="earliest").reason_codes == [1]
            msgs = sub.collect(n, timeout=60)
            offs = offsets_of(msgs, "big")
            assert offs == list(range(n)), (
                f"first bad index {next((i for i, o in enumerate(offs) if o != i), None)}"
            )
            assert [m.payload for m in msgs] == [_payload("big", i) for i in range(n)]
            assert all(m.qos == 1 for m in msgs)
            sub.expect_quiet(0.3)
        finally:
            sub.close()
        metrics = broker.metrics()
        assert any(k.startswith("meshmq_messages_dropped_total") for k in metrics), \
            "meshmq_messages_dropped_total missing from /metrics"
        dropped = metric_sum(metrics, "meshmq_messages_dropped_total")
        assert dropped == 0, {k: v for k, v in metrics.items() if "dropped" in k and v}
    finally:
        group.stop_all()
