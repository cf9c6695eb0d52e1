"""Shared subscriptions ($share/group/filter): distribution, leaving members, unacked messages."""

import pytest
from helpers import raw as R
from helpers.clients import V5, V311, unique

pytestmark = pytest.mark.timeout(60)


def _members(broker, clients, flt, n, protocol=V5, qos=1):
    members = []
    for _ in range(n):
        c = clients.connected(broker, protocol=protocol)
        assert c.subscribe(flt, qos) == [qos]
        members.append(c)
    return members


def _collect(members, total, timeout=15):
    """Drain members until ``total`` messages arrived overall; return payload lists."""
    import time

    got = [[] for _ in members]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < total:
        if time.monotonic() >= deadline:
            pytest.fail(f"only {sum(map(len, got))} of {total} shared messages arrived: {got}")
        for i, m in enumerate(members):
            got[i].extend(x.payload.decode() for x in m.drain())
        time.sleep(0.02)
    return got


@pytest.mark.parametrize("protocol", [V5, V311], ids=["v5", "v311"])
def test_shared_round_robin_each_message_once(broker, clients, protocol):
    """MQTT 5.0 4.8.2: each message of a shared subscription goes to exactly one member of the
    group; with round-robin, 3 members and 30 messages each gets about 10 (at least 5 here)."""
    topic = unique("sh") + "/t"
    members = _members(broker, clients, f"$share/g1/{topic}", 3, protocol)
    pub = clients.connected(broker, protocol=V5)
    sent = [f"m{i}" for i in range(30)]
    for s in sent:
        pub.publish(topic, s, 1)
    got = _collect(members, 30)
    for m in members:
        m.expect_no_message(0.5)
        got[members.index(m)].extend(x.payload.decode() for x in m.drain())
    flat = [x for g in got for x in g]
    assert sorted(flat) == sorted(sent), "a message was lost or duplicated across the group"
    assert all(len(g) >= 5 for g in got), f"uneven distribution: {[len(g) for g in got]}"


def test_shared_and_plain_subscribers_and_two_groups(broker, clients):
    """4.8.2: a non-shared subscriber gets every message, and each group gets every message
    once (independently of other groups)."""
    topic = unique("sh2") + "/t"
    g_a = _members(broker, clients, f"$share/a/{topic}", 2)
    g_b = _members(broker, clients, f"$share/b/{topic}", 2)
    plain = clients.connected(broker, protocol=V5)
    plain.subscribe(topic, 1)
    pub = clients.connected(broker, protocol=V5)
    sent = [f"m{i}" for i in range(10)]
    for s in sent:
        pub.publish(topic, s, 1)
    assert [m.payload.decode() for m in plain.expect_messages(10)] == sent
    for group in (g_a, g_b):
        got = _collect(group, 10)
        assert sorted(x for g in got for x in g) == sorted(sent)


def test_shared_member_that_leaves_gets_no_more(broker, clients):
    """4.8.2: after a member unsubscribes (or disconnects) the group's messages all go to the
    remaining members."""
    topic = unique("sh3") + "/t"
    a, b, c = _members(broker, clients, f"$share/g/{topic}", 3)
    a.unsubscribe(f"$share/g/{topic}")
    c.disconnect()
    pub = clients.connected(broker, protocol=V5)
    sent = [f"m{i}" for i in range(9)]
    for s in sent:
        pub.publish(topic, s, 1)
    got = [x.payload.decode() for x in b.expect_messages(9)]
    assert sorted(got) == sorted(sent)
    a.expect_no_message(0.7)


def test_shared_unacked_qos1_redistributed_when_session_ends(broker, raw, clients):
    """MQTT 5.0 4.8.2: QoS 1 messages sent to a member that never acknowledged them, whose
    session then ends (connection lost, Session Expiry 0), SHOULD go to another member: meshmq
    re-sends them to the remaining member (no loss, anchors: emqx#12257, mosquitto#2662)."""
    topic = unique("sh4") + "/t"
    flt = f"$share/g/{topic}"
    a = raw(broker, version=5)
    a.connect(unique("sha"))  # Session Expiry 0: the session ends with the connection
    a.subscribe(flt, 1)
    pub = clients.connected(broker, protocol=V5)
    for i in range(3):
        pub.publish(topic, f"m{i}", 1)
    held = [a.expect(R.PUBLISH) for _ in range(3)]  # never acknowledged
    assert sorted(m.payload for m in held) == [b"m0", b"m1", b"m2"]
    b = clients.connected(broker, protocol=V5)
    b.subscribe(flt, 1)
    a.abort()
    got = sorted({m.payload.decode() for m in b.expect_messages(3, timeout=15)})
    assert got == ["m0", "m1", "m2"]


