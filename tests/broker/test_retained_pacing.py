"""Every retained message reaches a new subscriber (issue 27): sent on SUBSCRIBE paced by the
subscriber's window (EMQX's retainer flow control), never dropped for the bounded queue.

Before: a QoS 1 subscriber to ``ret/#`` over 5,000 retained topics received 1,032 (its window
plus ``mqtt.max_queued_messages``), the rest counted as ``queue_full``. Here 5,000 topics, a
QoS 1 subscriber announcing Receive Maximum 10 and a QoS 0 one: each gets all 5,000, none
twice, and the pacer's gauge is back to 0 afterwards. (20,000 topics with the default 1 MiB
socket write buffer took ~22 s of CI; 5,000 with a 64 KiB buffer are as far past it, 18 times,
so the QoS 0 subscriber's socket congests the same way: tests/mutations_admin.py's plants.)
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from helpers.broker import BrokerProc, wait_for
from helpers.clients import V5, ClientFactory, props, unique
from paho.mqtt.packettypes import PacketTypes

pytestmark = pytest.mark.timeout(300)

TOPICS = 5_000
WRITE_BUFFER = 64 * 1024  # mqtt.write_buffer_limit: TOPICS x ~230 bytes is 18 times this


def _load(broker: BrokerProc, clients: ClientFactory, prefix: str) -> None:
    pub = clients(broker, unique("rpub"), protocol=V5)
    pub.mqtt.max_inflight_messages_set(1000)  # pipelined: one at a time is slow here
    pub.mqtt.max_queued_messages_set(0)
    pub.connect()
    # QoS 1 retained messages (delivered at QoS 1 to a QoS 1 subscriber: its window counts)
    # of ~230 bytes: 5,000 of them are 1.15 MB, far past the 64 KiB write buffer a QoS 0
    # subscriber's socket may hold here (mqtt.write_buffer_limit)
    for i in range(TOPICS):
        pub.publish(f"{prefix}/{i}", f"v{i}:" + "x" * 200, qos=1, retain=True, wait=False)
    wait_for(lambda: broker.metric("meshmq_retained_messages") >= TOPICS, 120,
             message=f"{TOPICS} retained messages stored")
    pub.disconnect()


def _receive(broker: BrokerProc, sub: Any, n: int) -> set[str]:
    """What ``sub`` gets: until ``n`` messages, or until the broker owes it nothing more
    (no retained message pending, nothing in flight) and nothing came for 2 s: a broker that
    dropped some fails here at once, not at a timeout; one that stalls, after 60 s of
    silence."""
    got: list[Any] = []
    deadline = time.monotonic() + 240
    quiet_since = time.monotonic()
    while len(got) < n and time.monotonic() < deadline:
        more = sub.drain()
        if more:
            got += more
            quiet_since = time.monotonic()
            continue
        quiet = time.monotonic() - quiet_since
        if quiet > 60 or (quiet > 2 and broker.metric("meshmq_retained_pending") == 0
                          and broker.metric("meshmq_inflight_messages") == 0):
            break  # (60 s without one message while some are owed: a stall)
        time.sleep(0.05)
    topics = [m.topic for m in got]
    assert len(got) == n, (f"{sub.client_id} got {len(got)} of {n} retained messages; "
                           f"dropped: {broker.metric('meshmq_messages_dropped_total')}")
    assert all(m.retain for m in got)
    assert len(set(topics)) == len(topics), "a retained message came twice"
    return set(topics)


def test_every_retained_message_reaches_new_subscribers(tmp_path, clients: ClientFactory
                                                       ) -> None:
    broker = BrokerProc(tmp_path / "b", {"mqtt": {"max_queued_messages": 100,
                                                  "write_buffer_limit": WRITE_BUFFER}}, ws=False)
    broker.start()
    try:
        prefix = unique("ret")
        _load(broker, clients, prefix)
        want = {f"{prefix}/{i}" for i in range(TOPICS)}
        slow = clients(broker, unique("q1"), protocol=V5)
        slow.connect(properties=props(PacketTypes.CONNECT, ReceiveMaximum=10))
        slow.subscribe(f"{prefix}/#", 1)
        assert _receive(broker, slow, TOPICS) == want
        slow.expect_no_message(0.5)
        fast = clients(broker, unique("q0"), protocol=V5).connect()
        fast.subscribe(f"{prefix}/#", 0)
        assert _receive(broker, fast, TOPICS) == want
        assert broker.metric("meshmq_messages_dropped_total", reason="queue_full") == 0
        wait_for(lambda: broker.metric("meshmq_retained_pending") == 0, 20,
                 message="meshmq_retained_pending back to 0")
    finally:
        broker.stop()


def test_what_a_session_may_be_owed_is_bounded(tmp_path, clients: ClientFactory) -> None:
    """mqtt.max_retained_pending: a SUBSCRIBE owed more than the bound gets the bound's worth,
    the rest dropped, counted and logged (a client re-subscribing without reading must not
    grow the broker's memory without end)."""
    broker = BrokerProc(tmp_path / "b", {"mqtt": {"max_retained_pending": 50}}, ws=False)
    broker.start()
    try:
        pub = clients(broker, unique("bpub"), protocol=V5).connect()
        prefix = unique("bound")
        for i in range(200):
            pub.publish(f"{prefix}/{i}", f"v{i}", qos=1, retain=True, wait=False)
        wait_for(lambda: broker.metric("meshmq_retained_messages") >= 200, 60,
                 message="200 retained messages stored")
        offset = broker.log_size()
        sub = clients(broker, unique("bsub"), protocol=V5)
        sub.connect(properties=props(PacketTypes.CONNECT, ReceiveMaximum=10))
        sub.subscribe(f"{prefix}/#", 1)
        got = _receive(broker, sub, 50)
        assert len(got) == 50
        sub.expect_no_message(1.0)
        assert broker.metric("meshmq_messages_dropped_total", reason="retained_pending") == 150
        assert broker.metric("meshmq_limit_hits_total", limit="max_retained_pending") >= 1
        assert "limit max_retained_pending hit" in broker.log_since(offset)
    finally:
        broker.stop()


def test_a_resubscribe_replaces_what_its_filter_was_owed(tmp_path,
                                                          clients: ClientFactory) -> None:
    """A SUBSCRIBE to the same filter again asks for its retained messages again: it replaces
    what that filter was still owed instead of adding to it (nothing dropped for the bound
    that two copies would have passed)."""
    broker = BrokerProc(tmp_path / "b", {"mqtt": {"max_retained_pending": 150}}, ws=False)
    broker.start()
    try:
        pub = clients(broker, unique("rpub"), protocol=V5).connect()
        prefix = unique("again")
        for i in range(100):
            pub.publish(f"{prefix}/{i}", f"v{i}", qos=1, retain=True, wait=False)
        wait_for(lambda: broker.metric("meshmq_retained_messages") >= 100, 60,
                 message="100 retained messages stored")
        sub = clients(broker, unique("rsub"), protocol=V5, manual_ack=True)  # never acks:
        sub.connect(properties=props(PacketTypes.CONNECT, ReceiveMaximum=10))  # window stays
        sub.subscribe(f"{prefix}/#", 1)  # full, 90 stay owed
        sub.subscribe(f"{prefix}/#", 1)
        wait_for(lambda: broker.metric("meshmq_retained_pending") > 0, 20,
                 message="retained messages owed")
        assert broker.metric("meshmq_retained_pending") <= 100
        assert broker.metric("meshmq_messages_dropped_total", reason="retained_pending") == 0
    finally:
        broker.stop()
