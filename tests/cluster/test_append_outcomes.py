"""An APPEND's outcome reaches the publisher's router exactly once, whatever the link does, and an
unknown outcome is never a success (issue 28, defects 1 and 5).

Node 0 publishes on a device log node 1 owns; node 0 dials node 1 through a TCP proxy that can
lose only what node 1 sends back (a one-way cut): node 1 hears every APPEND and stores it (or
fails to), its RESULTs and ACKs never arrive, the link goes silent, times out and reconnects.

* The owner's disk is full (the lazy FUSE layer answers ``write`` with ENOSPC, under a real
  router): the failed writes must be answered 0x80 after the reconnect, never 0x00 (the ACK and
  the handshake's resume point say "processed", and a failed append is processed too).
* The owner stored them: after the reconnect each gets 0x00 at its offset, and the log holds
  each once (the resent APPEND is answered from the owner's memory, not appended again).
* The owner frozen (SIGSTOP): after ``cluster.append_timeout`` a v5 publisher gets 0x80 with a
  reason string naming the owner router (QoS 1 and 2), a 3.1.1 publisher is disconnected, and
  ``meshmq_link_append_timeouts_total`` counts them; nothing is acknowledged as stored.

While outcomes are awaited, ``meshmq cluster status`` (its JSON) and the ``meshmq_link_*``
metrics show how many and the oldest's age.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all
from helpers.lazyfs import LazyFS
from helpers.tcpproxy import TcpProxy

from meshmq.clustercli import render_status

pytestmark = pytest.mark.timeout(240)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}
N = 5


def _one_way_cluster(tmp_path: Path, data_dir: Path | None) -> tuple[Cluster, TcpProxy]:
    # append_timeout far above the test's reconnect: what answers must be the owner's outcome
    per_node = {1: {"node": {"data_dir": str(data_dir)}}} if data_dir else None
    cluster = Cluster(tmp_path, n=2, overrides={"cluster": {"append_timeout": 600.0}},
                      per_node=per_node)
    proxy = TcpProxy(cluster.mesh_ports[1])
    cluster.dial_via(0, 1, proxy.port)  # n0/0 < n1/0: node 0 dials
    return cluster, proxy


@pytest.fixture
def full_owner(fuse_tools, tmp_path: Path) -> Iterator[tuple[Cluster, TcpProxy, LazyFS]]:
    fs = LazyFS(tmp_path / "disk", tmp_path / "n1data").mount()
    cluster, proxy = _one_way_cluster(tmp_path, tmp_path / "n1data")
    try:
        cluster.start()
        yield cluster, proxy, fs
    finally:
        try:
            fs.heal()
        except AssertionError:
            pass
        cluster.stop()
        proxy.close()
        fs.unmount()


@pytest.fixture
def one_way(tmp_path: Path) -> Iterator[tuple[Cluster, TcpProxy]]:
    cluster, proxy = _one_way_cluster(tmp_path, None)
    try:
        cluster.start()
        yield cluster, proxy
    finally:
        cluster.stop()
        proxy.close()


def _publish(c: R.RawClient, topic: str, payload: bytes, pid: int, qos: int = 1) -> None:
    c.send(R.publish(topic, payload, qos=qos, packet_id=pid, version=c.version))


def _lose_answers_until_reconnect(mesh: Cluster, proxy: TcpProxy, pub: R.RawClient,
                                  topic: str) -> None:
    """Publish N while node 1's answers are lost; see node 1 take them and node 0 wait for
    their outcomes (status and metrics); heal once the silent link was dropped."""
    link = mesh.link(0, 1)
    reconnects, heard = link["reconnects"], mesh.link(1, 0)["msgs_in"]
    proxy.blackhole(back_only=True)
    for i in range(N):
        _publish(pub, topic, f"m{i}".encode(), 10 + i)
    wait_for(lambda: mesh.link(1, 0)["msgs_in"] >= heard + N, 30,
             message="node 1 received the APPENDs")
    waiting = mesh.link(0, 1)
    assert waiting["awaiting_outcome"] == N, waiting
    assert waiting["oldest_awaiting_s"] > 0, waiting
    assert mesh.nodes[0].metric("meshmq_link_appends_awaiting", peer="n1/0") == N
    # node 0 hears nothing from node 1: cluster.link_timeout (3 s here) drops the link
    wait_for(lambda: mesh.link(0, 1)["reconnects"] > reconnects
             or mesh.link(0, 1)["state"] != "up", 30, message="the silent link dropped")
    proxy.heal()
    wait_for(lambda: mesh.link(0, 1)["state"] == "up", 30, message="the link up again")


def _acks(pub: R.RawClient) -> dict[int, R.Packet]:
    acks = {}
    while len(acks) < N:
        p = pub.expect(R.PUBACK, timeout=60)
        acks[p.packet_id] = p
    return acks


def test_failed_writes_whose_results_were_lost_are_refused_not_acked(
        full_owner: tuple[Cluster, TcpProxy, LazyFS], raw) -> None:
    mesh, proxy, fs = full_owner
    n0, n1 = mesh.nodes
    device = mesh.device_owned_by(1, unique("full"))
    topic = f"devices/{device}/t"
    pub = raw(n0, version=5)
    pub.connect(unique("fullpub"), properties=ACK_OFFSETS)
    _publish(pub, topic, b"ok0", 1)
    assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
    fs.fail("write", "ENOSPC")
    _lose_answers_until_reconnect(mesh, proxy, pub, topic)
    acks = _acks(pub)
    codes = {pid: p.reason_code for pid, p in acks.items()}
    assert all(code == 0x80 for code in codes.values()), (
        f"writes that failed at the owner were acknowledged: {codes}")
    for p in acks.values():
        why = p.properties.get(R.REASON_STRING, "")
        assert "n1/0" in why, f"the reason string does not name the owner: {p!r}"
    assert n1.metric("meshmq_link_outcomes_asked_total") >= N  # answered again, not appended
    fs.heal()
    # the owner's store probes the volume again (backoff up to 5 s): until then refused
    deadline = time.monotonic() + 60
    pid = 100
    while True:
        _publish(pub, topic, b"ok1", pid)
        ok = pub.expect(R.PUBACK, timeout=60)
        if ok.reason_code == 0 or time.monotonic() > deadline:
            break
        assert ok.reason_code == 0x80, ok
        pid += 1
        time.sleep(0.2)
    assert ok.reason_code == 0, ok
    assert [bytes(r.payload) for r in fetch_all(n1, device)] == [b"ok0", b"ok1"]


def test_stored_writes_whose_results_were_lost_are_acked_once_stored_once(
        one_way: tuple[Cluster, TcpProxy], raw) -> None:
    mesh, proxy = one_way
    n0, n1 = mesh.nodes
    device = mesh.device_owned_by(1, unique("lost"))
    topic = f"devices/{device}/t"
    pub = raw(n0, version=5)
    pub.connect(unique("lostpub"), properties=ACK_OFFSETS)
    healthy = [f"h{i}".encode() for i in range(200)]
    for batch in range(0, len(healthy), 50):  # under any Receive Maximum
        for i in range(batch, batch + 50):
            _publish(pub, topic, healthy[i], 100 + i)
        for _ in range(50):
            assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
    # a healthy link: every RESULT comes before the ACK covering it, nothing is asked again
    assert n1.metric("meshmq_link_outcomes_asked_total") == 0
    _lose_answers_until_reconnect(mesh, proxy, pub, topic)
    acks = _acks(pub)
    codes = {pid: p.reason_code for pid, p in acks.items()}
    assert all(code == 0 for code in codes.values()), (
        f"writes the owner stored were refused after the reconnect: {codes}")
    offsets = sorted(int(dict(p.properties.get(R.USER_PROPERTY, []))["offset"])
                     for p in acks.values())
    first = len(healthy)
    assert offsets == list(range(first, first + N)), offsets
    assert n1.metric("meshmq_link_outcomes_asked_total") >= N
    assert [bytes(r.payload) for r in fetch_all(n1, device)] == (
        healthy + [f"m{i}".encode() for i in range(N)])
    assert mesh.link(0, 1)["awaiting_outcome"] == 0


def test_a_frozen_owner_gets_its_publishers_refused_after_append_timeout(
        tmp_path: Path, raw) -> None:
    mesh = Cluster(tmp_path, n=2, overrides={"cluster": {"append_timeout": 1.0}}).start()
    try:
        n0, n1 = mesh.nodes
        device = mesh.device_owned_by(1, unique("frozen"))
        topic = f"devices/{device}/t"
        pub = raw(n0, version=5)
        pub.connect(unique("frozenpub"))
        _publish(pub, topic, b"before", 1)
        assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
        old = raw(n0, version=4)
        old.connect(unique("frozen311"))
        owner = mesh.router_pid(1)
        os.kill(owner, signal.SIGSTOP)
        try:
            _publish(pub, topic, b"q1", 2)
            ack = pub.expect(R.PUBACK, timeout=60)
            assert ack.reason_code == 0x80, f"a frozen owner's write was answered {ack!r}"
            why = ack.properties.get(R.REASON_STRING, "")
            assert "n1/0" in why and "append_timeout" in why, ack
            _publish(pub, topic, b"q2", 3, qos=2)
            rec = pub.expect(R.PUBREC, timeout=60)
            assert rec.reason_code == 0x80, rec
            _publish(old, topic, b"q1-311", 1)
            got = old.wait_closed(timeout=60)
            assert not [p for p in got if p.type == R.PUBACK], f"3.1.1 got an ack: {got}"
            assert n0.metric("meshmq_link_append_timeouts_total", peer="n1/0") >= 3
            # the operator's side: the refusal names the owner, not this router's disk
            wait_for(lambda: "message not stored: owner router n1/0" in n0.log_text(), 30,
                     message="the not-stored log line naming the owner")
            assert "append_timeout" in n0.log_text()
            assert mesh.link(0, 1)["awaiting_outcome"] == 0
        finally:
            os.kill(owner, signal.SIGCONT)
        # the owner back: publishes are acknowledged again (each the client was refused may
        # be stored too: a retry's duplicate is allowed, a false PUBACK is not)
        _publish(pub, topic, b"after", 4)
        assert pub.expect(R.PUBACK, timeout=60).reason_code == 0
        stored = [bytes(r.payload) for r in fetch_all(n1, device)]
        assert stored[0] == b"before" and stored[-1] == b"after", stored
    finally:
        mesh.stop()


def test_cluster_status_shows_appends_awaiting_an_outcome() -> None:
    """``meshmq cluster status``: per link, how many publishes wait for the peer's outcome and
    the oldest's age (what grows toward cluster.append_timeout while an owner is away)."""
    link = {"peer": "b/0", "state": "up", "since": 0, "rtt_ms": 0.4, "queued": 0,
            "window": 1024, "awaiting_outcome": 3, "oldest_awaiting_s": 2.54}
    doc = {"cluster": "c", "node": "a", "routers_per_node": 1, "router_ids": ["a/0", "b/0"],
           "routers": [{"router": "a/0", "pid": 42, "state": "up", "up_since": 0,
                        "mesh": {"router": "a/0", "links": [
                            link, {**link, "peer": "c/0", "awaiting_outcome": 0}]}}]}
    out = io.StringIO()
    render_status(doc, out, now=10.0)
    text = out.getvalue()
    assert "AWAITING (OLDEST)" in text, text
    assert re.search(r"a/0\s+b/0\s+up\s.*\s1024\s+3 \(2\.5s\)", text), text
    assert re.search(r"a/0\s+c/0\s+up\s.*\s1024\s+0\s*$", text, re.M), text


