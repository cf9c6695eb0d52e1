"""A resent APPEND is stored once, even across the owner's kill -9 (issue 28; the chaos suite's
``dups_in_log``).

Node 0 publishes on a device log node 1 owns, through a proxy that loses only what node 1 sends
back: node 1 stores (fsyncs) the publishes, its RESULTs never arrive, and it is killed -9 before
the link notices; its supervisor restarts it, a new incarnation that remembers nothing. Node 0
resends the APPENDs; the new owner must find them in its log (the ``:src`` header a peer's
record carries, cluster/idempotence.py) and answer with the offsets they were stored at: every
acknowledged message in the log exactly once, each PUBACK naming its own record's offset. A
subscriber on node 0, connected all along, gets every one at least once: the old owner's
deliveries to it were lost with its answers, so the found records are routed again.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster, signal_all
from helpers.devicelog import fetch_all
from helpers.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(240)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}
N = 20


@pytest.fixture
def one_way(tmp_path: Path) -> Iterator[tuple[Cluster, TcpProxy]]:
    # append_timeout far above the test's restart: what answers must be the owner's outcome
    cluster = Cluster(tmp_path, n=2, overrides={"cluster": {"append_timeout": 600.0}})
    proxy = TcpProxy(cluster.mesh_ports[1])
    cluster.dial_via(0, 1, proxy.port)  # n0/0 < n1/0: node 0 dials
    try:
        cluster.start()
        yield cluster, proxy
    finally:
        cluster.stop()
        proxy.close()


def test_appends_stored_before_the_owner_was_killed_are_stored_once(
        one_way: tuple[Cluster, TcpProxy], raw) -> None:
    mesh, proxy = one_way
    n0, n1 = mesh.nodes
    device = mesh.device_owned_by(1, unique("idem"))
    topic = f"devices/{device}/t"
    pub = raw(n0, version=5)
    pub.connect(unique("idempub"), properties=ACK_OFFSETS)
    pub.send(R.publish(topic, b"ok0", qos=1, packet_id=1, version=5))  # before the watcher
    assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
    # the watcher's routes are proven by a sentinel on *another* device: delivered nothing of
    # `device`, it holds no position there (broker/positions.py), so nothing but the owner
    # routing what it found can bring it the found records
    sentinel = mesh.device_owned_by(1, unique("idemsent"))
    watcher = raw(n0, version=5)
    watcher.connect(unique("idemwatch"))
    watcher.send(R.subscribe(1, [(f"devices/{device}/#", 1), (f"devices/{sentinel}/#", 1)],
                             version=5))
    watcher.expect(R.SUBACK, timeout=30)
    mesh.wait_routes(filters_at=0)
    pub.send(R.publish(f"devices/{sentinel}/t", b"sentinel", qos=1, packet_id=2, version=5))
    assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
    assert watcher.expect(R.PUBLISH, timeout=30).payload == b"sentinel"
    proxy.blackhole(back_only=True)
    sent = [f"m{i}".encode() for i in range(N)]
    for i, payload in enumerate(sent):
        pub.send(R.publish(topic, payload, qos=1, packet_id=10 + i, version=5))
    wait_for(lambda: len(fetch_all(n1, device)) == N + 1, 30,
             message="node 1 stored the publishes")
    owner = mesh.router_pid(1)
    os.kill(owner, signal.SIGKILL)
    wait_for(lambda: mesh.link(0, 1)["state"] != "up", 30, message="node 0 sees it down")
    proxy.heal()
    acks = {}
    while len(acks) < N:
        p = pub.expect(R.PUBACK, timeout=60)
        acks[p.packet_id] = p
    assert {pid: p.reason_code for pid, p in acks.items()} == dict.fromkeys(
        range(10, 10 + N), 0)

    mesh.wait_router_restarted(1, owner, timeout=60)
    records = fetch_all(n1, device)
    stored = [bytes(r.payload) for r in records]
    twice = {m.decode(): n for m, n in Counter(stored).items() if n > 1}
    assert not twice, f"resent after the owner's restart and stored again: {twice}; log: {stored}"
    assert stored == [b"ok0", *sent], stored
    at = {bytes(r.payload): r.offset for r in records}
    for i, payload in enumerate(sent):
        offset = int(dict(acks[10 + i].properties.get(R.USER_PROPERTY, []))["offset"])
        assert offset == at[payload], (
            f"PUBACK for {payload!r} names offset {offset}, stored at {at[payload]}")
    assert mesh.link(1, 0)["resends_found"] == N, mesh.link(1, 0)
    delivered: set[bytes] = set()
    while not set(sent) <= delivered:
        try:
            delivered.add(bytes(watcher.expect(R.PUBLISH, timeout=30).payload))
        except Exception as err:  # noqa: BLE001 - say what was missing
            missing = sorted(m.decode() for m in set(sent) - delivered)
            raise AssertionError(f"stored, acknowledged, never delivered to node 0's "
                                 f"subscriber: {missing}") from err
    # the internal header stays internal: a subscriber replaying the log sees no ":src"
    sub = raw(n1, version=5)
    sub.connect(unique("idemsub"))
    sub.send(R.subscribe(1, [(f"devices/{device}/#", 1)], version=5,
                         properties={R.USER_PROPERTY: [("offset", "earliest")]}))
    sub.expect(R.SUBACK, timeout=30)
    got = [sub.expect(R.PUBLISH, timeout=30) for _ in range(N + 1)]
    for p in got:
        names = [k for k, _ in p.properties.get(R.USER_PROPERTY, [])]
        assert ":src" not in names, p


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, n=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _restart_router(mesh: Cluster, i: int) -> None:
    """kill -9 node i's router; its supervisor starts a new incarnation; wait for the links."""
    old = mesh.router_pid(i)
    os.kill(old, signal.SIGKILL)

    mesh.wait_router_restarted(i, old, timeout=60)
    mesh.wait_links_up(timeout=60)


