"""Review of Raft placement (cluster/raftplace.py) under faults, on real nodes.

A new device's first publishes wait for Raft to place its log. Here the placement's proposal
meets the worst moment: the Raft majority is frozen (two voters SIGSTOPped) so the proposal cannot
commit, and the proposing node's own metadata process is killed (-9) while the publishes are held;
its node restarts it. The outcome of the first proposal is unknown to the router: it must retry
the same compare-and-set (never take the lost proposal as applied, never place the log twice),
and once the voters resume, the held publishes (QoS 1 and QoS 2) are stored once, in order, and
answered once: PUBACK/PUBREC with offsets 0 and 1, nothing refused, nothing acked before.

Fencing (cluster/fencing.py) across an owner's restart: APPENDs forwarded to a Raft-placed log's
leader, in flight when that router is frozen and killed (-9), are resent by the publisher's
router to the restarted leader. They name the epoch the log was placed at, which the restarted
router leads again once its placement is fed: they must be stored (in order, once) and acked,
never fenced as stale (a false refusal) nor refused because the restarted router had not heard
its placement yet.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import fetch_all

pytestmark = pytest.mark.timeout(300)
ACK_OFFSETS = {R.USER_PROPERTY: [("ack-offsets", "true")]}


def _offset(ack: R.Packet) -> int:
    return int(dict(ack.properties.get(R.USER_PROPERTY, []))["offset"])


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # a long append_timeout: the held publishes must outlive a metadata process restart and
    # a Raft election, so that their refusal would be a defect, not the timeout
    cluster = Cluster(tmp_path_factory.mktemp("r4raft"), n=3, raft=True,
                      overrides={"cluster": {"append_timeout": 60.0}})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _meta_pid(cluster: Cluster, i: int) -> int | None:
    try:
        return cluster.status(i)["metadata"]["pid"]
    except Exception:  # noqa: BLE001 - the node admin busy or the process restarting
        return None


def test_held_publishes_survive_their_metadata_process_killed_mid_proposal(
        trio: Cluster, raw) -> None:
    pub = raw(trio.nodes[0], version=5)
    pub.connect(unique("r4pub"), properties=ACK_OFFSETS)
    device = unique("r4meta")
    topic = f"devices/{device}/t"
    voters = [_meta_pid(trio, i) for i in (1, 2)]
    assert all(voters), voters
    mine = _meta_pid(trio, 0)
    assert mine, "n0's metadata process pid"
    for pid in voters:
        os.kill(pid, signal.SIGSTOP)
    try:
        pub.send(R.publish(topic, b"a", qos=1, packet_id=1, version=5))
        pub.send(R.publish(topic, b"b", qos=2, packet_id=2, version=5))
        pub.expect_none(1.0)  # held: no majority, nothing may be answered
        os.kill(mine, signal.SIGKILL)
        wait_for(lambda: _meta_pid(trio, 0) not in (None, mine), 60,
                 message="n0's node to restart its metadata process")
        pub.expect_none(1.0)  # still held: the voters are frozen
    finally:
        for pid in voters:
            os.kill(pid, signal.SIGCONT)
    ack = pub.expect(R.PUBACK, timeout=90)
    assert ack.packet_id == 1 and ack.reason_code == 0, (
        f"the held QoS 1 publish must be stored and acked once Raft placed its log, "
        f"got {ack!r}")
    assert _offset(ack) == 0, ack
    rec = pub.expect(R.PUBREC, timeout=60)
    assert rec.packet_id == 2 and rec.reason_code == 0 and _offset(rec) == 1, rec
    pub.send(R.pubrel(2))
    assert pub.expect(R.PUBCOMP, timeout=30).packet_id == 2
    pub.expect_none(1.0)  # answered once each
    wait_for(lambda: trio.status(1, device)["owner"]["router"] == "n0/0", 30,
             message="n1 names n0/0, the publisher's router, as the leader")
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[0], device)] == [b"a", b"b"]


def test_appends_in_flight_across_a_raft_leader_restart_are_stored_not_fenced(
        trio: Cluster, raw) -> None:
    device = unique("r4fence")
    topic = f"devices/{device}/t"
    first = raw(trio.nodes[1], version=5)
    first.connect(unique("r4own"), properties=ACK_OFFSETS)
    first.send(R.publish(topic, b"p0", qos=1, packet_id=1, version=5))
    ack = first.expect(R.PUBACK, timeout=60)
    assert ack.reason_code == 0 and _offset(ack) == 0, ack
    wait_for(lambda: trio.status(0, device)["owner"]["router"] == "n1/0", 30,
             message="n0 names n1/0 as the leader")

    pub = raw(trio.nodes[0], version=5)
    pub.connect(unique("r4fwd"), properties=ACK_OFFSETS)
    owner = trio.router_pid(1)
    os.kill(owner, signal.SIGSTOP)
    try:
        for k in range(1, 6):
            pub.send(R.publish(topic, f"p{k}".encode(), qos=1, packet_id=k, version=5))
        pub.expect_none(1.0)  # the leader is frozen: nothing can be acked
    finally:
        os.kill(owner, signal.SIGKILL)
        os.kill(owner, signal.SIGCONT)
    trio.wait_router_restarted(1, owner)
    acks = [pub.expect(R.PUBACK, timeout=60) for _ in range(5)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(k, 0) for k in range(1, 6)], (
        f"APPENDs in flight across the leader's restart must be stored and acked, in order; "
        f"got {acks!r}")
    assert [_offset(a) for a in acks] == [1, 2, 3, 4, 5], acks
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[1], device)] == [
        f"p{k}".encode() for k in range(6)]
    fenced = trio.nodes[1].metric("meshmq_link_appends_fenced_total", peer="n0/0") or 0
    assert not fenced, f"the restarted leader fenced {fenced} legitimate resends"


def test_a_placement_answered_after_its_qos2_publisher_reconnected_is_pubrecd_once(
        trio: Cluster, raw) -> None:
    """The placement's answer comes after the publisher lost its connection and resumed its
    session (its resend of the pending packet id meanwhile): one PUBREC, on the new connection,
    one record in the log."""
    device = unique("r4late")
    topic = f"devices/{device}/t"
    cid = unique("r4q2")
    resume = {R.SESSION_EXPIRY_INTERVAL: 300, R.USER_PROPERTY: [("ack-offsets", "true")]}
    pub = raw(trio.nodes[0], version=5)
    pub.connect(cid, properties=resume)
    voters = [_meta_pid(trio, i) for i in (1, 2)]
    assert all(voters), voters
    for pid in voters:
        os.kill(pid, signal.SIGSTOP)
    try:
        pub.send(R.publish(topic, b"q", qos=2, packet_id=5, version=5))
        pub.expect_none(1.0)  # held: no majority
        pub.abort()
        again = raw(trio.nodes[0], version=5)
        ack = again.connect(cid, clean=False, properties=resume)
        assert ack.session_present, ack
        again.send(R.publish(topic, b"q", qos=2, dup=True, packet_id=5, version=5))
        again.expect_none(1.0)  # the pending id: answered only once placed and stored
    finally:
        for pid in voters:
            os.kill(pid, signal.SIGCONT)
    rec = again.expect(R.PUBREC, timeout=90)
    assert rec.packet_id == 5 and rec.reason_code == 0, rec
    assert dict((rec.properties or {}).get(R.USER_PROPERTY, [])) == {
        "device": device, "offset": "0"}, (
        f"the resumed connection asked for ack-offsets: its PUBREC must say where the publish "
        f"is stored, got {rec!r}")
    again.send(R.pubrel(5))
    comp = again.expect(R.PUBCOMP, timeout=30)
    assert comp.packet_id == 5 and not comp.reason_code, comp
    again.expect_none(1.5)  # once
    assert [bytes(r.payload) for r in fetch_all(trio.nodes[0], device)] == [b"q"]
