"""Review 5: the merged replication (issue 24) attacked with faults on real 3-node clusters
(``placement = "raft"``, RF 3, acks=all, min_insync_replicas 2).

The promise under attack: a PUBACK means the message is on every in-sync replica; while a
majority of nodes survives no acknowledged message is lost, per-device order holds, and no
log has two leaders acknowledging in one epoch. Each test streams QoS 1 publishes with many in
flight (a windowed publisher: what a real client's ``max_inflight`` does), injects one fault,
then stops every node and reads every replica's store from disk (``tests/chaos/replicas.py``):

* every acknowledged message is in every final ISR replica's log exactly once, at the offset
  its PUBACK named, in publish order;
* every ISR replica is byte-identical to the leader (record frames hashed as stored).

Faults: kill -9 of the leader's node mid-stream (the publisher reconnects to another node and
resends what was unacknowledged with DUP=1, then the node returns with its disk); the leader's
whole node frozen (SIGSTOP) past the lease and the node timeout while the majority elects and
takes writes, then thawed; two nodes of three killed (no majority: nothing acknowledged,
refused with a reason); a follower restarted with its data directory deleted; the same
follower, still in the ISR, when the leader dies before it fetched anything (it must not be
elected: cluster/metastate.py takes it out of the ISR when it registers with an empty disk);
a follower with a flipped byte in an acknowledged record (it must repair it from the leader
before it can be elected: cluster/fetcher.py; after a clean stop it reads its log end to end
before its first fetch to find it: cluster/logverify.py); a
follower whose disk (a tmpfs) is full while the leader acks.

Run: ``PYTHONPATH=$PWD python -m pytest -s tests/cluster/test_review5_replication_faults.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import raw as R
from helpers.broker import wait_for
from helpers.clients import unique
from helpers.cluster import Cluster
from helpers.devicelog import flip_record

from tests.chaos.replicas import dump_store

pytestmark = pytest.mark.timeout(400)
BASE = 1_000_000
OVERRIDES = {"cluster": {"append_timeout": 3.0, "replica_lag_time_max": 1.0}}


def _cluster(base: Path) -> Cluster:
    return Cluster(base, n=3, raft=True, overrides=OVERRIDES)


def _store_dir(cluster: Cluster, i: int) -> str:
    return str(cluster.nodes[i].workdir / "data" / "router-0" / "log")


def _owner(cluster: Cluster, i: int, device: str) -> dict:
    return cluster.status(i, device)["owner"]


def _node_pids(cluster: Cluster, i: int) -> list[int]:
    """Every process of node i: its supervisor, its routers and its metadata process."""
    status = cluster.status(i)
    pids = [r["pid"] for r in status["routers"] if r.get("pid")]
    pids.append(status["metadata"]["pid"])
    return [cluster.nodes[i].pid, *pids]


def _kill_node(cluster: Cluster, i: int, pids: list[int] | None = None) -> None:
    """kill -9 of every process of node i at once (the supervisor first: no restarts)."""
    for pid in pids or _node_pids(cluster, i):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.nodes[i].kill()  # reaps the supervisor


class Stream:
    """A QoS 1 publisher of one device with up to ``window`` publishes in flight, payloads
    ``"<seq>"``. A connection lost (node killed, DISCONNECT 0x9C) leaves its in-flight
    publishes' outcome unknown: ``reconnect`` resends them with DUP=1 and the same packet ids,
    in order, before anything new (a persistent session: ``clean_start = false``, so the
    publisher dedupe may match the first copies). A publish answered with an error code is
    given up (not acknowledged; it may still be stored: at least once)."""

    def __init__(self, raw: Any, cluster: Cluster, device: str, window: int = 64,
                 seq_base: int = 0) -> None:
        self.raw = raw
        self.cluster = cluster
        self.device = device
        self.window = window
        self.cid = unique("stream")
        self.client: R.RawClient | None = None
        self.next_seq = seq_base  # a second publisher of the device numbers from 1e6 on
        self.inflight: dict[int, int] = {}  # packet id -> seq, in send order
        self.acked: dict[int, int] = {}  # seq -> offset its PUBACK named
        self.refused: dict[int, tuple[int, str]] = {}  # seq -> (reason code, reason string)
        self.disconnects: list[R.Packet] = []
        self.node = -1

    def _send(self, seq: int, pid: int, dup: bool) -> bool:
        assert self.client is not None
        return self.client.try_send(R.publish(f"devices/{self.device}/t", str(seq).encode(),
                                              qos=1, packet_id=pid, dup=dup, version=5))

    def connect(self, node: int, timeout: float = 60) -> bool:
        """(Re)connect at ``node``; True once the CONNACK accepted, and the in-flight
        publishes resent with DUP=1."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.client is not None:
                self.client.close()
            try:
                client = self.raw(self.cluster.nodes[node], version=5)
                ack = client.connect(self.cid, clean=False, expect_rc=None, properties={
                    R.SESSION_EXPIRY_INTERVAL: 3600,
                    R.USER_PROPERTY: [("ack-offsets", "true")]})
            except (OSError, AssertionError):
                time.sleep(0.2)
                continue
            self.client = client
            if ack.reason_code != 0:
                time.sleep(0.2)
                continue
            self.node = node
            for pid, seq in list(self.inflight.items()):
                if not self._send(seq, pid, dup=True):
                    break
            return True
        return False

    def pump(self, seconds: float, new: bool = True, until_acked: int | None = None) -> bool:
        """Keep ``window`` publishes in flight for ``seconds`` (new ones only when ``new``);
        False when the connection closed (it is then left closed)."""
        assert self.client is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until_acked is not None and len(self.acked) >= until_acked:
                return True
            while new and len(self.inflight) < self.window:
                seq = self.next_seq
                pid = seq % 60000 + 1
                self.next_seq += 1
                self.inflight[pid] = seq
                if not self._send(seq, pid, dup=False):
                    return False
            try:
                pkt = self.client.recv(timeout=0.2)
            except TimeoutError:
                continue
            except ConnectionError:
                return False
            if pkt.type == R.DISCONNECT:
                self.disconnects.append(pkt)
                continue
            if pkt.type != R.PUBACK or pkt.packet_id not in self.inflight:
                continue
            seq = self.inflight.pop(pkt.packet_id)
            if pkt.reason_code == 0:
                props = dict(pkt.properties.get(R.USER_PROPERTY, []))
                self.acked[seq] = int(props["offset"])
            else:
                self.refused[seq] = (pkt.reason_code,
                                     pkt.properties.get(R.REASON_STRING, ""))
        return True

    def drain(self, seconds: float = 60) -> None:
        """Wait for the answers to what is in flight (nothing new sent)."""
        deadline = time.monotonic() + seconds
        while self.inflight and time.monotonic() < deadline:
            if not self.pump(0.5, new=False):
                self.connect(1 + (self.node % 2))


