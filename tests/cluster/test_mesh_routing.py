"""A 3-node cluster behaves as one broker: cross-node delivery, exactly once, only where
subscribed, per-device order, retained messages and wills (issue 15).

Real ``meshmq serve`` processes on loopback with real paho clients; one cluster per module to
keep CI time down (each test uses its own topics).
"""

from __future__ import annotations

import collections
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from helpers.broker import wait_for
from helpers.clients import V5, V311, ClientFactory, PacketTypes, props, unique
from helpers.cluster import Cluster

from commitlog.fetch import decode_fetch_response

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("mesh"), n=3,
                      overrides={"mqtt": {"sys_interval": 1}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _payloads(msgs: list) -> list[str]:
    return [m.payload.decode() for m in msgs]


def test_subscriber_on_one_node_gets_each_message_from_the_others_exactly_once(
        mesh: Cluster, clients: ClientFactory) -> None:
    n0, n1, n2 = mesh.nodes
    base = f"u/{unique('x')}"
    exact = clients.connected(n2, protocol=V5)
    exact.subscribe(f"{base}/a/x", 2)
    plus = clients.connected(n2, protocol=V311)
    plus.subscribe(f"{base}/+/y", 2)
    hash_ = clients.connected(n1, protocol=V5)
    hash_.subscribe(f"{base}/#", 2)
    mesh.wait_routes(2, 2)
    mesh.wait_routes(1, 1)
    pubs = [clients.connected(n0, protocol=V5), clients.connected(n1, protocol=V311)]
    sent: dict[str, list[str]] = collections.defaultdict(list)
    for k, pub in enumerate(pubs):
        for i in range(30):
            qos = i % 3
            for topic in (f"{base}/a/x", f"{base}/b/y", f"{base}/c/z"):
                payload = f"{k}-{i}-{topic[-3:]}"
                pub.publish(topic, payload, qos)
                sent[topic].append(payload)
    want_exact = sorted(sent[f"{base}/a/x"])
    want_plus = sorted(sent[f"{base}/b/y"])
    want_all = sorted(p for v in sent.values() for p in v)
    assert sorted(_payloads(exact.expect_messages(len(want_exact)))) == want_exact
    assert sorted(_payloads(plus.expect_messages(len(want_plus)))) == want_plus
    assert sorted(_payloads(hash_.expect_messages(len(want_all)))) == want_all
    for sub in (exact, plus, hash_):
        sub.expect_no_message(0.5)  # nothing twice
    # Node 0 has no subscriber: nothing was forwarded to it, over any link.
    assert mesh.link(1, 0)["msgs_out"] == 0
    assert mesh.link(2, 0)["msgs_out"] == 0


def test_a_node_without_a_matching_route_gets_nothing(mesh: Cluster,
                                                      clients: ClientFactory) -> None:
    n0, n1, n2 = mesh.nodes
    base = f"u/{unique('r')}"
    sub = clients.connected(n2, protocol=V5)
    sub.subscribe(f"{base}/only", 1)
    other = clients.connected(n1, protocol=V5)
    other.subscribe(f"{base}/elsewhere", 1)
    mesh.wait_routes(2, 1)
    before_1 = mesh.link(0, 1)["msgs_out"]
    before_2 = mesh.link(0, 2)["msgs_out"]
    pub = clients.connected(n0, protocol=V5)
    for i in range(20):
        pub.publish(f"{base}/only", str(i), 1)
    assert _payloads(sub.expect_messages(20)) == [str(i) for i in range(20)]
    assert mesh.link(0, 2)["msgs_out"] - before_2 == 20  # one copy per message
    assert mesh.link(0, 1)["msgs_out"] == before_1  # n1 only wants another filter
    other.expect_no_message(0.3)


def test_every_subscriber_sees_a_device_in_one_order(mesh: Cluster,
                                                     clients: ClientFactory) -> None:
    """Two publishers on two nodes write one device, whose log a third node owns: subscribers
    on all three nodes get the same sequence (the owner's log order), with offsets 0..n-1."""
    n0, n1, n2 = mesh.nodes
    device = mesh.device_owned_by(1, unique("ord"))
    subs = [clients.connected(node, protocol=V5) for node in mesh.nodes]
    for sub in subs:
        sub.subscribe(f"devices/{device}/#", 1)
    mesh.wait_routes(0, 1)
    mesh.wait_routes(2, 1)
    pub_a = clients.connected(n0, protocol=V5)
    pub_b = clients.connected(n2, protocol=V5)
    infos = []
    for i in range(150):
        infos.append(pub_a.publish(f"devices/{device}/t", f"a{i}", 1, wait=False))
        infos.append(pub_b.publish(f"devices/{device}/t", f"b{i}", 1, wait=False))
    wait_for(lambda: all(i.mid in pub_a.pubacks or i.mid in pub_b.pubacks for i in infos),
             30, message="every PUBACK")
    orders = [_payloads(sub.expect_messages(300, timeout=30)) for sub in subs]
    assert orders[0] == orders[1] == orders[2]
    for prefix in "ab":  # each publisher's own order is kept too
        mine = [p for p in orders[0] if p[0] == prefix]
        assert mine == [f"{prefix}{i}" for i in range(150)]


def test_retained_messages_are_cluster_wide(mesh: Cluster, clients: ClientFactory) -> None:
    n0, n1, n2 = mesh.nodes
    topic = f"u/{unique('ret')}/state"
    pub = clients.connected(n0, protocol=V5)
    pub.publish(topic, "on", 1, retain=True)

    def retained_at(node) -> list[str]:
        c = clients.connected(node, protocol=V5)
        c.subscribe(topic, 1)
        got = c.drain() or []
        try:
            got = [c.expect_message(timeout=0.5)]
        except AssertionError:
            pass
        c.disconnect()
        return [m.payload.decode() for m in got]

    wait_for(lambda: retained_at(n2) == ["on"], 10, message="the retained message on n2")
    assert retained_at(n1) == ["on"]
    clearer = clients.connected(n1, protocol=V311)
    clearer.publish(topic, b"", 1, retain=True)  # cleared from another node
    wait_for(lambda: retained_at(n2) == [] and retained_at(n0) == [], 10,
             message="the retained message cleared everywhere")


def test_a_will_reaches_subscribers_on_other_nodes(mesh: Cluster,
                                                   clients: ClientFactory) -> None:
    n0, n1, n2 = mesh.nodes
    topic = f"u/{unique('will')}/gone"
    sub = clients.connected(n2, protocol=V5)
    sub.subscribe(topic, 1)
    mesh.wait_routes(2, 1)
    dying = clients(n0, protocol=V311)
    dying.mqtt.will_set(topic, b"bye", 1)
    dying.connect()
    dying.abort()  # no DISCONNECT: the will goes out
    assert sub.expect_message(timeout=10).payload == b"bye"


@pytest.mark.parametrize("logged", [False, True], ids=["unlogged", "logged"])
def test_shared_subscription_members_on_every_node_split_the_messages(
        mesh: Cluster, clients: ClientFactory, logged: bool) -> None:
    """$share/g/<filter> with one member per node: each message to exactly one member
    cluster-wide, and every member gets a share (round-robin over the routers)."""
    name = unique("grp")
    topic = f"devices/{unique('sh')}/t" if logged else f"u/{unique('sh')}/t"
    members = [clients.connected(node, protocol=V5) for node in mesh.nodes]
    for m in members:
        m.subscribe(f"$share/{name}/{topic}", 1)
    # a plain subscriber on node 1 too: node 1 then gets every message as a DELIVER, and must
    # not hand those to its group member as well
    watcher = clients.connected(mesh.nodes[1], protocol=V5)
    watcher.subscribe(topic, 1)
    wait_for(lambda: all(
        sum(lk["routes_in"] for lk in mesh.links(i)) >= 2 for i in range(3)), 10,
        message="every node knows the other members")
    pub = clients.connected(mesh.nodes[0], protocol=V5)
    n = 90
    for i in range(n):
        pub.publish(topic, str(i), 1)
    got: list[list[int]] = [[] for _ in members]

    def all_in() -> bool:
        for k, m in enumerate(members):
            got[k].extend(int(x.payload) for x in m.drain())
        return sum(len(g) for g in got) >= n

    wait_for(all_in, 20, message=f"{n} shares")
    for m in members:
        m.expect_no_message(0.5)
    flat = sorted(x for g in got for x in g)
    assert flat == list(range(n)), "a message went to two members, or to none"
    assert sorted(int(m.payload) for m in watcher.expect_messages(n)) == list(range(n))
    assert all(len(g) >= n // 6 for g in got), [len(g) for g in got]


def _persistent(clients: ClientFactory, node, cid: str):
    return clients.connected(node, cid, protocol=V5, clean=False, connect={
        "properties": props(PacketTypes.CONNECT, SessionExpiryInterval=3600)})


def test_a_persistent_session_moves_to_the_node_the_client_reconnects_to(
        mesh: Cluster, clients: ClientFactory) -> None:
    """Subscribed at node 0, offline, messages queue there (logged and unlogged); the client
    comes back at node 2: session present, the queue delivered there once, and the
    subscriptions now live at node 2."""
    n0, n1, n2 = mesh.nodes
    cid = unique("mover")
    device = mesh.device_owned_by(1, unique("mv"))
    plain = f"u/{unique('mv')}/t"
    first = _persistent(clients, n0, cid)
    first.subscribe([(plain, 1), (f"devices/{device}/#", 1)])
    first.disconnect()
    mesh.wait_routes(0, 2)
    pub = clients.connected(n2, protocol=V5)
    for i in range(5):
        pub.publish(plain, f"p{i}", 1)
        pub.publish(f"devices/{device}/t", f"d{i}", 1)
    time.sleep(0.5)  # the copies reach node 0's queue
    again = _persistent(clients, n2, cid)
    assert again.session_present
    got = sorted(m.payload.decode() for m in again.expect_messages(10, timeout=15))
    assert got == sorted([f"p{i}" for i in range(5)] + [f"d{i}" for i in range(5)])
    again.expect_no_message(0.5)
    pub.publish(plain, "after", 1)  # its subscriptions moved with it
    assert again.expect_message(timeout=10).payload == b"after"
    again.expect_no_message(0.5)


def test_connecting_at_another_node_takes_the_session_over(
        mesh: Cluster, clients: ClientFactory) -> None:
    n0, n1, n2 = mesh.nodes
    cid = unique("twice")
    old = clients.connected(n0, cid, protocol=V5)
    clients.connected(n1, cid, protocol=V5)
    reason = old.wait_disconnected(timeout=10)
    assert int(getattr(reason, "value", reason)) == 0x8E  # session taken over


def test_the_fetch_api_of_any_node_answers_for_any_device(mesh: Cluster,
                                                          clients: ClientFactory) -> None:
    """A device whose log router 1 owns, read through node 2's admin endpoint: the request
    goes over the mesh to the owner and comes back with its records."""
    device = mesh.device_owned_by(1, unique("fetch"))
    pub = clients.connected(mesh.nodes[0], protocol=V5)
    for i in range(5):
        pub.publish(f"devices/{device}/t", f"r{i}", 1)
    for node in (mesh.nodes[2], mesh.nodes[0]):
        code, _ = node.http_get(f"/api/v1/logs/{device}")
        assert code == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{node.admin_port}/api/v1/logs/"
                                    f"{device}/records?offset=0", timeout=10) as resp:
            records = decode_fetch_response(resp.read())
        assert [bytes(r.payload) for r in records] == [f"r{i}".encode() for i in range(5)]
        assert [r.offset for r in records] == list(range(5))


def _offset(msg) -> int:
    """The log position an offset subscription's delivery carries (user property)."""
    return int(dict(msg.properties.UserProperty)["offset"])


def _replay(clients: ClientFactory, node, spec: str, device: str, **connect_props):
    sub = clients.connected(node, protocol=V5, connect={
        "properties": props(PacketTypes.CONNECT, **connect_props)} if connect_props else None)
    codes = sub.subscribe(f"devices/{device}/#", 1, properties=props(
        PacketTypes.SUBSCRIBE, UserProperty=[("offset", spec)]))
    return sub, codes


def test_offset_replay_at_a_router_that_does_not_own_the_log_hands_over_to_live(
        mesh: Cluster, clients: ClientFactory) -> None:
    """Replay from the earliest offset at node 2 of a log router n1/0 owns, while a publisher
    at node 0 keeps publishing: every message once, in log order, with its offset, across the
    seam between the history read over the link and live delivery (the single-node seam test's
    twin, test_devicelog_replay.py)."""
    device = mesh.device_owned_by(1, unique("rr"))
    topic = f"devices/{device}/t"
    pub = clients.connected(mesh.nodes[0], protocol=V5)
    for i in range(150):
        pub.publish(topic, f"m{i}", 1, wait=False)
    pub.publish(topic, "m150", 1)
    sent = [151]
    stop = threading.Event()

    def keep_publishing() -> None:
        while not stop.is_set() and sent[0] < 2000:
            pub.publish(topic, f"m{sent[0]}", 1)
            sent[0] += 1

    writer = threading.Thread(target=keep_publishing, daemon=True)
    writer.start()
    try:
        wait_for(lambda: sent[0] >= 250, 30, message="publishing before the subscribe")
        sub, codes = _replay(clients, mesh.nodes[2], "earliest", device, ReceiveMaximum=8)
        assert codes == [1]
        at = sent[0]
        wait_for(lambda: sent[0] >= at + 300, 60, message="publishing after the subscribe")
    finally:
        stop.set()
        writer.join(60)
    total = sent[0]
    msgs = sub.expect_messages(total, timeout=60)
    offsets = [_offset(m) for m in msgs]
    assert offsets == list(range(total)), (
        f"not 0..{total - 1} once each: missing {sorted(set(range(total)) - set(offsets))[:10]}"
        f", duplicated {sorted({o for o in offsets if offsets.count(o) > 1})[:10]}")
    assert _payloads(msgs) == [f"m{i}" for i in range(total)]
    sub.expect_no_message(0.5)


def test_offset_replay_at_a_non_owner_resolves_the_offset_at_the_owner(
        mesh: Cluster, clients: ClientFactory) -> None:
    """"latest", a numbered offset over MQTT 3.1.1's $replay/ filter, and an offset outside
    the log are each resolved by the owner, as one node would: the SUBACK of a bad offset is
    a failure (with the owner's reason), and offset-reset=earliest recovers it."""
    device = mesh.device_owned_by(1, unique("rs"))
    topic = f"devices/{device}/t"
    pub = clients.connected(mesh.nodes[1], protocol=V5)
    for i in range(10):
        pub.publish(topic, f"h{i}", 1)
    latest, codes = _replay(clients, mesh.nodes[2], "latest", device)
    assert codes == [1]
    v311 = clients.connected(mesh.nodes[0], protocol=V311)
    assert v311.subscribe(f"$replay/4/devices/{device}/#", 1) == [1]
    bad, codes = _replay(clients, mesh.nodes[0], "999", device)
    assert codes == [0x83]
    assert bad.subscribe(f"devices/{device}/#", 1, properties=props(
        PacketTypes.SUBSCRIBE, UserProperty=[("offset", "999"), ("offset-reset", "earliest")])
    ) == [1]
    for i in range(10, 13):
        pub.publish(topic, f"h{i}", 1)
    got = latest.expect_messages(3, timeout=15)
    assert [_offset(m) for m in got] == [10, 11, 12]
    assert _payloads(got) == ["h10", "h11", "h12"]
    assert _payloads(v311.expect_messages(9, timeout=15)) == [f"h{i}" for i in range(4, 13)]
    assert [_offset(m) for m in bad.expect_messages(13, timeout=15)] == list(range(13))
    for c in (latest, v311, bad):
        c.expect_no_message(0.3)


def test_a_replaying_session_moves_between_the_owner_and_other_routers(
        mesh: Cluster, clients: ClientFactory) -> None:
    """A persistent session with an offset subscription moves from the log's owner (a local
    cursor) to a router that reads the log over the link (a remote cursor) and back: what was
    published while it was offline comes once, then live delivery goes on, each with its
    offset."""
    device = mesh.device_owned_by(1, unique("rmv"))
    topic = f"devices/{device}/t"
    cid = unique("rmover")
    pub = clients.connected(mesh.nodes[0], protocol=V5)
    replay = props(PacketTypes.SUBSCRIBE, UserProperty=[("offset", "earliest")])

    def publish(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            pub.publish(topic, f"v{i}", 1)

    def expect(client, lo: int, hi: int) -> None:
        got = client.expect_messages(hi - lo, timeout=15)
        assert [(_offset(m), m.payload.decode()) for m in got] == [
            (i, f"v{i}") for i in range(lo, hi)]
        client.expect_no_message(0.3)

    publish(0, 5)
    first = _persistent(clients, mesh.nodes[1], cid)
    assert first.subscribe(f"devices/{device}/#", 1, properties=replay) == [1]
    expect(first, 0, 5)
    first.disconnect()
    publish(5, 8)
    second = _persistent(clients, mesh.nodes[2], cid)
    assert second.session_present
    expect(second, 5, 8)
    publish(8, 10)
    expect(second, 8, 10)
    second.disconnect()
    publish(10, 12)
    third = _persistent(clients, mesh.nodes[1], cid)
    assert third.session_present
    expect(third, 10, 12)
    publish(12, 13)
    expect(third, 12, 13)


def test_a_relayed_answer_larger_than_a_mesh_frame_is_refused_not_fatal_to_the_link(
        mesh: Cluster, clients: ClientFactory) -> None:
    """70 MB of records of a device n1 owns, asked for at node 2 with the API's largest
    max_bytes (64 MiB): the owner's answer (67 MB) leaves less than the 1 MiB of room a mesh
    frame keeps for its head and headers. The asker gets a 502 saying so, and the link stays
    up (an answer past the frame limit would be a broken peer to the reader: the link would
    drop, with every flow on it)."""
    device = mesh.device_owned_by(1, unique("big"))
    pub = clients.connected(mesh.nodes[1], protocol=V5)
    chunk = b"x" * (1_000_000)
    for _ in range(69):
        pub.publish(f"devices/{device}/t", chunk, 1, wait=False)
    pub.publish(f"devices/{device}/t", chunk, 1, timeout=60)
    before = mesh.link(2, 1)["reconnects"]
    code, body = mesh.nodes[2].http_get(
        f"/api/v1/logs/{device}/records?offset=0&max_records=1000&max_bytes={64 << 20}")
    assert code == 502, (code, body[:200])
    assert "larger than a mesh frame" in body
    time.sleep(0.5)
    link = mesh.link(2, 1)
    assert link["state"] == "up" and link["reconnects"] == before


def test_every_routers_sys_status_is_seen_from_any_router(mesh: Cluster,
                                                          clients: ClientFactory) -> None:
    """$SYS/brokers/<node>/<router>/... crosses the mesh (retained, so a new subscriber gets
    every router's at once); $SYS/broker/... stays the connected router's own view."""
    sub = clients.connected(mesh.nodes[2], protocol=V5)
    sub.subscribe("$SYS/brokers/+/+/uptime", 0)
    seen: set[str] = set()
    deadline = time.monotonic() + 15
    while len(seen) < 3 and time.monotonic() < deadline:
        seen.update(m.topic for m in sub.drain())
        time.sleep(0.1)
    assert seen == {f"$SYS/brokers/n{i}/0/uptime" for i in range(3)}
    late = clients.connected(mesh.nodes[0], protocol=V5)
    late.subscribe("$SYS/brokers/+/+/clients/connected", 0)
    got = late.expect_messages(3, timeout=10)
    assert all(m.retain for m in got)
    assert {m.topic for m in got} == {f"$SYS/brokers/n{i}/0/clients/connected"
                                      for i in range(3)}
    own = clients.connected(mesh.nodes[1], protocol=V5)
    own.subscribe("$SYS/broker/uptime", 0)
    time.sleep(3.5)
    # its router's alone: the retained one and about one update a second (sys_interval = 1);
    # the three routers' together would be about three times that
    assert 1 <= len(own.drain()) <= 6
