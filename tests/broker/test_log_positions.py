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