def test_a_new_publisher_incarnation_never_matches_the_adopted_ones_records(
        pair: Cluster, raw) -> None:
    """Found by the chaos suite (seed 11: lost=8 false_acks=1, offsets handed out twice): the
    owner restarts and adopts the publisher's incarnation I; then the *publisher's* router
    restarts (I'), whose link seqs start again from 1, and the owner kept looking them up as
    I's: a new publish matched an old record with the same seq and was acknowledged at that
    record's offset, never stored."""
    mesh = pair
    n0, n1 = mesh.nodes
    device = mesh.device_owned_by(1, unique("inc"))
    topic = f"devices/{device}/t"

    def publish(payloads: list[bytes]) -> dict[bytes, int]:
        pub = raw(n0, version=5)
        pub.connect(unique("incpub"), properties=ACK_OFFSETS)
        offsets = {}
        for i, payload in enumerate(payloads):
            pub.send(R.publish(topic, payload, qos=1, packet_id=1 + i, version=5))
            ack = pub.expect(R.PUBACK, timeout=30)
            assert ack.reason_code == 0, ack
            offsets[payload] = int(dict(ack.properties[R.USER_PROPERTY])["offset"])
        pub.close()
        return offsets

    before = [f"old{i}".encode() for i in range(5)]
    publish(before)  # stored at node 1 with node 0's first incarnation and seqs 1..
    _restart_router(mesh, 1)  # the owner adopts node 0's incarnation
    _restart_router(mesh, 0)  # node 0's new incarnation: its seqs start again from 1
    after = [f"new{i}".encode() for i in range(5)]
    acked = publish(after)
    records = fetch_all(n1, device)
    at = {bytes(r.payload): r.offset for r in records}
    missing = [m.decode() for m in after if m not in at]
    assert not missing, (f"acknowledged at offsets {acked} but never stored: {missing}; "
                         f"log: {[bytes(r.payload) for r in records]}")
    for payload, offset in acked.items():
        assert offset == at[payload], (payload, offset, at[payload])


def test_a_resend_finds_its_uncommitted_first_copy_after_the_leader_s_restart(
        tmp_path: Path, raw) -> None:
    """Raft placement: the first copy of a resent APPEND is usually *above* the high-water
    mark (its answer was lost before the mark passed it), and a restarted leader recovers a
    mark from its checkpoint (or none), so a resend check reading only committed records
    missed it and stored the publish again (chaos seed 4242: ``dups_in_log=15``, a leader
    killed 0.3 s after storing). Node 2 frozen keeps the mark still (min_insync_replicas = 3);
    node 1, the leader, stores node 0's publishes and is killed -9; its next process must
    answer the resends from its log's uncommitted tail."""
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={"cluster": {
        "append_timeout": 600.0, "min_insync_replicas": 3, "replica_lag_time_max": 1.0}})
    frozen: list[int] = []
    try:
        cluster.start()
        n0, n1, _n2 = cluster.nodes
        device = unique("idemraft")
        topic = f"devices/{device}/t"
        first = raw(n1, version=5)
        first.connect(unique("placer"))
        first.send(R.publish(topic, b"ok0", qos=1, packet_id=1, version=5))
        assert first.expect(R.PUBACK, timeout=30).reason_code == 0  # led by node 1
        pub = raw(n0, version=5)
        pub.connect(unique("idempub"), properties=ACK_OFFSETS)
        frozen = cluster.node_pids(2)
        signal_all(frozen, signal.SIGSTOP)
        wait_for(lambda: "n2/0" not in ((cluster.status(1, device).get("owner") or {})
                                        .get("isr") or ["n2/0"]), 30,
                 message="node 2 out of the ISR: the mark stays below what comes next")
        sent = [f"m{i}".encode() for i in range(N)]
        for i, payload in enumerate(sent):
            pub.send(R.publish(topic, payload, qos=1, packet_id=10 + i, version=5))
        wait_for(lambda: cluster.link(1, 0)["msgs_in"] >= N, 30,
                 message="node 1 received the APPENDs")
        time.sleep(1.0)  # and fsynced them (its group commit: milliseconds)
        owner = cluster.router_pid(1)
        os.kill(owner, signal.SIGKILL)
        cluster.wait_router_restarted(1, owner, timeout=60)
        signal_all(frozen, signal.SIGCONT)
        frozen = []
        acks = {}
        while len(acks) < N:
            p = pub.expect(R.PUBACK, timeout=90)
            acks[p.packet_id] = p
        assert {pid: p.reason_code for pid, p in acks.items()} == dict.fromkeys(
            range(10, 10 + N), 0)
        log: list = []

        def read_all() -> bool:
            try:
                log[:] = fetch_all(n1, device)  # the leader's (a router just restarted
            except AssertionError:  # may answer "unknown device" until its feed is in)
                return False
            return len(log) >= N + 1
        wait_for(read_all, 30, message="the leader serves the log's records")
        stored = [bytes(r.payload) for r in log]
        twice = {m.decode(): n for m, n in Counter(stored).items() if n > 1}
        assert not twice, f"resent after the leader's restart and stored again: {twice}"
        assert stored == [b"ok0", *sent], stored
    finally:
        signal_all(frozen, signal.SIGCONT)
        cluster.stop()
