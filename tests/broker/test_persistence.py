"""Retained messages and persistent sessions survive SIGTERM and kill -9 (issue 13).

Real broker processes restarted on the same data directory, real paho clients, raw sockets where
the wire matters (DUP flags, packet ids, PUBREL after a restart). Every restart test runs twice:
``sigterm`` (graceful: the state is written at shutdown) and ``kill9`` (SIGKILL: only what was
stored before it counts, so what was acknowledged right before the kill must come back).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import raw as r
from helpers.broker import BrokerProc
from helpers.clients import V5, props, unique
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

# A short checkpoint interval, so the kill -9 variants need not wait 5 s for delivery progress.
PERSIST = {"mqtt": {"persistence_interval": 0.2},
           "commitlog": {"rules": [{"filter": "devices/{device}/#"},
                                   {"filter": "live/#", "log": False}]}}
MODES = ["sigterm", "kill9"]


def _restart(broker: BrokerProc, mode: str) -> None:
    if mode == "sigterm":
        assert broker.stop() == 0, broker.log_tail()
    else:
        broker.kill()
    broker.start()


def _session_props(expiry: int = 3600):
    return props(PacketTypes.CONNECT, SessionExpiryInterval=expiry)


def _sub_id(msg) -> list[int]:
    return list(getattr(msg.properties, "SubscriptionIdentifier", []) or [])


@pytest.mark.parametrize("mode", MODES)
def test_issue_scenario_retained_and_queued_survive(start_broker, clients, mode):
    """The issue's reproduction: a v5 session (clean_start=False, expiry 3600) subscribed to
    alice/q/# with options and a subscription id goes offline; 3 QoS 1 messages and retained
    messages (a logged topic and an unlogged one) are published and acknowledged; the broker
    stops (SIGTERM, or kill -9 right after the last PUBACK) and starts again. The session is
    present, the 3 messages arrive with the subscription's id and options, and both retained
    messages are there."""
    broker = start_broker(**PERSIST)
    cid = unique("alice")
    sub = clients(broker, cid, protocol=V5, clean=False)
    sub.connect(properties=_session_props(), clean_start=True)
    opts = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True)
    assert sub.subscribe("alice/q/#", options=opts,
                         properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7)) == [1]
    sub.disconnect()

    pub = clients(broker, protocol=V5).connect()
    for i in range(3):
        pub.publish(f"alice/q/{i}", f"m{i}".encode(), qos=1)
    pub.publish("alice/state", b"retained-logged", qos=1, retain=True)
    pub.publish("live/cfg", b"retained-unlogged", qos=1, retain=True)  # log = false rule
    pub.stop()
    _restart(broker, mode)  # kill9: right after the last PUBACK

    assert broker.metric("meshmq_persistence_restored", kind="retained") == 2
    assert broker.metric("meshmq_persistence_restored", kind="sessions") == 1
    sub = clients(broker, cid, protocol=V5, clean=False)
    sub.connect(properties=_session_props(), clean_start=False)
    assert sub.session_present, "the persistent session did not survive the restart"
    got = sub.expect_messages(3)
    assert sorted(m.payload for m in got) == [b"m0", b"m1", b"m2"]
    assert all(m.qos == 1 and _sub_id(m) == [7] for m in got), [(m.qos, m.properties)
                                                                for m in got]
    # retain_as_published kept: a retained publish matching the filter arrives with RETAIN 1
    pub = clients(broker, protocol=V5).connect()
    pub.publish("alice/q/r", b"rap", qos=1, retain=True)
    m = sub.expect_message(topic="alice/q/r")
    assert m.retain, "retain_as_published was not restored"
    # No Local kept: the session's own publish does not come back to it
    sub.publish("alice/q/own", b"own", qos=1)
    sub.expect_no_message(wait=0.7, topic="alice/q/own")

    fresh = clients(broker, protocol=V5).connect()
    fresh.subscribe([("alice/state", 1), ("live/cfg", 1)])
    got = {m.topic: m for m in fresh.expect_messages(2)}
    assert got["alice/state"].payload == b"retained-logged" and got["alice/state"].retain
    assert got["live/cfg"].payload == b"retained-unlogged" and got["live/cfg"].retain


@pytest.mark.parametrize("mode", MODES)
def test_inflight_redelivered_with_dup_and_qos2_receive_state(start_broker, raw, mode):
    """In-flight QoS 1 comes back with DUP=1 and its packet id; a QoS 2 publish whose PUBREC
    was sent (the last thing before kill -9) completes when PUBREL is sent after the restart,
    and a resent PUBLISH of it is not stored twice."""
    broker = start_broker(**PERSIST)
    cid = unique("inflight")
    c = raw(broker, version=5)
    c.send(r.connect(cid, version=5, clean=True,
                     properties={r.SESSION_EXPIRY_INTERVAL: 3600}))
    c.expect(r.CONNACK)
    c.send(r.subscribe(1, [("devices/d1/#", r.sub_options(qos=1))], version=5,
                       properties={r.SUBSCRIPTION_IDENTIFIER: 5}))
    assert c.expect(r.SUBACK).reason_codes == [1]
    p = raw(broker, version=5)
    p.send(r.connect(unique("pub"), version=5))
    p.expect(r.CONNACK)
    p.send(r.publish("devices/d1/t", b"unacked", qos=1, packet_id=1, version=5))
    p.expect(r.PUBACK)
    first = c.expect(r.PUBLISH)  # never acknowledged
    assert not first.flags & 0x08
    time.sleep(0.6)  # a checkpoint (0.2 s) records the window
    c.send(r.publish("devices/d2/x", b"exactly-once", qos=2, packet_id=77, version=5))
    assert c.expect(r.PUBREC).packet_id == 77
    _restart(broker, mode)  # kill9: right after the PUBREC

    c = raw(broker, version=5)
    c.send(r.connect(cid, version=5, clean=False,
                     properties={r.SESSION_EXPIRY_INTERVAL: 3600}))
    ack = c.expect(r.CONNACK)
    assert ack.raw[2] & 0x01, "session_present is 0 after the restart"
    again = c.expect(r.PUBLISH)
    assert again.flags & 0x08, "the in-flight QoS 1 message was not resent with DUP=1"
    assert again.packet_id == first.packet_id
    assert again.properties.get(r.SUBSCRIPTION_IDENTIFIER) == [5]
    assert again.raw.endswith(b"unacked")
    c.send(r.puback(again.packet_id))
    c.send(r.publish("devices/d2/x", b"exactly-once", qos=2, packet_id=77, dup=True, version=5))
    assert c.expect(r.PUBREC).packet_id == 77
    c.send(r.pubrel(77))
    comp = c.expect(r.PUBCOMP)
    assert comp.packet_id == 77 and not comp.reason_code, (
        f"PUBREL after the restart answered reason {comp.reason_code}: QoS 2 state lost")
    status, body = broker.http_get("/api/v1/logs/d2")
    assert status == 200 and json.loads(body)["end"] == 1, body  # stored once, not twice


def test_subscription_acked_right_before_kill9_is_kept(start_broker, raw):
    """kill -9 the moment the SUBACK arrives: the subscription it acknowledged is there after
    the restart (default checkpoint interval: only the write that held the SUBACK stored it)."""
    broker = start_broker()
    cid = unique("suback")
    c = raw(broker, version=5)
    c.connect(cid, clean=True, properties={r.SESSION_EXPIRY_INTERVAL: 3600})
    assert c.subscribe([("devices/k9/#", r.sub_options(qos=1))],
                       properties={r.SUBSCRIPTION_IDENTIFIER: 9}).reason_codes == [1]
    broker.kill()
    broker.start()
    c = raw(broker, version=5)
    ack = c.connect(cid, clean=False, properties={r.SESSION_EXPIRY_INTERVAL: 3600})
    assert ack.raw[2] & 0x01, "session_present is 0"
    p = raw(broker, version=5)
    p.connect(unique("pub"))
    p.send(r.publish("devices/k9/t", b"after", qos=1, packet_id=1, version=5))
    p.expect(r.PUBACK)
    got = c.expect(r.PUBLISH)
    assert got.raw.endswith(b"after") and got.properties.get(r.SUBSCRIPTION_IDENTIFIER) == [9]


@pytest.mark.parametrize("mode", MODES)
def test_offset_subscription_resumes_where_it_was(start_broker, clients, mode):
    """An offset subscription (offset=earliest) that read 5 records and went offline gets the 2
    published while it was offline after the restart, from their offsets, and not the 5
    again."""
    broker = start_broker(**PERSIST)
    cid = unique("offsets")
    pub = clients(broker, protocol=V5).connect()
    for i in range(5):
        pub.publish("devices/d3/t", f"r{i}".encode(), qos=1)
    sub = clients(broker, cid, protocol=V5, clean=False)
    sub.connect(properties=_session_props(), clean_start=True)
    sub.subscribe("devices/d3/#", 1, properties=props(
        PacketTypes.SUBSCRIBE, UserProperty=[("offset", "earliest")]))
    assert [m.payload for m in sub.expect_messages(5)] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    time.sleep(0.5)  # the acks and a checkpoint
    sub.disconnect()
    pub.publish("devices/d3/t", b"r5", qos=1)
    pub.publish("devices/d3/t", b"r6", qos=1)
    time.sleep(0.6)  # the offline session's lag, checkpointed
    _restart(broker, mode)

    sub = clients(broker, cid, protocol=V5, clean=False)
    sub.connect(properties=_session_props(), clean_start=False)
    assert sub.session_present
    got = sub.expect_messages(2)
    assert [m.payload for m in got] == [b"r5", b"r6"]
    assert [dict(m.properties.UserProperty)["offset"] for m in got] == ["5", "6"]
    sub.expect_no_message(wait=1.0)


@pytest.mark.parametrize("mode", MODES)
def test_session_expiry_counts_the_time_the_broker_was_down(start_broker, clients, mode):
    """Expiry is wall time across a restart: a 2 s session offline through a 3 s outage is
    gone (session_present 0, its subscription too), a 3600 s one is present."""
    broker = start_broker(**PERSIST)
    short, long_ = unique("short"), unique("long")
    for cid, expiry in ((short, 2), (long_, 3600)):
        c = clients(broker, cid, protocol=V5, clean=False)
        c.connect(properties=_session_props(expiry), clean_start=True)
        c.subscribe(f"live/{cid}", 1)
        c.disconnect()
    time.sleep(0.5)
    if mode == "sigterm":
        assert broker.stop() == 0
    else:
        broker.kill()
    time.sleep(3.0)
    broker.start()
    assert broker.metric("meshmq_persistence_restored", kind="expired_sessions") == 1
    c = clients(broker, short, protocol=V5, clean=False)
    c.connect(properties=_session_props(2), clean_start=False)
    assert not c.session_present, "a session whose expiry passed while the broker was down"
    c.disconnect()
    c = clients(broker, long_, protocol=V5, clean=False)
    c.connect(properties=_session_props(3600), clean_start=False)
    assert c.session_present
    pub = clients(broker, protocol=V5).connect()
    pub.publish(f"live/{long_}", b"still subscribed", qos=1)
    assert c.expect_message().payload == b"still subscribed"


@pytest.mark.parametrize("mode", MODES)
def test_corrupt_session_record_costs_only_that_session(start_broker, clients, mode):
    """A damaged session record (a flipped byte in its segment) costs that record only: the
    other sessions are restored, and the damaged session falls back to its previous record.
    kill9: recovery scans the unchecked tail and quarantines the record; sigterm: the record
    lies before the shutdown checkpoint, so the read at start-up meets the bad CRC."""
    broker = start_broker(**PERSIST)
    victim, other = unique("victim"), unique("other")
    for cid in (victim, other):
        c = clients(broker, cid, protocol=V5, clean=False)
        c.connect(properties=_session_props(), clean_start=True)
        c.subscribe(f"live/{cid}", 1)
        c.disconnect()
    time.sleep(0.3)
    if mode == "sigterm":
        assert broker.stop() == 0
    else:
        broker.kill()
    data = Path(broker.config["node"]["data_dir"])
    hits = 0
    for seg in sorted(data.rglob("*.log")):
        blob = bytearray(seg.read_bytes())
        # the newest record of the victim: its client id, then its JSON body
        at = blob.rfind(victim.encode())
        if at < 0:
            continue
        body = blob.find(b'"user":null', at)
        assert body > 0
        blob[body + 2] ^= 0x20  # "user" -> "uSer": CRC mismatch
        seg.write_bytes(bytes(blob))
        hits += 1
    assert hits == 1
    broker.start()
    c = clients(broker, other, protocol=V5, clean=False)
    c.connect(properties=_session_props(), clean_start=False)
    assert c.session_present, "an intact session was lost with a corrupt neighbour"
    text = broker.log_text()
    assert ("quarantined" in text and "#sessions" in text) or "unreadable" in text
    # and the restore says so, counted (the operator's "what came back" line and metric)
    restored = [ln for ln in text.splitlines() if "persistent sessions" in ln][-1]
    assert "corrupt_records=0" not in restored and "corrupt_records=" in restored, restored
    # the victim falls back to its previous record (written when it went offline or earlier)
    c = clients(broker, victim, protocol=V5, clean=False)
    c.connect(properties=_session_props(), clean_start=False)
    pub = clients(broker, protocol=V5).connect()
    pub.publish(f"live/{victim}", b"x", qos=1)
    assert c.expect_message().payload == b"x"


def test_persistence_off_keeps_nothing(start_broker, clients):
    """mqtt.persistence = false: the documented switch, state is not kept."""
    broker = start_broker(mqtt={"persistence": False})
    cid = unique("off")
    c = clients(broker, cid, protocol=V5, clean=False)
    c.connect(properties=_session_props(), clean_start=True)
    c.subscribe("devices/x/#", 1)
    c.publish("devices/x/r", b"kept?", qos=1, retain=True)
    c.disconnect()
    broker.restart()
    fresh = clients(broker, protocol=V5).connect()
    fresh.subscribe("devices/x/r", 1)
    fresh.expect_no_message(wait=0.7)
    c = clients(broker, cid, protocol=V5, clean=False)
    c.connect(properties=_session_props(), clean_start=False)
    assert not c.session_present


def test_nothing_acknowledged_before_the_state_is_stored(fuse_tools, tmp_path, raw):
    """Stored before acknowledged, shown with fsync failing (EIO, lazy FUSE layer): a
    persistent session's SUBSCRIBE gets no SUBACK (the connection closes; the client
    resubscribes after reconnecting), and a retained publish on an unlogged topic gets PUBACK
    0x80 instead of 0, because neither could be stored. A clean session's SUBSCRIBE, which
    stores nothing, is still answered."""
    from helpers.devicelog import BrokerGroup
    from helpers.lazyfs import LazyFS

    fs = LazyFS(tmp_path / "disk", tmp_path / "data").mount()
    group = BrokerGroup()
    try:
        broker = group.start(tmp_path, node={"data_dir": str(tmp_path / "data")})
        durable = raw(broker, version=5)
        durable.connect("stored-first", clean=True, properties={r.SESSION_EXPIRY_INTERVAL: 60})
        clean = raw(broker, version=5)
        clean.connect("clean-one")
        pub = raw(broker, version=5)
        pub.connect("retainer")
        fs.fail("fsync", "EIO")
        durable.send(r.subscribe(1, [("devices/s/#", r.sub_options(qos=1))], version=5))
        got = durable.wait_closed(timeout=30)
        assert not [p for p in got if p.type == r.SUBACK], f"SUBACK before stored: {got}"
        assert clean.subscribe("devices/c/#", 1).reason_codes == [1]
        pub.send(r.publish("$cfg/x", b"retained", qos=1, retain=True, packet_id=1, version=5))
        ack = pub.expect(r.PUBACK, timeout=30)
        assert ack.reason_code == 0x80, f"a retained publish not stored was acked: {ack!r}"
    finally:
        try:
            fs.heal()
        except AssertionError:
            pass
        group.stop_all()
        fs.unmount()
