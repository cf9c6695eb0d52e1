"""A replica whose log ends below its leader's log start can still follow (issue 24's "offsets
are never reused" with retention on), on a real 3-node Raft cluster, RF 3, acks=all:

byte retention moves the leader's log start past 0 while a QoS 1 publisher writes; then a
follower's node comes back with its data directory gone (a replaced disk: the same case as a
new replica a reassignment adds). It fetches from its own end (0), below the leader's start:
before the fix the leader answered out-of-range forever, the replica never caught up, never
rejoined the ISR, and ``meshmq cluster status`` kept reporting the log under-replicated. Now
(cluster/fetcher.py, ``LogStore.reset_start``, Kafka's truncateFullyAndStartAt):

* the replica restarts its log empty at the leader's start, counts it
  (``meshmq_replica_log_start_resets_total``) and logs the WARNING; it catches up, rejoins the
  ISR, and ``meshmq cluster status`` exits 0;
* a failover to it (the other follower frozen out of the ISR, the leader killed) loses nothing
  acknowledged from its start on: the fetch API there returns every acked payload at its
  offset; a persistent session that held an offset retention then passed resumes there at
  the log start (WARNING "cursor fell behind retention"), never hangs; a replay from offset 0
  is refused with 0x83 naming the range, and with ``offset-reset=earliest`` it starts at the
  log start (as after local retention);
* its log on disk starts where the leader's did, past 0, with the leader's records.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import (
    RETENTION_CONFIG,
    Publisher,
    Subscriber,
    fetch_all,
    log_list,
    offsets_of,
)

from cluster import frames
from cluster.replication import unversioned_tail
from commitlog.settings import LogSettings
from commitlog.store import LogStore

pytestmark = pytest.mark.timeout(400)
N = 120  # records published: ~8 KB of one device, retention keeps ~2 KB


def _store_dir(cluster: Cluster, i: int) -> str:
    return str(cluster.nodes[i].workdir / "data" / "router-0" / "log")


def _owner(cluster: Cluster, i: int, device: str) -> dict:
    return cluster.status(i, device)["owner"]


def _cli(node, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshmq", "cluster", *args, "--admin",
                           f"127.0.0.1:{node.admin_port}"], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def _publish(node, device: str, payloads: list[bytes]) -> None:
    pub = Publisher(node.host, node.port, unique("pub"), window=16, timeout=60)
    try:
        acks = pub.publish_all([(f"devices/{device}/t", p) for p in payloads], timeout=60)
        assert all(a.reason_code == 0 for a in acks), [a.reason_code for a in acks]
    finally:
        pub.close()


def test_a_wiped_follower_below_the_leaders_log_start_catches_up_and_can_lead(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={
        "cluster": {"append_timeout": 5.0, "replica_lag_time_max": 1.0,
                    "leader_affinity_stable": 0.0},
        "commitlog": dict(RETENTION_CONFIG)})
    n0, n1, n2 = cluster.nodes
    frozen: list[int] = []
    subs: list[Subscriber] = []
    try:
        cluster.start()
        device = unique("lstart")
        payloads = [f"{device}-{i:05d}-".encode() + b"x" * 40 for i in range(2 * N)]
        _publish(n0, device, payloads[:N])
        owner = _owner(cluster, 0, device)
        assert owner["router"] == "n0/0" and len(owner["replicas"]) == 3, owner
        wait_for(lambda: log_list(n0).get(device, (0, 0))[0] > 0, 60,
                 message="retention moved the leader's log start past 0")

        # n2 comes back with an empty disk: its log ends (at 0) below the leader's start
        n2.stop()
        wait_for(lambda: sorted(_owner(cluster, 0, device)["isr"]) == ["n0/0", "n1/0"], 60,
                 message="n2 shrunk out of the ISR while it is down")
        shutil.rmtree(_store_dir(cluster, 2))
        n2.start()
        cluster.wait_links_up()
        wait_for(lambda: len(_owner(cluster, 0, device)["isr"]) == 3
                 and log_list(n2).get(device, (0, 0))[1] == N, 120,
                 message="n2 caught up from the leader's log start and rejoined the ISR "
                         "(it fetches from 0, below the leader's start)")
        assert n2.metric("meshmq_replica_log_start_resets_total") >= 1
        assert "ends below its leader's log start" in n2.log_since(0)
        status = _cli(n0, "status")
        assert status.returncode == 0, (status.returncode, status.stdout, status.stderr)

        # a persistent session at n2 replays a few from the start and goes away, holding
        # an offset that retention then passes (more publishes)
        held_id = unique("held")
        p = Subscriber(n2.host, n2.port, held_id, session_expiry=600)
        subs.append(p)
        assert p.subscribe(f"devices/{device}/#", 1, offset="earliest").reason_codes == [1]
        held = offsets_of(p.collect(3, timeout=60), device)[:3]
        assert held == list(range(held[0], held[0] + 3)) and held[0] > 0, held
        p.close()
        _publish(n0, device, payloads[N:])
        wait_for(lambda: log_list(n0)[device][0] > held[-1] + 1
                 and log_list(n2).get(device, (0, 0))[1] == 2 * N, 60,
                 message="the leader's start past the held offset, n2 caught up")

        # failover to n2: n1 frozen out of the ISR, then the leader killed
        frozen.append(cluster.router_pid(1))
        os.kill(frozen[0], signal.SIGSTOP)
        wait_for(lambda: sorted(_owner(cluster, 0, device)["isr"]) == ["n0/0", "n2/0"], 60,
                 message="n1 shrunk out of the ISR")
        router = cluster.router_pid(0)
        n0.kill()
        try:
            os.kill(router, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_for(lambda: _owner(cluster, 2, device)["router"] == "n2/0", 90,
                 message="n2 (the only live ISR member) elected leader")
        wait_for(lambda: log_list(n2).get(device, (0, 0))[1] == 2 * N, 60,
                 message=f"n2's log visible up to {2 * N}")
        wait_for(lambda: log_list(n2)[device][0] > held[-1] + 1, 60,
                 message="n2's own retention moved its start past the held offset")
        start2, end2 = log_list(n2)[device]
        assert end2 == 2 * N, (start2, end2, held)
        recs = fetch_all(n2, device)
        assert [(r.offset, bytes(r.payload)) for r in recs] == [
            (o, payloads[o]) for o in range(start2, 2 * N)], "acked records lost at n2"

        # the held offset is below n2's start now: the session resumes at the start
        mark = len(n2.log_since(0))
        p = Subscriber(n2.host, n2.port, held_id, session_expiry=600)
        subs.append(p)
        assert p.session_present
        got = offsets_of(p.collect(2 * N - start2, timeout=60), device)
        assert got == list(range(start2, 2 * N)), got
        assert "cursor fell behind retention" in n2.log_since(mark)

        s = Subscriber(n2.host, n2.port, unique("replay"))
        subs.append(s)
        ack = s.subscribe(f"devices/{device}/#", 1, offset="0")
        assert ack.reason_codes == [0x83], f"offset 0 below start {start2}: {ack!r}"
        s = Subscriber(n2.host, n2.port, unique("replay"))
        subs.append(s)
        assert s.subscribe(f"devices/{device}/#", 1, offset="0",
                           reset="earliest").reason_codes == [1]
        msgs = s.collect(2 * N - start2, timeout=60)
        assert offsets_of(msgs, device) == list(range(start2, 2 * N))
        assert [bytes(m.payload) for m in msgs] == payloads[start2:]
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for s in subs:
            s.close()
        cluster.stop()
    with LogStore.open(_store_dir(cluster, 2)) as store:
        start = store.log_range(device)[0]
        assert 0 < start and store.durable_end(device) == 2 * N, (
            start, store.durable_end(device))
        got = [(r.offset, bytes(r.payload))
               for r in store.read_durable(device, start, 1 << 20, 1 << 30)]
        assert got == [(o, payloads[o]) for o in range(start, 2 * N)]


def test_a_follower_down_while_retention_passed_its_end_rejoins(tmp_path: Path) -> None:
    """Not wiped, only old: n2 holds [0, 20) with the leader's epoch when it stops; the leader
    takes 120 more and its start passes 20. Back, n2 fetches at 20 with its last epoch (no
    divergence: the leader's epoch goes on past 20), is refused out of range, restarts its
    log at the leader's start (its old records and epoch table dropped, the epoch the start
    falls in given back by the leader) and rejoins; on disk it then matches the leader from
    its start."""
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={
        "cluster": {"append_timeout": 5.0, "replica_lag_time_max": 1.0,
                    "leader_affinity_stable": 0.0},
        "commitlog": dict(RETENTION_CONFIG)})
    n0, _n1, n2 = cluster.nodes
    first = 20
    try:
        cluster.start()
        device = unique("old")
        payloads = [f"{device}-{i:05d}-".encode() + b"x" * 40 for i in range(first + N)]
        _publish(n0, device, payloads[:first])
        wait_for(lambda: log_list(n2).get(device, (0, 0))[1] == first, 60,
                 message=f"n2 holds the first {first}")
        n2.stop()
        _publish(n0, device, payloads[first:])
        wait_for(lambda: log_list(n0).get(device, (0, 0))[0] > first, 60,
                 message=f"retention moved the leader's start past n2's end {first}")
        n2.start()
        cluster.wait_links_up()
        wait_for(lambda: len(_owner(cluster, 0, device)["isr"]) == 3
                 and log_list(n2).get(device, (0, 0))[1] == first + N, 120,
                 message="n2 caught up from the leader's log start and rejoined the ISR "
                         f"(it fetches from {first}, below the leader's start)")
        assert n2.metric("meshmq_replica_log_start_resets_total") >= 1
    finally:
        cluster.stop()
    stores = [LogStore.open(_store_dir(cluster, i)) for i in (0, 2)]
    try:
        leader, follower = stores
        start = follower.log_range(device)[0]
        assert first < start and follower.durable_end(device) == first + N
        got = [(r.offset, bytes(r.payload))
               for r in follower.read_durable(device, start, 1 << 20, 1 << 30)]
        assert got == [(o, payloads[o]) for o in range(start, first + N)]
        assert follower.epochs(device)[-1][0] == leader.epochs(device)[-1][0]
    finally:
        for st in stores:
            st.close()


def _second_replica(device: str) -> str:
    """The node ``replicas_for`` (cluster/raftplace.py) gives a log led on n0 at RF 2 in a
    three-node cluster (as tests/cluster/test_rebalance.py computes it)."""
    import hashlib

    return max(("n1", "n2"), key=lambda n: hashlib.blake2b(
        n.encode() + b"\0" + device.encode(), digest_size=8).digest())


def test_a_replica_rebalance_adds_below_the_leaders_start_completes_the_move(
        tmp_path: Path) -> None:
    """RF 2 over three nodes, two logs led on n0 with their other replica on n1, byte
    retention past 0 on both; ``meshmq cluster rebalance`` moves one replica onto n2, whose
    new replica fetches from 0, below the leader's start. The move must complete (the CLI
    exits 0, ``cluster status`` exits 0) and n2's copy start at the leader's start with its
    records (before: the move stayed "copying" until the CLI's timeout)."""
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={
        "cluster": {"replication_factor": 2, "leader_affinity_stable": 0.0},
        "commitlog": dict(RETENTION_CONFIG)})
    n0, n1, n2 = cluster.nodes
    try:
        cluster.start()
        base = unique("rbs")
        devices = [d for d in (f"{base}x{k}" for k in range(200))
                   if _second_replica(d) == "n1"][:2]
        payloads = {d: [f"{d}|{i:05d}|".encode() + b"x" * 40 for i in range(N)]
                    for d in devices}
        pub = Publisher(n0.host, n0.port, unique("seed"), window=16, timeout=60)
        try:
            for device in devices:
                acks = pub.publish_all([(f"devices/{device}/t", p) for p in payloads[device]],
                                       timeout=60)
                assert all(a.reason_code == 0 for a in acks)
        finally:
            pub.close()
        for device in devices:
            wait_for(lambda d=device: cluster.status(0, d)["owner"]["replicas"]
                     == ["n0/0", "n1/0"], 30, message=f"{device} on n0 and n1")
            wait_for(lambda d=device: log_list(n0).get(d, (0, 0))[0] > 0, 60,
                     message=f"retention moved the start of {device} past 0 on n0")
        run = _cli(n0, "rebalance", "--timeout", "90", timeout=200)
        print(run.stdout, run.stderr)
        assert run.returncode == 0, run.stdout + run.stderr
        moved = [d for d in devices if "n2/0" in cluster.status(0, d)["owner"]["replicas"]]
        assert len(moved) == 1, [cluster.status(0, d)["owner"] for d in devices]
        assert n2.metric("meshmq_replica_log_start_resets_total") >= 1
        status = _cli(n0, "status")
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        cluster.stop()
    with LogStore.open(_store_dir(cluster, 2)) as store:
        device = moved[0]
        start = store.log_range(device)[0]
        assert 0 < start and store.durable_end(device) == N, (start, store.durable_end(device))
        got = [bytes(r.payload) for r in store.read_durable(device, start, 1 << 20, 1 << 30)]
        assert got == payloads[device][start:]


def test_a_fetch_at_the_leaders_start_with_no_epoch_is_not_diverging(tmp_path: Path) -> None:
    """The leader side (``unversioned_tail``): a follower that restarted its log at the
    leader's start fetches there with no epoch yet. "Records past the leader's first epoch
    start" must not count the offsets below the log start, or a leader whose epoch record
    retention took (a rebuilt index: the table is empty) answers "diverging at 0" forever and
    the follower, which cannot truncate below its start, fetches the same offset again."""
    with LogStore.open(str(tmp_path / "leader"), LogSettings(index_interval_bytes=64)) as st:
        for off in range(40):
            st.append("d", 1_000 + off, "t/d", 1, None, b"p%d" % off)
        st.flush_sync_commit()
        st.advance_start("d", 30)
        start = st.log_range("d")[0]
        assert start == 30 and st.epochs("d") == []

        def fetch(offset: int) -> frames.Fetch:
            return frames.Fetch(1, "d", offset, 100, "n2/0", -1)

        assert unversioned_tail(st, fetch(start)) is None
        div = unversioned_tail(st, fetch(35))  # records of no epoch past the start: cut
        assert div is not None and div.end_offset == start