@pytest.mark.parametrize("leaves", ["offline-session-kept", "unsubscribes"])
def test_shared_unacked_qos1_redistributed_when_member_leaves(broker, raw, clients, leaves):
    """The other two ways a member leaves a group with QoS 1 shares it never acknowledged: its
    connection drops while its session is kept (Session Expiry 60), or it UNSUBSCRIBEs the
    shared filter. Either way the remaining member gets every one of them (v5 4.8.2 SHOULD;
    the session-end case is the test above)."""
    topic = unique("sh7") + "/t"
    flt = f"$share/g/{topic}"
    a = raw(broker, version=5)
    a.connect(unique("sha7"), clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 60})
    a.subscribe(flt, 1)
    pub = clients.connected(broker, protocol=V5)
    for i in range(3):
        pub.publish(topic, f"m{i}", 1)
    held = [a.expect(R.PUBLISH) for _ in range(3)]  # never acknowledged
    assert sorted(m.payload for m in held) == [b"m0", b"m1", b"m2"]
    b = clients.connected(broker, protocol=V5)
    b.subscribe(flt, 1)
    if leaves == "unsubscribes":
        a.send(R.unsubscribe(9, [flt], version=5))
    else:
        a.abort()
    got = sorted({m.payload.decode() for m in b.expect_messages(3, timeout=15)})
    assert got == ["m0", "m1", "m2"]


def test_sole_members_unacked_shares_stay_in_its_offline_session(broker, raw):
    """A persistent member's connection drops with QoS 1 shares it never acknowledged, and no
    other member exists to take them: its session keeps them and sends them again when it
    resumes (they used to be taken out of the session for a re-dispatch that found nobody,
    and lost: "a slow consumer is a lag, never a silent drop")."""
    topic = unique("sh8") + "/t"
    flt = f"$share/g/{topic}"
    cid = unique("sha8")
    a = raw(broker, version=5)
    a.connect(cid, clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 60})
    a.subscribe(flt, 1)
    pub = raw(broker, version=5)
    pub.connect(unique("shp8"))
    for i in range(3):
        pub.publish(topic, f"m{i}".encode(), qos=1, packet_id=i + 1)  # waits for its PUBACK
    held = [a.expect(R.PUBLISH) for _ in range(3)]  # never acknowledged
    assert sorted(m.payload for m in held) == [b"m0", b"m1", b"m2"]
    a.abort()
    back = raw(broker, version=5)
    back.connect(cid, clean=False, properties={R.SESSION_EXPIRY_INTERVAL: 60})
    again = sorted(back.expect(R.PUBLISH, timeout=15).payload for _ in range(3))
    assert again == [b"m0", b"m1", b"m2"], again


def test_shared_inflight_qos2_not_redistributed(broker, raw, clients):
    """[MQTT-4.8.2-5] (5.0): a QoS 2 message the server already started sending to one member
    MUST NOT be sent to another member when that member's session ends; later messages go
    to the remaining member."""
    topic = unique("sh5") + "/t"
    flt = f"$share/g/{topic}"
    a = raw(broker, version=5)
    a.connect(unique("sh5a"))
    a.subscribe(flt, 2)
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"in-progress", 2)
    assert a.expect(R.PUBLISH).payload == b"in-progress"
    b = clients.connected(broker, protocol=V5)
    b.subscribe(flt, 2)
    a.abort()
    b.expect_no_message(2.0)
    pub.publish(topic, b"after", 2)
    assert b.expect_message().payload == b"after"


def test_shared_subscription_gets_no_retained_messages(broker, clients):
    """MQTT 5.0 4.8.2 / 3.3.1.3: retained messages are not sent when a Shared Subscription is
    made (only for new non-shared subscriptions)."""
    topic = unique("sh6") + "/t"
    pub = clients.connected(broker, protocol=V5)
    pub.publish(topic, b"retained", 1, retain=True)
    member = clients.connected(broker, protocol=V5)
    member.subscribe(f"$share/g/{topic}", 1)
    member.expect_no_message(1.0)
    pub.publish(topic, b"live", 1)
    assert member.expect_message().payload == b"live"


@pytest.mark.parametrize("flt", ["$share/g", "$share//x", "$share/g+/x", "$share/g#/x"])
def test_invalid_shared_filter_refused(broker, raw, flt):
    """[MQTT-4.8.2-1]/[MQTT-4.8.2-2]: "$share/" must be followed by a non-empty ShareName
    without '/', '+', '#', then "/" and a topic filter; otherwise the subscription is refused
    (SUBACK code >= 0x80) or the connection closed, never granted."""
    c = raw(broker, version=5)
    c.connect(unique("shinv"))
    c.send(R.subscribe(1, [(flt, 1)], version=5))
    try:
        pkt = c.recv(15)
    except ConnectionError:
        return  # closed without a word: acceptable
    except TimeoutError:
        raise AssertionError(f"no SUBACK and no close within 15 s: the SUBSCRIBE of {flt!r} "
                             f"was ignored") from None
    if pkt.type == R.DISCONNECT:  # closed with a reason: the connection must really end
        assert pkt.reason_code is not None and pkt.reason_code >= 0x80, pkt
        c.wait_closed()
        return
    assert pkt.type == R.SUBACK and pkt.packet_id == 1, f"expected SUBACK or close, got {pkt!r}"
    assert pkt.reason_codes and pkt.reason_codes[0] >= 0x80, pkt