def test_a_publish_refused_before_it_ever_left_is_never_stored_later(
        tmp_path: Path, raw) -> None:
    """Node 1 (the owner) is killed: node 0 sees its link down, and a publish made then is
    refused at cluster.append_timeout without ever leaving node 0. When node 1 is back, that
    publish must not be stored after all (it was dropped from the link's queue): the log holds
    what was acknowledged, nothing the client was told is not stored."""
    mesh = Cluster(tmp_path, n=2, overrides={"cluster": {"append_timeout": 1.0}}).start()
    try:
        n0, n1 = mesh.nodes
        device = mesh.device_owned_by(1, unique("gone"))
        topic = f"devices/{device}/t"
        pub = raw(n0, version=5)
        pub.connect(unique("gonepub"))
        _publish(pub, topic, b"before", 1)
        assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
        router = mesh.router_pid(1)
        os.kill(router, signal.SIGKILL)
        n1.kill()  # and its supervisor: nothing restarts the router meanwhile
        wait_for(lambda: mesh.link(0, 1)["state"] != "up", 30, message="node 0 sees it down")
        _publish(pub, topic, b"refused", 2)
        ack = pub.expect(R.PUBACK, timeout=60)
        assert ack.reason_code == 0x80, ack
        why = ack.properties.get(R.REASON_STRING, "")
        assert "n1/0" in why and "never reached" in why, ack  # known not stored, not unknown
        assert n0.metric("meshmq_link_dropped_total", peer="n1/0", reason="expired") >= 1
        n1.start()
        mesh.wait_links_up(timeout=60)
        _publish(pub, topic, b"after", 3)
        assert pub.expect(R.PUBACK, timeout=60).reason_code == 0
        stored = [bytes(r.payload) for r in fetch_all(n1, device)]
        assert stored == [b"before", b"after"], (
            f"a publish refused as not stored was stored later: {stored}")
    finally:
        mesh.stop()