def _dumps(cluster: Cluster, device: str) -> dict[str, dict[str, Any]]:
    """Each router's replica of ``device`` as stored (the nodes stopped)."""
    out: dict[str, dict[str, Any]] = {}
    for i in range(len(cluster.nodes)):
        log = dump_store(_store_dir(cluster, i)).get(device)
        if log is not None:
            out[f"n{i}/0"] = log
    return out


def _check(dumps: dict[str, dict[str, Any]], isr: list[str], leader: str,
           acked: dict[int, int]) -> None:
    """Every acknowledged seq in every ISR replica exactly once, at its acked offset, in
    publish order; every ISR replica byte-identical to the leader."""
    assert acked, "nothing was acknowledged: the test saw no stream"
    lead = dumps.get(leader)
    assert lead is not None, f"the leader {leader} holds no log"
    for rid in isr:
        log = dumps.get(rid)
        assert log is not None, f"ISR member {rid} holds no log of the device"
        where: dict[int, list[int]] = {}
        order: list[int] = []
        for off, payload, _digest in log["records"]:
            if payload.isdigit():
                where.setdefault(int(payload), []).append(int(off))
                order.append(int(payload))
        missing = sorted(s for s in acked if s not in where)
        twice = {s: where[s] for s in acked if len(where.get(s, [])) > 1}
        moved = {s: (off, where[s]) for s, off in acked.items()
                 if s in where and off not in where[s]}
        assert not missing, f"{rid}: acknowledged messages missing: {missing[:20]} " \
                            f"({len(missing)} of {len(acked)})"
        assert not twice, f"{rid}: acknowledged messages stored twice: {list(twice.items())[:10]}"
        assert not moved, f"{rid}: acknowledged messages not at their acked offset: " \
                          f"{list(moved.items())[:10]}"
        for base in {s // BASE for s in acked}:  # each publisher's order
            firsts = [s for s in order if s in acked and s // BASE == base]
            assert firsts == sorted(firsts), \
                f"{rid}: acknowledged messages of publisher {base} out of publish order"
        assert log["records"] == lead["records"], (
            f"{rid} is not byte-identical to the leader {leader}: ends "
            f"{log['durable_end']} / {lead['durable_end']}, first difference at "
            f"{next((a, b) for a, b in zip(log['records'], lead['records'], strict=False) if a != b) if any(a != b for a, b in zip(log['records'], lead['records'], strict=False)) else 'the tail'}")  # noqa: E501


def _final(cluster: Cluster, device: str, at: int, size: int = 3) -> tuple[str, list[str]]:
    """The log's leader and ISR, once ``size`` replicas are in the ISR."""
    wait_for(lambda: len(_owner(cluster, at, device)["isr"]) == size, 90,
             message=f"{size} replicas in the ISR")
    owner = _owner(cluster, at, device)
    return owner["router"], list(owner["isr"])


# -- the attacks --------------------------------------------------------------------------------
def test_kill9_of_the_leader_mid_stream_loses_and_doubles_nothing(tmp_path: Path, raw) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.start()
        device = unique("k9")
        stream = Stream(raw, cluster, device, window=100)
        assert stream.connect(0)  # the first publish at n0: n0 leads the log (affinity)
        assert stream.pump(60, until_acked=300), "the stream did not get going"
        assert _owner(cluster, 1, device)["router"] == "n0/0"
        _kill_node(cluster, 0)  # with ~100 publishes in flight
        unknown = len(stream.inflight)
        # a client backs off before it reconnects; by then n1 knows the new leader, so its
        # resends reach the log that may already hold their first copies (the dedupe's case)
        wait_for(lambda: _owner(cluster, 1, device)["router"] != "n0/0", 60,
                 message="a new leader elected")
        assert stream.connect(1), "no CONNACK at n1 after the kill"
        for _ in range(20):  # resends first, then new ones, until 300 more are acked
            if stream.pump(60, until_acked=len(stream.acked) + 300) and \
                    len(stream.acked) >= 600:
                break
            stream.connect(1 + (stream.node % 2))
        stream.drain()
        assert len(stream.acked) >= 600, (len(stream.acked), stream.refused)
        cluster.nodes[0].start()  # its disk kept: it rejoins as a follower
        leader, isr = _final(cluster, device, 1)
        hits = sum(cluster.nodes[i].metric("meshmq_publish_dedupe_total", result="hit")
                   for i in (1, 2))
        print(f"\n[review5] kill -9 mid-stream: {unknown} in flight, {hits} dedupe hits, "
              f"{len(stream.acked)} acked, {len(stream.refused)} refused, leader {leader}; "
              f"refusals {sorted(stream.refused.items())[:3]}")
    finally:
        cluster.stop()
    _check(_dumps(cluster, device), isr, leader, stream.acked)


def test_a_frozen_leader_node_never_acks_after_its_lease_and_ends_identical(
        tmp_path: Path, raw) -> None:
    """SIGSTOP of the leader's whole node (supervisor, router, metadata process) past
    leader_lease and node_timeout: the majority elects, a second publisher's writes go on
    there; SIGCONT: whatever the old leader appended but never committed is truncated, and
    whatever it acknowledged (before or after the thaw) is in every replica."""
    cluster = _cluster(tmp_path)
    try:
        cluster.start()
        device = unique("frz")
        old = Stream(raw, cluster, device, window=100)
        assert old.connect(0)
        assert old.pump(60, until_acked=200), "the stream did not get going"
        assert _owner(cluster, 1, device)["router"] == "n0/0"
        pids = _node_pids(cluster, 0)
        followers = [cluster.router_pid(1), cluster.router_pid(2)]
        # the follower routers paused for less than replica_lag_time_max (they stay in the
        # ISR) while n0 appends a window of publishes it cannot commit: n0's diverged tail
        for pid in followers:
            os.kill(pid, signal.SIGSTOP)
        try:
            old.pump(0.4, new=True)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            for pid in followers:
                os.kill(pid, signal.SIGCONT)
        try:
            frozen_acked = len(old.acked)
            wait_for(lambda: _owner(cluster, 1, device)["router"] != "n0/0", 60,
                     message="the majority elected a new leader")
            new = Stream(raw, cluster, device, window=100, seq_base=BASE)
            assert new.connect(1)
            assert new.pump(60, until_acked=300), (len(new.acked), new.refused)
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        thawed = len(old.acked)
        old.pump(3, new=False)  # what the thawed old leader answers its publisher
        after_thaw = len(old.acked) - thawed
        if old.inflight:
            old.connect(1)
            old.drain()
        new.pump(10, until_acked=len(new.acked) + 100)
        new.drain()
        leader, isr = _final(cluster, device, 1)
        truncated = cluster.nodes[0].metric("meshmq_replica_truncations_total")
        print(f"\n[review5] frozen leader node: {frozen_acked} acked before, "
              f"{thawed - frozen_acked} while frozen, {after_thaw} by the thawed node, "
              f"n0 truncations {truncated}, "
              f"refused {len(old.refused)}: {sorted(old.refused.items())[:2]}")
    finally:
        cluster.stop()
    _check(_dumps(cluster, device), isr, leader, {**old.acked, **new.acked})
    assert truncated >= 1, "n0 had no diverged tail to truncate: the attack did not happen"
    # its publishes cut by the truncation are refused naming the cause (a leadership change),
    # not as a failing disk: an operator paged for "disk full" on a failover looks elsewhere
    whys = {why for _, why in old.refused.values()}
    assert not [w for w in whys if "disk" in w], f"a truncation reported as a disk fault: {whys}"


def test_two_of_three_nodes_killed_nothing_acked_then_nothing_lost(tmp_path: Path,
                                                                  raw) -> None:
    """No majority: the leader's publishes are refused with a reason (DISCONNECT 0x9C or
    PUBACK 0x80), none acknowledged; after both nodes return every acked message is there."""
    cluster = _cluster(tmp_path)
    try:
        cluster.start()
        device = unique("min")
        stream = Stream(raw, cluster, device, window=50)
        assert stream.connect(0)
        assert stream.pump(60, until_acked=200)
        _kill_node(cluster, 1)
        _kill_node(cluster, 2)
        before = dict(stream.acked)
        killed_at_seq = stream.next_seq
        # the lone node: every publish sent from now on is refused, never acknowledged
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if not stream.pump(deadline - time.monotonic()):
                stream.connect(0, timeout=5)
        late = {s: o for s, o in stream.acked.items()
                if s not in before and s >= killed_at_seq}
        assert not late, (f"{len(late)} publishes sent after two of three nodes died were "
                          f"acked: {sorted(late.items())[:10]}")
        reasons = [p.properties.get(R.REASON_STRING, "") for p in stream.disconnects] + [
            why for _, why in stream.refused.values()]
        assert reasons and all(reasons), \
            f"refused without a reason: {stream.disconnects} {stream.refused}"
        cluster.nodes[1].start(wait=False)
        cluster.nodes[2].start(wait=False)
        cluster.nodes[1].wait_ready()
        cluster.nodes[2].wait_ready()
        cluster.wait_links_up(60)
        for _ in range(20):
            if stream.connect(0) and stream.pump(60, until_acked=len(before) + 100 + len(
                    [s for s in stream.acked if s not in before])):
                break
        stream.drain()
        leader, isr = _final(cluster, device, 0)
        print(f"\n[review5] two of three killed: {len(before)} acked before, "
              f"{len(stream.acked)} in all; refusals: {reasons[:2]}")
    finally:
        cluster.stop()
    _check(_dumps(cluster, device), isr, leader, stream.acked)


def test_a_follower_restarted_with_its_data_dir_deleted_catches_up_from_zero(
        tmp_path: Path, raw) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.start()
        device = unique("wipe")
        stream = Stream(raw, cluster, device, window=50)
        assert stream.connect(0)
        assert stream.pump(60, until_acked=300)
        cluster.nodes[2].stop()
        shutil.rmtree(cluster.nodes[2].config["node"]["data_dir"])
        assert stream.pump(60, until_acked=500)
        cluster.nodes[2].start()
        cluster.wait_links_up(60)
        assert stream.pump(60, until_acked=700)
        stream.drain()
        leader, isr = _final(cluster, device, 0)
    finally:
        cluster.stop()
    dumps = _dumps(cluster, device)
    assert dumps["n2/0"]["start"] == 0, dumps["n2/0"]["start"]
    _check(dumps, isr, leader, stream.acked)


def _registration(cluster: Cluster, i: int, router: str) -> dict | None:
    from meshmq.metadata_proc import metadata_socket
    from tests.chaos.replicas import raft_snapshot
    snap = raft_snapshot(metadata_socket(cluster.nodes[i].config["node"]["data_dir"]))
    return ((snap or {}).get("routers") or {}).get(router)


def test_a_follower_back_with_an_empty_disk_is_never_elected_before_it_caught_up(
        tmp_path: Path, raw) -> None:
    """A follower restarted with its data directory deleted is still in the ISR (the leader
    shrinks it only after replica_lag_time_max, here 30 s) with nothing in its log. The leader
    dies before it fetched anything: electing it would lose every acknowledged message (its
    log is empty; the other follower, told it diverged, would cut them too). Kafka removes a
    broker re-registering with a new incarnation from every ISR (KIP-903, KIP-966)."""
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={
        "cluster": {"append_timeout": 3.0, "replica_lag_time_max": 30.0}})
    n0: list[int] = []
    try:
        cluster.start()
        device = unique("empty")
        stream = Stream(raw, cluster, device, window=50)
        assert stream.connect(0)
        assert stream.pump(60, until_acked=300)
        stream.drain()
        rec = _owner(cluster, 0, device)
        assert rec["router"] == "n0/0" and len(rec["isr"]) == 3, rec
        # the follower the controller would pick first (replica order; no client on it)
        wiped = next(r for r in rec["replicas"] if r != "n0/0")
        w = int(wiped[1:].split("/")[0])
        other = 3 - w
        old_inc = (_registration(cluster, 0, wiped) or {}).get("incarnation")
        cluster.nodes[w].stop()
        shutil.rmtree(cluster.nodes[w].config["node"]["data_dir"])
        n0[:] = _node_pids(cluster, 0)
        os.kill(cluster.router_pid(0), signal.SIGSTOP)  # the leader serves no fetch now
        cluster.nodes[w].start()
        wait_for(lambda: (_registration(cluster, other, wiped) or {}).get("incarnation")
                 not in (None, old_inc), 60, message=f"{wiped} registered again, empty")
        _kill_node(cluster, 0, n0)
        wait_for(lambda: _owner(cluster, other, device)["router"] != "n0/0", 60,
                 message="a new leader elected")
        stream.connect(other)
        for _ in range(3):  # acks go on at the new leader once two replicas are in sync
            if stream.pump(20, until_acked=400) and len(stream.acked) >= 400:
                break
            stream.connect(other)
        stream.drain(20)
        leader, isr = _final(cluster, device, other, size=2)  # n0 stays dead
        print(f"\n[review5] empty follower {wiped}: new leader {leader}")
    finally:
        for pid in n0:  # a failure before the kill must not leave a frozen router behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        cluster.stop()
    _check(_dumps(cluster, device), isr, leader, stream.acked)


@pytest.mark.parametrize("stop", ["kill", "clean"])
def test_a_follower_with_a_flipped_byte_is_never_elected_with_the_hole(
        tmp_path: Path, raw, stop: str) -> None:
    """One payload bit of an acknowledged record flipped in a stopped follower's segment: it
    restarts (recovery quarantines the record when it scans, a clean start finds it on read),
    rejoins, and the leader dies. Whichever replica is elected must hold that record: a
    follower that kept a hole where its leader had the record must repair it from the leader
    or stay out of the ISR (Kafka takes a log dir with a corrupt record offline)."""
    # no checkpoint during the run: the kill -9 case's recovery scans the whole tail and finds
    # the record whenever it was written (a checkpoint past it makes it the clean case)
    cluster = Cluster(tmp_path, n=3, raft=True, overrides={
        **OVERRIDES, "commitlog": {"checkpoint_interval_s": 3600}})
    try:
        cluster.start()
        device = unique("flip")
        stream = Stream(raw, cluster, device, window=50)
        assert stream.connect(0)
        assert stream.pump(60, until_acked=300)
        stream.drain()
        rec = _owner(cluster, 0, device)
        bad = next(r for r in rec["replicas"] if r != "n0/0")  # the controller's first pick
        b = int(bad[1:].split("/")[0])
        if stop == "kill":
            _kill_node(cluster, b)
        else:
            cluster.nodes[b].stop()
        flip_record(_store_dir(cluster, b), device, 150)
        cluster.nodes[b].start()
        cluster.wait_links_up(60)
        # kill: recovery scanned the tail; clean: the follower read its log end to end before
        # its first fetch (cluster/logverify.py). Either way it cut its log and refetched
        wait_for(lambda: "lost to corruption" in cluster.nodes[b].log_text(), 60,
                 message=f"{bad} repaired the record from its leader")
        assert stream.pump(60, until_acked=400)
        stream.drain()
        _final(cluster, device, 0)
        _kill_node(cluster, 0)
        wait_for(lambda: _owner(cluster, b, device)["router"] != "n0/0", 60,
                 message="a new leader elected")
        assert stream.connect(b)
        for _ in range(3):
            if stream.pump(20, until_acked=500) and len(stream.acked) >= 500:
                break
            stream.connect(b)
        stream.drain(20)
        leader, isr = _final(cluster, device, b, size=2)
        # what readers get from the new leader (they skip quarantined gaps)
        from helpers.devicelog import fetch_all
        read = {int(bytes(r.payload)) for r in fetch_all(cluster.nodes[b], device)}
        unread = sorted(s for s in stream.acked if s not in read)
        assert not unread, f"acknowledged messages readers never get: {unread[:10]}"
        print(f"\n[review5] flipped byte on {bad} ({stop}): new leader {leader}, ISR {isr}")
    finally:
        cluster.stop()
    _check(_dumps(cluster, device), isr, leader, stream.acked)
    # repaired: no offset of it is reported lost any more (fetch API, restarts)
    from commitlog.quarantine import load_gaps
    gaps = load_gaps(_store_dir(cluster, b)).get(device)
    assert not gaps, f"{bad} still reports offsets {gaps} lost after refetching them"


def _fill(path: Path) -> None:
    """Take every byte left on the volume of ``path``."""
    import errno
    with open(path, "ab", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return


def test_a_follower_whose_disk_is_full_leaves_the_isr_and_catches_up_after(tmp_path: Path,
                                                                           raw) -> None:
    """n2's commit log on an 8 MiB tmpfs, filled while the leader acks: the follower's appends
    fail, the leader shrinks it out of the ISR and acks go on without it (min_insync 2); space
    freed, it catches up and rejoins, byte-identical."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    vol = tmp_path / "vol"
    vol.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(vol)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    cluster = Cluster(tmp_path, n=3, raft=True, overrides=OVERRIDES,
                      per_node={2: {"commitlog": {"dir": str(vol / "log")}}})
    try:
        cluster.start()
        device = unique("full")
        stream = Stream(raw, cluster, device, window=50)
        assert stream.connect(0)
        assert stream.pump(60, until_acked=200)
        filler = vol / "filler"
        filler.write_bytes(b"\0" * (1 << 20))
        _fill(vol / "topfill")
        assert stream.pump(60, until_acked=len(stream.acked) + 1500), stream.refused
        wait_for(lambda: "n2/0" not in _owner(cluster, 0, device)["isr"], 60,
                 message="the full follower shrunk out of the ISR")
        assert "No space left on device" in cluster.nodes[2].log_text(), "the fault missed"
        filler.unlink()
        (vol / "topfill").unlink()
        _final(cluster, device, 0)
        assert stream.pump(60, until_acked=len(stream.acked) + 100)
        stream.drain()
        leader, isr = _final(cluster, device, 0)
        print(f"\n[review5] full follower: {len(stream.acked)} acked, "
              f"{len(stream.refused)} refused: {sorted(stream.refused.items())[:2]}")
        dumps = {}
    finally:
        cluster.stop()
        for name in ("filler", "topfill"):  # space for the store's open (a failed run)
            (vol / name).unlink(missing_ok=True)
        try:
            dumps = _dumps(cluster, device)
            dumps["n2/0"] = dump_store(str(vol / "log" / "router-0")).get(device)
        finally:
            subprocess.run(["umount", "-l", str(vol)], check=False)
    _check(dumps, isr, leader, stream.acked)
