"""The log positions a session keeps (``broker/positions.py``) are bounded by
``mqtt.max_lagging_devices``: past it the oldest is forgotten, counted in
``meshmq_limit_hits_total{limit="max_lagging_devices"}`` and logged, and delivery goes on."""

from __future__ import annotations

from helpers.broker import metric_sum, wait_for
from helpers.clients import V5, PacketTypes, props, unique


def test_a_session_s_positions_are_bounded_by_max_lagging_devices(start_broker, clients):
    """max_lagging_devices 2, one persistent subscriber delivered from 5 device logs: the 3
    devices past the bound each forget the oldest position (3 hits, a log line naming the
    key), and every message is still delivered."""
    b = start_broker(mqtt={"max_lagging_devices": 2})
    tag = unique("pos")
    sub = clients.connected(b, unique("possub"), protocol=V5, clean=False, connect={
        "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=600)})
    sub.subscribe(f"devices/+/{tag}", 1)
    assert metric_sum(b.metrics(), "meshmq_limit_hits_total", limit="max_lagging_devices") == 0
    pub = clients.connected(b, protocol=V5)
    for i in range(5):
        pub.publish(f"devices/{tag}-{i}/{tag}", f"m{i}", 1)
    got = sorted(m.payload.decode() for m in sub.expect_messages(5, timeout=10))
    assert got == [f"m{i}" for i in range(5)]
    wait_for(lambda: metric_sum(b.metrics(), "meshmq_limit_hits_total",
                                limit="max_lagging_devices") == 3, timeout=10,
             message="3 positions forgotten, counted")
    assert "positions are full (mqtt.max_lagging_devices)" in b.log_text()


def test_a_retained_message_sent_on_subscribe_does_not_move_a_position_back(
        start_broker, clients):
    """A retained message of a device log (offset 0) is sent to a session on a later SUBSCRIBE,
    after it was delivered offsets 1-10 of the same log: its position there stays past 10, so
    after a graceful restart (SIGTERM: nothing is repeated, sessionstore.py) the session gets
    no message again."""
    b = start_broker()
    tag = unique("back")
    device = f"{tag}-d"
    cid = unique("backsub")
    connect = {"properties": props(PacketTypes.CONNECT, SessionExpiryInterval=600)}
    pub = clients.connected(b, protocol=V5)
    pub.publish(f"devices/{device}/state", "r", 1, retain=True)  # offset 0
    sub = clients.connected(b, cid, protocol=V5, clean=False, connect=connect)
    sub.subscribe(f"devices/{device}/t", 1)
    for i in range(10):
        pub.publish(f"devices/{device}/t", f"m{i}", 1)
    sub.expect_messages(10, timeout=10)
    sub.subscribe(f"devices/{device}/state", 1)
    assert sub.expect_message(timeout=10).payload == b"r"
    sub.disconnect()
    b.restart()
    again = clients.connected(b, cid, protocol=V5, clean=False, connect=connect)
    assert again.session_present
    pub = clients.connected(b, protocol=V5)
    pub.publish(f"devices/{device}/t", "after", 1)  # the sentinel: what was owed came first
    got = again.expect_message(timeout=10)
    assert got.payload == b"after", f"repeated after a graceful restart: {got.payload!r}"