def test_stored_writes_whose_owner_was_killed_before_answering_are_acked_and_kept(
        one_way: tuple[Cluster, TcpProxy], raw) -> None:
    """The owner stored (fsynced) N publishes, its answers are lost, and it is killed -9 before
    the link noticed: its supervisor restarts it, a new incarnation that remembers nothing of
    this link. Node 0 sends the N again; each is acknowledged, and every acknowledged message
    is in the log (never acknowledged and missing; that it is there once, the restarted owner
    finding the resent APPENDs in its log, is tests/cluster/test_resend_idempotence.py)."""
    mesh, proxy = one_way
    n0, n1 = mesh.nodes
    device = mesh.device_owned_by(1, unique("kill"))
    topic = f"devices/{device}/t"
    pub = raw(n0, version=5)
    pub.connect(unique("killpub"))
    _publish(pub, topic, b"ok0", 1)
    assert pub.expect(R.PUBACK, timeout=30).reason_code == 0
    proxy.blackhole(back_only=True)
    for i in range(N):
        _publish(pub, topic, f"m{i}".encode(), 10 + i)
    wait_for(lambda: len(fetch_all(n1, device)) == N + 1, 30,
             message="node 1 stored the N publishes")
    owner = mesh.router_pid(1)
    os.kill(owner, signal.SIGKILL)
    wait_for(lambda: mesh.link(0, 1)["state"] != "up", 30, message="node 0 sees it down")
    proxy.heal()
    acks = _acks(pub)
    assert {pid: p.reason_code for pid, p in acks.items()} == dict.fromkeys(
        range(10, 10 + N), 0)

    mesh.wait_router_restarted(1, owner, timeout=60)
    stored = [bytes(r.payload) for r in fetch_all(n1, device)]
    missing = [m for m in [b"ok0"] + [f"m{i}".encode() for i in range(N)] if m not in stored]
    assert not missing, f"acknowledged and not in the log: {missing}; log: {stored}"
